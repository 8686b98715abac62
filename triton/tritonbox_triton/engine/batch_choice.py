"""A decode step's next tokens: `choose_token`'s choice for every row, the plain rows' in shared
operations.

Row by row, each choice is a handful of operations over the whole vocabulary (49,152 logits), and
for a batch those calls were most of a step's Python time: 16 greedy rows, or a sampled batch of
8 costing 1.13 times a greedy one (over the issue's 1.10) on an AMD EPYC. The plain rows, whose
logits nothing but min_tokens' ban of the end id changes (no penalty, bad word or grammar), share
them instead: the greedy ones one argmax (and one log-softmax, for the rows that asked for
log-probs), the sampled ones one division by their temperatures, one log-softmax and one search
for top-p's candidates. Each of those works along its row only, so every row's result is its
lone one's bit for bit (tested); a sampled row then decides top-p among its few candidates and
draws from its own seeded generator. The other rows go through `choose_token` one at a time.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch

from .sampling import SequenceState, TokenChoice, choose_token, end_banned, top_logprobs
from .truncation import Ids, candidate_mask, draw_index, kept_ids, top_p_alone


def _plain(state: SequenceState) -> bool:
    params = state.params
    return (
        state.guide is None
        and not state.words.has_bad_words
        and params.repetition_penalty == 1.0
        and not params.presence_penalty
        and not params.frequency_penalty
    )


def plain_greedy(state: SequenceState) -> bool:
    """Whether nothing but min_tokens' ban of the end id changes this sequence's logits before
    its argmax now: greedy, with no penalty, banned word, bad word or grammar in force."""
    return state.params.greedy and _plain(state)


def plain_sampled(state: SequenceState) -> bool:
    """`plain_greedy`'s rule for a sampled sequence: only its temperature, top-k and top-p."""
    return not state.params.greedy and _plain(state)


def _ban_ends(rows: torch.Tensor, states: Sequence[SequenceState]) -> None:
    """min_tokens' ban of each row's end id (as `choose_token` does), in one write: a
    benchmark's exact lengths ban every row's."""
    banned = [(row, state.params.end_id) for row, state in enumerate(states) if end_banned(state)]
    if banned:
        at_rows, end_ids = zip(*banned, strict=True)
        rows[torch.tensor(at_rows), torch.tensor(end_ids)] = float("-inf")


def _with_top(choice: TokenChoice, logprobs: torch.Tensor, state: SequenceState) -> TokenChoice:
    if state.params.num_top_logprobs > 0:
        choice.top_ids, choice.top_logprobs = top_logprobs(logprobs, state.params.num_top_logprobs)
    return choice


def _wants_logprobs(state: SequenceState) -> bool:
    params = state.params
    return params.return_log_probs or params.num_top_logprobs > 0


def _greedy(rows: torch.Tensor, states: Sequence[SequenceState]) -> list[TokenChoice]:
    # max's indices are argmax's (the first of equal maxima, NaN as the largest) at a third of
    # its time on CPU: 16 rows of 49,152, 200 against 554 µs.
    tokens = rows.max(dim=-1).indices
    choices = [TokenChoice(token=token, logprob=0.0) for token in tokens.tolist()]
    # Only rows that asked for log-probs pay a log-softmax (a 262k vocabulary's is ~8% of a
    # step); the others' log-prob is 0, as TensorRT-LLM's when return_log_probs is off.
    scored = [row for row, state in enumerate(states) if _wants_logprobs(state)]
    if scored:
        part = rows if len(scored) == len(states) else rows[torch.tensor(scored)]
        logprobs = torch.log_softmax(part, dim=-1)
        chosen = logprobs.gather(1, tokens[scored][:, None])[:, 0].tolist()
        for at, row in enumerate(scored):
            choices[row].logprob = chosen[at]
            _with_top(choices[row], logprobs[at], states[row])
    return choices


def _sampled(rows: torch.Tensor, states: Sequence[SequenceState]) -> list[TokenChoice]:
    temperatures = torch.tensor([[state.params.temperature] for state in states])
    scaled = rows / temperatures.to(rows.dtype)  # as choose_token's division, row by row
    logprobs = torch.log_softmax(scaled, dim=-1)
    vocab = rows.shape[-1]
    candidates: list[Ids | None] = [None] * len(states)
    if any(top_p_alone(s.params.top_k, s.params.top_p, vocab) for s in states):
        # top-p's candidates (truncation.py) of every row in one pass, split by row (numpy's
        # search of a flat mask takes a third of torch's nonzero time).
        at = np.flatnonzero(candidate_mask(logprobs).numpy())
        rows_start = np.arange(1, len(states)) * vocab
        candidates = [
            ids - row * vocab
            for row, ids in enumerate(np.split(at, np.searchsorted(at, rows_start)))
        ]
    values = scaled.numpy()
    choices = []
    for row, state in enumerate(states):
        params = state.params
        kept = kept_ids(scaled[row], logprobs[row], params.top_k, params.top_p, candidates[row])
        token = int(kept[draw_index(values[row][kept], state.generator)])
        choice = TokenChoice(token=token, logprob=float(logprobs[row, token]))
        choices.append(_with_top(choice, logprobs[row], state))
    return choices


Chooser = Callable[[torch.Tensor, Sequence[SequenceState]], list[TokenChoice]]
_SHARED: tuple[tuple[Callable[[SequenceState], bool], Chooser], ...] = (
    (plain_greedy, _greedy),
    (plain_sampled, _sampled),
)


def choose_tokens(logits: torch.Tensor, states: Sequence[SequenceState]) -> list[TokenChoice]:
    """`choose_token` for every row of a decode step's float32 `logits` [rows, vocab], the
    caller's own copy (the plain rows' end-id bans may be written into it; the other rows are
    left unchanged)."""
    choices: dict[int, TokenChoice] = {}
    for plain, choose in _SHARED:
        indices = [index for index, state in enumerate(states) if plain(state)]
        if not indices:
            continue
        rows = logits if len(indices) == len(states) else logits[torch.tensor(indices)]
        chosen = [states[index] for index in indices]
        _ban_ends(rows, chosen)
        choices.update(zip(indices, choose(rows, chosen), strict=True))
    return [
        choices[index] if index in choices else choose_token(logits[index].clone(), state)
        for index, state in enumerate(states)
    ]
