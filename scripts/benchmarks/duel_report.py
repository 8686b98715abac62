"""The page's part for the capacity in turns (capacity_duel.py): every round, and the median of
the rounds' ratios."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

VLLM, TRITONBOX = "vLLM", "TritonBox"


@dataclass(frozen=True)
class Round:
    first: str  # VLLM or TRITONBOX: which server this round's requests went to first
    vllm: float  # capacity, output tok/s while every stream was busy
    tritonbox: float
    vllm_others: float  # cores the rest of the machine used during vLLM's run
    tritonbox_others: float

    @property
    def ratio(self) -> float:
        return self.tritonbox / self.vllm


def section(rounds: Sequence[Round], config: str, streams: int, requests: int) -> list[str]:
    """The page's part: every round, and the median of their ratios."""
    if not rounds:
        return []
    ratios = [r.ratio for r in rounds]
    lines = [
        f"### Open loop: capacity in turns, TritonBox's api against vLLM {config}, both up",
        "",
        f"Each round: {requests} requests of the mixed workload of its own, {streams} at a "
        "time, sent to one server and then to the other (capacity_duel.py); the server not "
        "measured sits idle, and its load counts in the others'.",
        "",
        "| round | first | vLLM tok/s | TritonBox tok/s | × vLLM | others' load, cores "
        "(vLLM's run / TritonBox's) |",
        "|---:|---|---:|---:|---:|---|",
    ]
    for index, r in enumerate(rounds, 1):
        lines.append(
            f"| {index} | {r.first} | {r.vllm:.1f} | {r.tritonbox:.1f} | {r.ratio:.2f} | "
            f"{r.vllm_others:.2f} / {r.tritonbox_others:.2f} |"
        )
    lines += [
        "",
        f"Median over {len(rounds)} rounds: **{statistics.median(ratios):.2f}×** vLLM's "
        f"capacity (rounds {min(ratios):.2f}–{max(ratios):.2f}×).",
    ]
    return lines
