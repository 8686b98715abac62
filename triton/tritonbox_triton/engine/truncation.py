"""Top-k and top-p truncation of a sampled row's logits, and the draw among what is left.

top-k and top-p remove tokens as transformers' TopKLogitsWarper and TopPLogitsWarper do
(tested against them); a token is then drawn by inverse CDF from one uniform number of the
request's seeded generator (sampling.py says why not torch.multinomial).
"""

from __future__ import annotations

import torch

# top-p first looks only at the tokens at least this fraction as likely as the best, and sorts
# the whole vocabulary only when they hold less than top_p of the mass: a full sort of 49,152
# logits per sampled row and step doubled a batch of 8's step time.
TOP_P_CANDIDATE_RATIO = 1e-4


def candidate_mask(probs: torch.Tensor) -> torch.Tensor:
    """Which of each row's `probs` top-p looks at first (`TOP_P_CANDIDATE_RATIO`)."""
    return probs >= probs.max(dim=-1, keepdim=True).values * TOP_P_CANDIDATE_RATIO


def top_p_candidates(
    logits: torch.Tensor,
    top_p: float,
    probs: torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
) -> torch.Tensor | None:
    """The ids top-p keeps (best last), when it can decide among the candidates; None when
    they hold too little of the mass and the whole vocabulary must be sorted. `probs` and
    `mask`: the logits' softmax and its `candidate_mask`, where the caller has them already
    (a batch's rows share the operations)."""
    probs = logits.softmax(dim=-1) if probs is None else probs
    mask = candidate_mask(probs) if mask is None else mask
    candidates = mask.nonzero().flatten()
    tail = 1.0 - float(probs[candidates].sum())
    # Everything else is dropped for sure when its whole mass is below the threshold (with room
    # for float32 rounding); decide among the candidates, whose ascending cumulative mass starts
    # from that tail.
    if tail >= (1 - top_p) - 1e-4:
        return None
    ascending, order = torch.sort(probs[candidates])
    remove = (tail + ascending.cumsum(dim=-1)) <= (1 - top_p)
    remove[-1] = False
    return candidates[order[~remove]]


def top_p_removed(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """transformers' TopPLogitsWarper's mask: sorted ascending, drop the tokens whose cumulative
    mass is at most 1 - top_p, always keep the best."""
    kept = top_p_candidates(logits, top_p)
    if kept is not None:
        removed = torch.ones_like(logits, dtype=torch.bool)
        removed[kept] = False
        return removed
    sorted_logits, order = torch.sort(logits, descending=False)
    cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
    remove = cumulative <= (1 - top_p)
    remove[-1] = False
    return remove.scatter(0, order, remove)


def draw_index(values: torch.Tensor, generator: torch.Generator) -> int:
    """Which of `values` (the finite logits top-k and top-p left, usually a few) one uniform
    number from `generator` picks, by inverse CDF over their softmax, exponentiated in float64;
    the scale of the weights does not matter, the point is drawn on their sum.
    (torch.multinomial draws one exponential number per vocabulary entry, 49,152 per token:
    three quarters of a sampled row's time.)"""
    values = values.double()
    cumulative = (values - values.max()).exp().cumsum(dim=0)
    point = torch.rand((), generator=generator, dtype=torch.float64) * cumulative[-1]
    index = torch.searchsorted(cumulative, point, right=True)
    return int(index.clamp(max=values.numel() - 1))


def top_p_alone(top_k: int, top_p: float, vocab: int) -> bool:
    """Whether top-p alone truncates a row of `vocab` logits (no top-k that cuts it): the case
    `kept_ids` decides among top-p's candidates."""
    return (top_k <= 0 or top_k >= vocab) and 0.0 < top_p < 1.0


def kept_ids(
    logits: torch.Tensor,
    top_k: int,
    top_p: float,
    probs: torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """The ids, ascending, of the finite logits `filter_top_k_top_p` leaves. With top-p alone
    deciding among its candidates (a model's peaked logits), without writing a mask over the
    vocabulary and searching it again: a fifth of a sampled row's time. `probs`, `mask`: as
    `top_p_candidates` takes them."""
    if top_p_alone(top_k, top_p, logits.numel()):
        kept = top_p_candidates(logits, top_p, probs, mask)
        if kept is not None:
            return kept.sort().values
    filtered = filter_top_k_top_p(logits, top_k, top_p)
    return (filtered > float("-inf")).nonzero().flatten()


def filter_top_k_top_p(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    if top_k > 0 and top_k < logits.numel():
        threshold = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < threshold, float("-inf"))
    if 0.0 < top_p < 1.0:
        logits = logits.masked_fill(top_p_removed(logits, top_p), float("-inf"))
    return logits
