"""The page's part for the servers measured in turns (duel.py): every round of each part, and the
headline of each (the median of the rounds' ratios; for the open loop's TTFT p90 also the p90
over all its rounds' requests, each server's)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

VLLM, TRITONBOX = "vLLM", "TritonBox"
CAPACITY, OPEN = "capacity", "open"  # Round.part; a closed-loop round's part is its streams


@dataclass(frozen=True)
class Run:
    """One server's run in a round."""

    tokens_per_s: float  # capacity: while every stream was busy; else completed
    others: float  # cores the rest of the machine used meanwhile, the idle server included
    ttft_p50_ms: float = math.nan  # the open loop's
    ttft_p90_ms: float = math.nan


@dataclass(frozen=True)
class Round:
    part: str  # CAPACITY, OPEN, or a closed-loop level's streams ("16")
    first: str  # VLLM or TRITONBOX: which server this round's requests went to first
    vllm: Run
    tritonbox: Run

    @property
    def ratio(self) -> float:
        """TritonBox's over vLLM's: TTFT p90 in the open loop (lower is better), else tok/s."""
        if self.part == OPEN:
            return self.tritonbox.ttft_p90_ms / self.vllm.ttft_p90_ms
        return self.tritonbox.tokens_per_s / self.vllm.tokens_per_s


@dataclass(frozen=True)
class Duel:
    config: str  # vLLM's configuration
    rounds: list[Round]
    open_rate: float = 0.0  # the open loop's requests/s: a share of vLLM's capacity here
    open_share: float = 0.0
    pooled_p90_ms: tuple[float, float] = (math.nan, math.nan)  # vLLM's, TritonBox's


def _headline(rounds: Sequence[Round], what: str) -> str:
    ratios = [r.ratio for r in rounds]
    return (f"Median over {len(rounds)} rounds: **{statistics.median(ratios):.2f}×** vLLM's "
            f"{what} (rounds {min(ratios):.2f}–{max(ratios):.2f}×).")  # fmt: skip


def _others(r: Round) -> str:
    return f"{r.vllm.others:.2f} / {r.tritonbox.others:.2f}"


def section(duel: Duel | None, streams: int, requests: int, open_requests: int) -> list[str]:
    """The page's part: each part's rounds and headline."""
    if duel is None or not duel.rounds:
        return []
    lines = [
        f"### In turns: TritonBox's api against vLLM {duel.config}, both up",
        "",
        "Both servers up side by side, the one not measured idle (its load counts in the "
        "others'); each round sends the same requests to one server and then to the other, the "
        "order turning each round, and each run starts once both servers are idle (vLLM's "
        "processes stay busy for about a second after a run), so a round's ratio compares two "
        "runs minutes apart where the "
        "sweep above compares turns a quarter of an hour apart (duel.py). These are the figures "
        "to compare on a machine whose speed drifts.",
    ]
    if capacity := [r for r in duel.rounds if r.part == CAPACITY]:
        lines += [
            "",
            f"**Capacity**: each round {requests} requests of the mixed workload of its own, "
            f"{streams} at a time.",
            "",
            "| round | first | vLLM tok/s | TritonBox tok/s | × vLLM | others' load, cores "
            "(vLLM's run / TritonBox's) |",
            "|---:|---|---:|---:|---:|---|",
            *[f"| {i} | {r.first} | {r.vllm.tokens_per_s:.1f} | {r.tritonbox.tokens_per_s:.1f} "
              f"| {r.ratio:.2f} | {_others(r)} |" for i, r in enumerate(capacity, 1)],
            "",
            _headline(capacity, "capacity"),
        ]  # fmt: skip
    if opened := [r for r in duel.rounds if r.part == OPEN]:
        theirs, ours = duel.pooled_p90_ms
        lines += [
            "",
            f"**Open loop at {duel.open_share:.0%} of vLLM's capacity** (the capacity rounds' "
            f"median, {duel.open_rate:.2f} req/s): each round {open_requests} requests of its "
            "own at Poisson arrivals.",
            "",
            "| round | first | vLLM TTFT p50 / p90 ms | TritonBox TTFT p50 / p90 ms | × vLLM's "
            "p90 | completed tok/s (vLLM / TritonBox) | others' load, cores |",
            "|---:|---|---:|---:|---:|---:|---|",
            *[f"| {i} | {r.first} | {r.vllm.ttft_p50_ms:.0f} / {r.vllm.ttft_p90_ms:.0f} | "
              f"{r.tritonbox.ttft_p50_ms:.0f} / {r.tritonbox.ttft_p90_ms:.0f} | {r.ratio:.2f} | "
              f"{r.vllm.tokens_per_s:.1f} / {r.tritonbox.tokens_per_s:.1f} | {_others(r)} |"
              for i, r in enumerate(opened, 1)],
            "",
            _headline(opened, "TTFT p90"),
            f"Over all {len(opened)} rounds' requests: TTFT p90 {theirs:.0f} ms (vLLM) against "
            f"{ours:.0f} ms (TritonBox), **{ours / theirs:.2f}×**.",
        ]  # fmt: skip
    levels: dict[str, list[Round]] = {}  # a closed-loop level's rounds, in the order run
    for r in duel.rounds:
        if r.part not in (CAPACITY, OPEN):
            levels.setdefault(r.part, []).append(r)
    if levels:
        lines += [
            "",
            "**Closed loop**: the sweep's batches (the same prompt and output length) at each "
            "level, in turns.",
            "",
            "| streams | round | first | vLLM tok/s | TritonBox tok/s | × vLLM | others' load, "
            "cores |",
            "|---:|---:|---|---:|---:|---:|---|",
        ]
        for level, mine in levels.items():
            lines += [f"| {level} | {i} | {r.first} | {r.vllm.tokens_per_s:.1f} | "
                      f"{r.tritonbox.tokens_per_s:.1f} | {r.ratio:.2f} | {_others(r)} |"
                      for i, r in enumerate(mine, 1)]  # fmt: skip
        lines += ["", *[f"- {level} streams: {_headline(mine, 'tok/s')}"
                        for level, mine in levels.items()]]  # fmt: skip
    return lines
