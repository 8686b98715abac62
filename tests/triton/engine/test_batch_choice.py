"""A decode step's choices: the plain rows' in shared operations, each its lone choice."""

from __future__ import annotations

import torch
from tritonbox_testing.sequences import sequence_state as state

from tritonbox_triton.engine.batch_choice import choose_tokens, plain_greedy, plain_sampled
from tritonbox_triton.engine.params import SamplingParams
from tritonbox_triton.engine.sampling import SequenceState, choose_token
from tritonbox_triton.engine.words import WordRules

VOCAB = 4096  # wide enough for top-p to sort only its candidates, as with a real vocabulary


def test_a_batch_chooses_what_each_row_would_alone() -> None:
    """The plain greedy rows (still under min_tokens or not) share one log-softmax and argmax,
    the plain sampled ones their temperature, log-softmax and softmax; the others (penalised,
    with bad words) go row by row; every choice is the lone one's, each draw from the row's
    own generator. A greedy row that asked for no log-probs gets 0 (none computed)."""
    decode = state().words._decode
    rows = [
        state(num_top_logprobs=3),
        state(temperature=0.7, top_p=0.9, seed=5),
        state(repetition_penalty=1.3),
        state(min_tokens=4, return_log_probs=True),
        state(),
        SequenceState(
            params=SamplingParams(max_tokens=8, end_id=0, pad_id=0),
            prompt=[1],
            words=WordRules(decode, bad_words=[[5]]),
        ),
        state(end_id=-1, min_tokens=4),
        state(temperature=1.3, top_p=0.95, seed=6, num_top_logprobs=2),
        state(temperature=0.7, top_k=40, seed=7),
        state(temperature=0.9, top_k=20, top_p=0.5, seed=8, min_tokens=4),
        state(temperature=0.5, top_k=300, seed=9),
        state(temperature=0.7, top_p=0.9, seed=5, repetition_penalty=1.2),
        state(temperature=1.0, top_p=0.9, seed=10),  # a long tail: top-p sorts the vocabulary
    ]
    greedy = [True, False, False, True, True, False, True] + [False] * 6
    sampled = [False, True, False, False, False, False, False, True, True, True, True, False, True]
    assert [plain_greedy(row) for row in rows] == greedy
    assert [plain_sampled(row) for row in rows] == sampled
    logits = torch.randn(len(rows), VOCAB, generator=torch.Generator().manual_seed(3)) * 4
    logits[:, 5] = 20.0  # the best token everywhere, unless a rule bans it
    logits[3:5, 0] = 30.0  # the end id: banned under min_tokens (row 3), chosen past it (row 4)
    logits[9, 0] = 30.0  # a sampled row's end id, banned under min_tokens
    logits[12] = 0.0  # 4,095 tokens under 1e-4 of the best's weight hold 16% of the mass
    logits[12, 7] = 10.0
    before = logits.clone()
    batched = choose_tokens(logits, rows)
    others = [index for index in range(len(rows)) if not (greedy[index] or sampled[index])]
    assert torch.equal(logits[others], before[others])  # only plain rows get bans written
    for row in rows:  # the sampled rows draw again from fresh generators of the same seeds
        row.generator.manual_seed(row.params.seed)
    alone = [choose_token(before[index].clone(), row) for index, row in enumerate(rows)]
    for index in (4, 6):  # plain greedy, no log-probs asked for
        assert alone[index].logprob < 0
        alone[index].logprob = 0.0
    assert batched == alone
    assert batched[3].logprob < 0
    assert batched[5].token != 5 and batched[0].top_ids[0] == 5
    assert (batched[3].token, batched[4].token) == (5, 0)
    assert batched[9].token != 0 and len(batched[7].top_ids) == 2


def test_many_sampled_rows_are_each_their_own() -> None:
    """Many peaked rows of a real vocabulary's width side by side, each with its temperature
    and top-p: every token is the one its row draws alone, seed for seed."""
    generator = torch.Generator().manual_seed(11)
    rows = [
        state(temperature=0.4 + 0.1 * (index % 9), top_p=0.5 + 0.05 * (index % 10), seed=index)
        for index in range(48)
    ]
    logits = torch.randn(len(rows), 49_152, generator=generator) * 3
    peaks = torch.randint(0, 49_152, (len(rows), 6), generator=generator)
    logits.scatter_(1, peaks, torch.rand(len(rows), 6, generator=generator) * 4 + 14)
    before = logits.clone()
    batched = choose_tokens(logits, rows)
    for row in rows:
        row.generator.manual_seed(row.params.seed)
    alone = [choose_token(before[index].clone(), row) for index, row in enumerate(rows)]
    assert batched == alone
    assert len({choice.token for choice in batched}) > 1


def test_sampled_rows_without_top_p_are_each_their_own() -> None:
    """A step whose sampled rows all cut by top-k (no top-p softmax shared): every token is
    still the one its row draws alone."""
    rows = [state(temperature=0.8, top_k=k, seed=k) for k in (5, 40, 300, 7)]
    logits = torch.randn(len(rows), VOCAB, generator=torch.Generator().manual_seed(2)) * 3
    before = logits.clone()
    batched = choose_tokens(logits, rows)
    for row in rows:
        row.generator.manual_seed(row.params.seed)
    assert batched == [choose_token(before[i].clone(), row) for i, row in enumerate(rows)]
