"""The batch benchmark's page: a batch's throughput alone against the closed loop, live TTFT
idle against beside a running batch (as ratios, with the targets of docs/batches.md), every
turn with the machine's other load, and a plot of both."""

from __future__ import annotations

import argparse
import os
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

THROUGHPUT_TARGET = 0.8  # a batch alone: at least this share of the closed loop's tokens/s
TTFT_TARGET = 1.25  # live TTFT beside a batch: at most this multiple of the idle stack's


@dataclass
class Turn:
    kind: str  # "closed loop", "batch alone", "idle", beside_kind(n)
    concurrency: int
    rep: int
    wall: float = 0.0
    ttfts: list[float] = field(default_factory=list)  # streamed requests' TTFT, s
    requests: int = 0  # requests, or a batch's lines
    tokens: int = 0  # their output tokens
    lines: int = 0  # beside batch: the batch's lines completed during the turn
    line_tokens: int = 0
    load: float = 0.0  # 1-minute load average at the start
    others: float = 0.0  # cores the rest of the machine used meanwhile

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall

    def line(self) -> str:
        head = f"turn {self.rep} {self.kind:<12} c={self.concurrency:<3}"
        tail = f"load {self.load:.2f}, others {self.others:.2f} cores"
        if self.kind in ("closed loop", "batch alone"):
            rate = f"{self.requests / self.wall:6.2f} req/s {self.tokens_per_s:6.1f} tok/s"
            return f"{head} {rate} {tail}"
        p50, p90 = (pct(self.ttfts, q) * 1000 for q in (0.5, 0.9))
        batch = f" batch {self.lines / self.wall:5.2f} lines/s" if self.kind != "idle" else ""
        return f"{head} TTFT p50 {p50:5.0f} p90 {p90:5.0f} ms{batch}  {tail}"


def beside_kind(kept: int) -> str:
    """The turns beside a batch on an api with BATCH_REQUESTS_BESIDE_LIVE = `kept`."""
    return f"beside batch, {kept} kept"


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _of(turns: list[Turn], kind: str, concurrency: int | None = None) -> list[Turn]:
    return [
        t for t in turns if t.kind == kind and concurrency in (None, t.concurrency)
    ]  # fmt: skip


def _spread(values: list[float], digits: int = 1) -> str:
    low, mid, high = (
        f"{v:.{digits}f}" for v in (min(values), statistics.median(values), max(values))
    )
    return f"{mid} ({low}–{high})"


def _met(ok: bool) -> str:
    return "**met**" if ok else "**not met**"


def besides(turns: list[Turn]) -> list[str]:
    """The beside-batch kinds measured, by their setting."""
    return sorted({t.kind for t in turns if t.kind.startswith("beside")}, key=_kept)


def _kept(kind: str) -> int:
    return int(kind.split(", ")[1].split()[0])


def summary(turns: list[Turn]) -> dict[str, float]:
    """The ratios: a batch's tok/s over the closed loop's (medians over the turns); per
    beside-batch kind and concurrency, its TTFT p50 and p90 over idle (every request)."""
    found = {
        "throughput": statistics.median(t.tokens_per_s for t in _of(turns, "batch alone"))
        / statistics.median(t.tokens_per_s for t in _of(turns, "closed loop"))
    }
    for c in sorted({t.concurrency for t in _of(turns, "idle")}):
        idle = [x for t in _of(turns, "idle", c) for x in t.ttfts]
        for kind in besides(turns):
            beside = [x for t in _of(turns, kind, c) for x in t.ttfts]
            for q in (0.5, 0.9):
                found[f"{kind} p{q * 100:.0f} c={c}"] = pct(beside, q) / pct(idle, q)
    return found


