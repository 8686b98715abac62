"""The page of `scripts/benchmark vllm-cpu --workload …` (vllm_sweep.py): vLLM's configurations
side by side on each workload, TritonBox through its api against the best of them (the direct
gRPC path apart), memory as whole process trees, and the servers' logs kept beside the page."""

from __future__ import annotations

import argparse
import math
import os
import re
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from scripts.benchmarks.duel_report import section as duel_section
from scripts.benchmarks.open_loop import Capacity, OpenRun, Outcome, pct
from scripts.benchmarks.vllm_configs import CONFIGS
from scripts.benchmarks.vllm_report import Batch

TRITONBOX = "TritonBox"
ACCESS_LOG = re.compile(r'"(GET|POST) /|- "(GET|POST)|/v1/completions HTTP')


@dataclass
class Turn:
    server: str  # as the tables name it: "vLLM pinned", "TritonBox api"
    config: str  # a vllm_configs name, or TRITONBOX
    ready_s: float = 0.0
    closed: list[Batch] = field(default_factory=list)
    capacity: Capacity | None = None
    runs: list[OpenRun] = field(default_factory=list)
    memory: dict[str, tuple[int, int]] = field(default_factory=dict)  # bytes now, peak
    logs: list[str] = field(default_factory=list)  # kept logs, relative to the page


def keep_log(folder: Path, name: str, paths: Sequence[Path], head: int = 60, tail: int = 30) -> str:
    """The servers' logs, trimmed, into `folder`/`name`.log: per-request access lines dropped,
    the start (`head` lines) and the end (`tail`); its path relative to the page's folder."""
    out = []
    for path in paths:
        lines = path.read_text(errors="replace").splitlines() if path.exists() else []
        lines = [line[:300] for line in lines if not ACCESS_LOG.search(line)]
        if len(lines) > head + tail:
            lines = [
                *lines[:head],
                f"[… {len(lines) - head - tail} lines left out …]",
                *lines[-tail:],
            ]
        out += [f"==> {path.name} <==", *lines, ""]
    kept = folder / f"{name}.log"
    kept.write_text("\n".join(out))
    return f"{folder.name}/{kept.name}"


def _vllm(turns: Sequence[Turn]) -> list[Turn]:
    return [t for t in turns if t.config != TRITONBOX]


def _capacity_by_config(turns: Sequence[Turn]) -> dict[str, float]:
    """Each vLLM configuration's capacity in tok/s, the median over its turns."""
    found: dict[str, list[float]] = {}
    for turn in _vllm(turns):
        if turn.capacity:
            found.setdefault(turn.config, []).append(turn.capacity.tokens_per_s)
    return {config: statistics.median(values) for config, values in found.items()}


def best_config(turns: Sequence[Turn]) -> str | None:
    """The vLLM configuration of the highest capacity (None before any)."""
    by_config = _capacity_by_config(turns)
    return max(by_config, key=by_config.__getitem__) if by_config else None


def best_closed_config(turns: Sequence[Turn], level: int) -> str | None:
    """The vLLM configuration of the most tok/s in the closed loop at `level` streams."""
    found = {}
    for config in dict.fromkeys(t.config for t in _vllm(turns)):
        if batches := _closed([t for t in turns if t.config == config], f"vLLM {config}", level):
            found[config] = _closed_cells(batches)[0]
    return max(found, key=found.__getitem__) if found else None


def best_capacity(turns: Sequence[Turn]) -> float | None:
    """The best vLLM configuration's capacity in requests/s (None before any)."""
    if (best := best_config(turns)) is None:
        return None
    return statistics.median(
        t.capacity.requests_per_s for t in turns if t.config == best and t.capacity
    )


def _closed(turns: Sequence[Turn], path: str, level: int) -> list[Batch]:
    return [b for t in turns for b in t.closed if b.path == path and b.concurrency == level]


