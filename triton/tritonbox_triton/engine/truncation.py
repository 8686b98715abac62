"""Top-k and top-p truncation of a sampled row's logits, and the draw among what is left.

top-k and top-p remove tokens as transformers' TopKLogitsWarper and TopPLogitsWarper do
(tested against them); a token is then drawn by inverse CDF from one uniform number of the
request's seeded generator (sampling.py says why not torch.multinomial).

What is left of a row is a few ids, and the work on them (top-p's sort and cumulative mass, the
draw) is done in numpy: each of those steps is a microsecond there and several as a torch op,
and a batch of 8 sampled rows did two dozen of them per row and step.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt
import torch

# top-p first looks only at the tokens at least this fraction as likely as the best, and sorts
# the whole vocabulary only when they hold less than top_p of the mass: a full sort of 49,152
# logits per sampled row and step doubled a batch of 8's step time.
TOP_P_CANDIDATE_RATIO = 1e-4
_LOG_CANDIDATE_RATIO = math.log(TOP_P_CANDIDATE_RATIO)

Ids = npt.NDArray[np.int64]


def candidate_mask(logprobs: torch.Tensor) -> torch.Tensor:
    """Which of each row's tokens top-p looks at first (`TOP_P_CANDIDATE_RATIO`), from the
    rows' log-softmax (which a sampled row computes anyway, where a softmax would be one more
    pass over the vocabulary)."""
    # amax, not max(dim=-1): the same value without the indices, at a tenth of the time.
    return logprobs >= logprobs.amax(dim=-1, keepdim=True) + _LOG_CANDIDATE_RATIO


def candidate_ids(logprobs: torch.Tensor) -> Ids:
    """The ids, ascending, that `candidate_mask` keeps of one row."""
    return np.flatnonzero(candidate_mask(logprobs).numpy())


def top_p_candidates(
    logprobs: npt.NDArray[np.float32], top_p: float, candidates: Ids
) -> Ids | None:
    """The ids top-p keeps of a row with these log-softmax values (best last), when it can
    decide among the `candidates` (`candidate_ids`); None when they hold too little of the mass
    and the whole vocabulary must be sorted."""
    probs = np.exp(logprobs[candidates])
    tail = 1.0 - float(probs.sum())
    # Everything else is dropped for sure when its whole mass is below the threshold (with room
    # for float32 rounding); decide among the candidates, whose ascending cumulative mass starts
    # from that tail.
    if tail >= (1 - top_p) - 1e-4:
        return None
    order = np.argsort(probs, kind="stable")
    remove = (tail + np.cumsum(probs[order])) <= (1 - top_p)
    remove[-1] = False
    kept: Ids = candidates[order[~remove]]
    return kept


def top_p_removed(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """transformers' TopPLogitsWarper's mask: sorted ascending, drop the tokens whose cumulative
    mass is at most 1 - top_p, always keep the best."""
    logprobs = torch.log_softmax(logits, dim=-1)
    kept = top_p_candidates(logprobs.numpy(), top_p, candidate_ids(logprobs))
    if kept is not None:
        removed = torch.ones_like(logits, dtype=torch.bool)
        removed[torch.from_numpy(kept)] = False
        return removed
    sorted_logits, order = torch.sort(logits, descending=False)
    cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
    remove = cumulative <= (1 - top_p)
    remove[-1] = False
    return remove.scatter(0, order, remove)


def draw_index(values: npt.NDArray[np.float32], generator: torch.Generator) -> int:
    """Which of `values` (the finite logits top-k and top-p left, usually a few) one uniform
    number from `generator` picks, by inverse CDF over their softmax, exponentiated in float64;
    the scale of the weights does not matter, the point is drawn on their sum.
    (torch.multinomial draws one exponential number per vocabulary entry, 49,152 per token:
    three quarters of a sampled row's time.)"""
    weights = values.astype(np.float64)
    cumulative = np.cumsum(np.exp(weights - weights.max()))
    point = float(torch.rand((), generator=generator, dtype=torch.float64)) * cumulative[-1]
    index = int(np.searchsorted(cumulative, point, side="right"))
    return min(index, len(values) - 1)


def top_p_alone(top_k: int, top_p: float, vocab: int) -> bool:
    """Whether top-p alone truncates a row of `vocab` logits (no top-k that cuts it): the case
    `kept_ids` decides among top-p's candidates."""
    return (top_k <= 0 or top_k >= vocab) and 0.0 < top_p < 1.0


def kept_ids(
    logits: torch.Tensor,
    logprobs: torch.Tensor,
    top_k: int,
    top_p: float,
    candidates: Ids | None = None,
) -> Ids:
    """The ids, ascending, of the finite logits `filter_top_k_top_p` leaves of a row, given its
    log-softmax. With top-p alone deciding among its candidates (a model's peaked logits),
    without writing a mask over the vocabulary and searching it again: a fifth of a sampled
    row's time. `candidates`: the row's `candidate_ids`, where the caller has them already (a
    batch's rows share the operations)."""
    if top_p_alone(top_k, top_p, logits.numel()):
        if candidates is None:
            candidates = candidate_ids(logprobs)
        kept = top_p_candidates(logprobs.numpy(), top_p, candidates)
        if kept is not None:
            return np.sort(kept)
    filtered = filter_top_k_top_p(logits, top_k, top_p)
    ids: Ids = (filtered > float("-inf")).nonzero().flatten().numpy()
    return ids


def filter_top_k_top_p(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    if top_k > 0 and top_k < logits.numel():
        threshold = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < threshold, float("-inf"))
    if 0.0 < top_p < 1.0:
        logits = logits.masked_fill(top_p_removed(logits, top_p), float("-inf"))
    return logits