def plot(turns: list[Turn], output: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")  # no screen
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4), width_ratios=[1, 1.6])
    kinds = ["closed loop", "batch alone"]
    values = [[t.tokens_per_s for t in _of(turns, k)] for k in kinds]
    medians = [statistics.median(v) for v in values]
    errors = [[m - min(v) for m, v in zip(medians, values, strict=True)],
              [max(v) - m for m, v in zip(medians, values, strict=True)]]  # fmt: skip
    left.bar(kinds, medians, yerr=errors, capsize=4, color=["#888", "#3a7"])
    left.set_ylabel("output tokens/s (median, min–max)")
    left.set_title(f"full batch ({turns[0].concurrency} streams)")
    levels = sorted({t.concurrency for t in _of(turns, "idle")})
    kinds = ["idle", *besides(turns)]
    colours = ["#37a", "#a42", "#d96", "#7a5", "#999"]
    width = 0.8 / (2 * len(kinds))
    bars = [(kind, q) for q in (0.5, 0.9) for kind in kinds]
    for i, (kind, q) in enumerate(bars):
        colour = colours[kinds.index(kind) % len(colours)]
        heights = [pct([x for t in _of(turns, kind, c) for x in t.ttfts], q) * 1000 for c in levels]
        spots = [j + (i - (len(bars) - 1) / 2) * width for j in range(len(levels))]
        right.bar(
            spots, heights, width, color=colour, alpha=0.55 if q == 0.5 else 1.0,
            label=f"{kind} p{q * 100:.0f}",
        )  # fmt: skip
    right.set_xticks(range(len(levels)), [f"concurrency {c}" for c in levels])
    right.set_ylabel("time to first token, ms")
    right.set_title("live requests: idle stack vs beside a batch")
    right.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    for axes in (left, right):
        axes.grid(axis="y", alpha=0.3)
    figure.suptitle("SmolLM2-135M-Instruct, cpu engine, 2 CPU cores")
    figure.tight_layout()
    figure.savefig(output, dpi=110)