def _closed_cells(batches: Sequence[Batch]) -> tuple[float, float, float, float]:
    """tok/s (median over turns), TTFT p50 after each batch's first wave, the first wave's
    TTFT p50 (its requests sent at once: a burst, not yet the closed loop), TPOT p50; in ms."""
    level = batches[0].concurrency
    steady = [s[0] for b in batches for s in b.samples[level:]]
    first = [s[0] for b in batches for s in b.samples[:level]]
    return (
        statistics.median(b.tokens_per_s for b in batches),
        statistics.median(steady) * 1000 if steady else math.nan,  # one wave: none after it
        statistics.median(first) * 1000,
        statistics.median(t for b in batches for t in b.tpots()) * 1000,
    )


def _ratio(ours: float, theirs: float) -> str:
    """ours / theirs; "–" where a batch had nothing to measure (one wave: no TTFT after it)."""
    return f"{ours / theirs:.2f}" if theirs > 0 and math.isfinite(ours) else "–"


def _ms(value: float) -> str:
    """Milliseconds, or "–" where nothing was measured (nan)."""
    return f"{value:.0f}" if math.isfinite(value) else "–"


def closed_section(turns: Sequence[Turn], levels: Sequence[int]) -> list[str]:
    lines = [
        "### Closed loop: vLLM's configurations",
        "",
        "| streams | configuration | tok/s | TTFT p50 ms (after the first wave) | first wave's "
        "TTFT p50 ms | TPOT p50 ms |",
        "|---:|---|---:|---:|---:|---:|",
    ]
    best: dict[int, tuple[str, tuple[float, float, float, float]]] = {}
    for level in levels:
        for config in dict.fromkeys(t.config for t in _vllm(turns)):
            batches = _closed([t for t in turns if t.config == config], f"vLLM {config}", level)
            if batches:
                cells = _closed_cells(batches)
                if level not in best or cells[0] > best[level][1][0]:
                    best[level] = (config, cells)
                lines.append(f"| {level} | {config} | {cells[0]:.1f} | {_ms(cells[1])} | "
                             f"{cells[2]:.0f} | {cells[3]:.1f} |")  # fmt: skip
    lines += [
        "",
        "### Closed loop: TritonBox through its api against vLLM's best configuration at each "
        "level",
        "",
        "| streams | vLLM's best | its tok/s | TritonBox api tok/s | × vLLM | TTFT p50 ms, vLLM → "
        "TritonBox | × vLLM | first wave's TTFT p50 ms, vLLM → TritonBox |",
        "|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    grpc = ["", "The direct gRPC path (Triton's ensemble, no api), reported apart:", "",
            "| streams | tok/s | TTFT p50 ms (after the first wave) | first wave's TTFT p50 ms |",
            "|---:|---:|---:|---:|"]  # fmt: skip
    for level in levels:
        ours = _closed(turns, "TritonBox api", level)
        if ours and level in best:
            name, peer = best[level]
            cells = _closed_cells(ours)
            lines.append(
                f"| {level} | {name} | {peer[0]:.1f} | {cells[0]:.1f} | "
                f"**{cells[0] / peer[0]:.2f}** | {_ms(peer[1])} → {_ms(cells[1])} | "
                f"{_ratio(cells[1], peer[1])} | {peer[2]:.0f} → {cells[2]:.0f} |"
            )
        if direct := _closed(turns, "TritonBox Triton", level):
            cells = _closed_cells(direct)
            grpc.append(f"| {level} | {cells[0]:.1f} | {_ms(cells[1])} | {cells[2]:.0f} |")
    return lines + grpc


def _open_row(server: str, run: OpenRun | Sequence[OpenRun], ratio: str = "") -> str:
    runs = [run] if isinstance(run, OpenRun) else list(run)
    outcomes: list[Outcome] = [o for r in runs for o in r.outcomes]
    ttft = [o.ttft * 1000 for o in outcomes]
    e2e = [o.e2e for o in outcomes]
    return (
        f"| {runs[0].label} | {server} | {runs[0].rate:.2f} | "
        f"{statistics.median(r.tokens_per_s for r in runs):.1f} | {pct(ttft, 50):.0f} | "
        f"{pct(ttft, 90):.0f} | {pct(e2e, 90):.1f} | {max(r.others for r in runs):.2f} |{ratio}"
    )


def open_section(turns: Sequence[Turn]) -> list[str]:
    head = ("| arrivals | server | req/s | completed tok/s | TTFT p50 ms | TTFT p90 ms | "
            "end-to-end p90 s | others' load, cores |")  # fmt: skip
    capacities = _capacity_by_config(turns)
    lines = ["### Open loop: vLLM's configurations", "",
             "| configuration | capacity tok/s | capacity req/s |", "|---|---:|---:|"]  # fmt: skip
    for config, tokens in capacities.items():
        rps = statistics.median(t.capacity.requests_per_s for t in turns
                                if t.config == config and t.capacity)  # fmt: skip
        lines.append(f"| {config} | {tokens:.1f} | {rps:.2f} |")
    lines += ["", head, "|---|---|---:|---:|---:|---:|---:|---:|"]
    for turn in _vllm(turns):
        lines += [_open_row(turn.server, run) for run in turn.runs]
    ours = [t for t in turns if t.config == TRITONBOX]
    if not capacities or not ours:
        return lines
    best = max(capacities, key=capacities.__getitem__)
    theirs = [t for t in turns if t.config == best]
    our_capacity = statistics.median(t.capacity.tokens_per_s for t in ours if t.capacity)
    lines += [
        "",
        f"### Open loop: TritonBox through its api against vLLM's best here ({best}, by capacity)",
        "",
        f"Capacity: TritonBox {our_capacity:.1f} tok/s against {capacities[best]:.1f}: "
        f"**{our_capacity / capacities[best]:.2f}×**.",
        "",
        head + " × vLLM's TTFT p90 |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    labels = dict.fromkeys(r.label for t in [*theirs, *ours] for r in t.runs)
    peer_runs = {label: [r for t in theirs for r in t.runs if r.label == label] for label in labels}
    for label in labels:
        if peer := peer_runs[label]:
            lines.append(_open_row(f"vLLM {best}", peer, ""))
        if mine := [r for t in ours for r in t.runs if r.label == label]:
            # vLLM at 80% of its capacity is what TritonBox at 80% of vLLM's is measured against.
            against = peer or peer_runs.get(label.replace("vLLM's best", "its"), [])
            p90 = [o.ttft for r in against for o in r.outcomes]
            ratio = [o.ttft for r in mine for o in r.outcomes]
            cell = f" **{pct(ratio, 90) / pct(p90, 90):.2f}** |" if p90 else " – |"
            lines.append(_open_row("TritonBox api", mine, cell))
    return lines


def page(turns: Sequence[Turn], args: argparse.Namespace, elapsed: float) -> str:
    sequences, length, kv_bytes = args.limits
    configs = [c for c in CONFIGS.values() if c.name in args.configs]
    checked = sum(len(r.outcomes) for t in turns for r in t.runs)
    checked += sum(len(t.capacity.outcomes) for t in turns if t.capacity)
    lines = [
        "# The cpu engine against vLLM's configurations: closed loop and open-loop mixed traffic",
        "",
        f"Produced by `{' '.join(['scripts/benchmark vllm-cpu', *sys.argv[1:]])}` on "
        f"{time.strftime('%Y-%m-%d')} at {args.revision} ({os.cpu_count()} cores; "
        f"{elapsed / 60:.0f} min; "
        f"{args.repeats} turn(s) of each server, one server at a time: vLLM's configurations, "
        "then TritonBox). SmolLM2-135M-Instruct in bfloat16, greedy, every request streamed "
        f"and forced to its exact output length. Both servers take at most {sequences} sequences "
        f"of up to {length} tokens; vLLM's KV cache is exactly that ({kv_bytes / 2**30:.2f} GiB).",
        "",
        "vLLM's configurations (each otherwise the same):",
        "",
        *[f"- **{c.name}**: {c.what}." for c in configs],
        "",
        "**Closed loop**: the same 39-token prompt, exactly "
        f"{args.tokens} output tokens, concurrency × {args.waves} requests a batch (at least "
        f"{args.min_requests}), each client sending its next request as its last ends. A batch's "
        "first wave is sent at once, a burst: its TTFT is reported apart.",
        "",
        f"**Open loop** (mixed_workload.py, seed {args.seed}): every request its own prompt "
        "(20–500 tokens, exact; about 30% open with one common 300-token system prompt) and its "
        "own exact output length (32–256 tokens), sent at Poisson arrivals whatever the "
        "server's backlog, through the OpenAI-compatible streaming `/v1/completions` of each "
        f"server. First each server's capacity: {args.capacity_requests} such requests, "
        f"{args.streams} at a time, its output tok/s while every stream was busy, over the mean "
        f"output length in requests/s. Then {args.requests} requests at each rate, a fraction "
        "of that server's own capacity. Each phase has its own requests (a prefix cache meets "
        "no prompt twice), the same for every server. Completed tok/s: the output tokens over "
        "the time from the first request sent to the last one's end. Every request's prompt and "
        f"output token counts were checked against the server's usage: {checked} requests, all "
        "exact.",
        "",
        "Headline ratios are through TritonBox's api; the direct gRPC path is reported apart. "
        "The whole comparison (four closed-loop levels, the open loop at 50, 80 and 100% of "
        "each server's capacity with 40 requests each, TritonBox also at 80% of vLLM's best): "
        "`scripts/benchmark vllm-cpu --workload both`.",
        "",
    ]
    if any(t.closed for t in turns):
        lines += [*closed_section(turns, args.concurrency), ""]
    if any(t.runs for t in turns):
        lines += [*open_section(turns), ""]
    if duel := getattr(args, "duel", None):
        lines += [*duel_section(duel, args.streams, args.capacity_requests, args.requests), ""]
    lines += ["### Memory and start", "",
              "| server | ready after (s, per turn) | resident memory after its run (peak) |",
              "|---|---|---|"]  # fmt: skip
    for server in dict.fromkeys(t.server for t in turns):
        mine = [t for t in turns if t.server == server]
        memory = "; ".join(f"{what} {now / 2**30:.2f} GiB ({peak / 2**30:.2f})"
                           for what, (now, peak) in mine[-1].memory.items())  # fmt: skip
        lines.append(f"| {server} | {', '.join(f'{t.ready_s:.0f}' for t in mine)} | {memory} |")
    # Against the configuration the open loop compares with (else the first one run).
    peers = _capacity_by_config(turns) or {t.config: 0.0 for t in _vllm(turns)}
    best = max(peers, key=peers.__getitem__, default="")
    stack = [t.memory for t in turns if t.config == TRITONBOX]
    vllm = [t.memory for t in turns if t.config == best]
    if stack and vllm:
        ours, theirs = next(iter(stack[-1].values()))[0], next(iter(vllm[-1].values()))[0]
        lines += [
            "",
            f"TritonBox's whole stack against vLLM's whole process tree ({best}), resident after "
            f"the run: {ours / 2**30:.2f} / {theirs / 2**30:.2f} GiB = **{ours / theirs:.2f}×**.",
        ]
    logs = ", ".join(f"[{Path(log).stem}]({log})" for t in turns for log in t.logs)
    lines += ["", f"The servers' logs, trimmed (per-request access lines left out): {logs}."]
    lines += [f"\n{note}." for note in args.notes]
    return "\n".join(lines) + "\n"