def report(turns: list[Turn], args: argparse.Namespace, elapsed: float) -> str:
    picture = args.output.with_suffix(".png")
    plot(turns, picture)
    ratios = summary(turns)
    size = args.batch_size
    loop, alone = _of(turns, "closed loop"), _of(turns, "batch alone")
    settings = ", ".join(f"`{k}={v}`" for k, v in args.settings.items())
    default_kept = args.settings["BATCH_REQUESTS_BESIDE_LIVE"]
    lines = [
        "# Batch jobs beside live traffic",
        "",
        f"Produced by `scripts/benchmark batch` on {time.strftime('%Y-%m-%d')} ({os.cpu_count()} "
        f"cores; {elapsed / 60:.1f} min in all). One stack: tritonserver with the cpu engine and "
        f"SmolLM2-135M-Instruct, `MAX_BATCH_SIZE={size}`; the api in front of it with its batch "
        f"settings at their defaults ({settings}). Every request and batch line is a chat "
        "completion of one of six questions of similar length, greedy, forced to an exact "
        "output length (`min_tokens` + `ignore_eos`; every count checked). "
        f"{args.turns} turns of each measurement, alternating, a different one first each turn.",
        "",
        f"![throughput and TTFT]({picture.name})",
        "",
        "## A batch alone against the closed loop",
        "",
        f"Closed loop: {size} streamed requests at a time through the api, {size * args.waves} "
        f"a turn, {args.tokens} tokens each. Batch alone: {size * args.waves} such lines "
        "uploaded as a JSONL file and run as one batch (`POST /v1/files`, `POST /v1/batches`), "
        "timed from the create to the poll (every 50 ms) that sees it `completed`, its output "
        "file's token counts summed; created once no live request had run for the runner's "
        "`LIVE_QUIET_S` (else it starts held back).",
        "",
        "| | requests or lines/s, median (min–max) | output tok/s, median (min–max) "
        "| × closed loop |",
        "|---|---:|---:|---:|",
        f"| closed loop | {_spread([t.requests / t.wall for t in loop], 2)} | "
        f"{_spread([t.tokens_per_s for t in loop])} | 1.00 |",
        f"| batch alone | {_spread([t.requests / t.wall for t in alone], 2)} | "
        f"{_spread([t.tokens_per_s for t in alone])} | {ratios['throughput']:.2f} |",
        "",
        f"Target ≥ {THROUGHPUT_TARGET}×: {_met(ratios['throughput'] >= THROUGHPUT_TARGET)}.",
        "",
        "## Live time to first token beside a running batch",
        "",
        f"Streamed chat requests of {args.interactive_tokens} tokens, a closed loop at each "
        f"concurrency (concurrency × {args.waves} requests, at least {args.min_requests}, a "
        "turn), TTFT to the first non-empty content. Idle: nothing else runs. Beside batch: a "
        f"batch of {args.batch_lines} lines of {args.line_tokens} tokens is created for the "
        f"turn, the live requests start once its first {size} lines are done (the engine full "
        "of lines), and it is cancelled after them. p50 and p90 over every request of the turns.",
        "",
        f"The api's lines kept beside live traffic (`BATCH_REQUESTS_BESIDE_LIVE`): "
        f"{default_kept} by default"
        + (
            "; the turns marked otherwise ran on a second api process, started with that "
            "setting, in front of the same tritonserver (each api runs the batches created on "
            "it, so its batch and its live requests meet only there)."
            if len(besides(turns)) > 1
            else "."
        ),
        "",
        "| concurrency | beside | TTFT p50 idle ms | beside ms | × idle | TTFT p90 idle ms | "
        "beside ms | × idle | batch lines/s meanwhile, median (min–max) | target ≤ 1.25× |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for c in sorted({t.concurrency for t in _of(turns, "idle")}):
        idle = [x * 1000 for t in _of(turns, "idle", c) for x in t.ttfts]
        for kind in besides(turns):
            beside_turns = _of(turns, kind, c)
            beside = [x * 1000 for t in beside_turns for x in t.ttfts]
            p50, p90 = ratios[f"{kind} p50 c={c}"], ratios[f"{kind} p90 c={c}"]
            rate = _spread([t.lines / t.wall for t in beside_turns], 2)
            lines.append(
                f"| {c} | {_kept(kind)} kept | {pct(idle, 0.5):.0f} | {pct(beside, 0.5):.0f} | "
                f"{p50:.2f} | {pct(idle, 0.9):.0f} | {pct(beside, 0.9):.0f} | {p90:.2f} | "
                f"{rate} | {_met(max(p50, p90) <= TTFT_TARGET)} |"
            )
    lines += [
        "",
        "## Every turn",
        "",
        "Load: the 1-minute load average at the turn's start; others: the cores the rest of the "
        "machine used during it (all CPU time but the stack's processes and this client's). "
        "First wave: the turn's first `concurrency` requests, sent together; beside a batch, "
        "they are the ones that meet the engine full of lines.",
        "",
        "| turn | what | concurrency | wall s | result | load | others, cores |",
        "|---:|---|---:|---:|---|---:|---:|",
    ]
    for t in turns:
        if t.kind in ("closed loop", "batch alone"):
            result = f"{t.requests / t.wall:.2f}/s, {t.tokens_per_s:.1f} tok/s"
        else:
            p50, p90 = (pct(t.ttfts, q) * 1000 for q in (0.5, 0.9))
            first = max(t.ttfts[: t.concurrency]) * 1000  # in request order: the first wave's
            result = f"TTFT p50 {p50:.0f} ms, p90 {p90:.0f} ms, first wave's slowest {first:.0f} ms"
            if t.kind != "idle":
                result += f"; batch {t.lines} lines ({t.lines / t.wall:.2f}/s)"
        lines.append(
            f"| {t.rep} | {t.kind} | {t.concurrency} | {t.wall:.1f} | {result} | "
            f"{t.load:.2f} | {t.others:.2f} |"
        )
    return "\n".join(lines) + "\n"
