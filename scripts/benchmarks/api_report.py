"""scripts/benchmark api's bookkeeping: batches and the Markdown report (the CPU accounting is
scripts/benchmarks/proc.py)."""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

GRPC, TRITON_HTTP, API_ON, API_OFF = PATHS = (
    "Triton gRPC (direct)", "Triton HTTP generate_stream", "api, logging on", "api, logging off",
)  # fmt: skip
OURS = ("triton", "api", "client")
TARGET_THROUGHPUT, TARGET_TTFT_MS, TARGET_LOGGING = 0.95, 5.0, 0.05


@dataclass
class Batch:
    """One batch of requests on one path: wall time, (TTFT s, tokens) per request, CPU seconds."""

    path: str
    concurrency: int
    repeat: int
    wall_s: float
    samples: list[tuple[float, int]]
    cpu_s: dict[str, float]  # triton, api, client; machine: every process on the machine

    @property
    def tokens(self) -> int:
        return sum(count for _, count in self.samples)

    @property
    def tok_s(self) -> float:
        return self.tokens / self.wall_s

    def line(self) -> str:
        ttft = statistics.median(t for t, _ in self.samples) * 1000
        cpu = " / ".join(f"{self.cpu_s[k]:.1f}" for k in (*OURS, "machine"))
        return (f"c={self.concurrency:<3} {self.path:<28} #{self.repeat}: {self.tok_s:7.1f} tok/s, "
                f"TTFT p50 {ttft:6.1f} ms, CPU s triton/api/client/machine {cpu}")  # fmt: skip


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def _pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[int(q * 100) - 1]


@dataclass
class Summary:
    tok_s: float  # median batch
    per_batch: list[float]
    ttft_p50_ms: float
    ttft_p90_ms: float
    cpu_ms_per_1k: dict[str, float]
    busy: float  # share of all cores our processes used
    others: float  # share of all cores every other process on the machine used


def summarise(batches: list[Batch]) -> Summary:
    ttft = [t * 1000 for b in batches for t, _ in b.samples]
    tokens = sum(b.tokens for b in batches) / 1000
    cpu = {k: sum(b.cpu_s[k] for b in batches) * 1000 / tokens for k in batches[0].cpu_s}
    capacity = sum(b.wall_s for b in batches) * len(os.sched_getaffinity(0))
    ours = sum(b.cpu_s[k] for b in batches for k in OURS) / capacity
    others = sum(b.cpu_s["machine"] for b in batches) / capacity - ours
    per_batch = [b.tok_s for b in batches]
    return Summary(statistics.median(per_batch), per_batch, statistics.median(ttft),
                   _pct(ttft, 0.9), cpu, ours, max(0.0, others))  # fmt: skip


def _verdict(ok: bool) -> str:
    return "**met**" if ok else "**not met**"


def report(
    batches: list[Batch], args: argparse.Namespace, elapsed_s: float, load: tuple[float, ...]
) -> str:
    concurrencies = sorted({b.concurrency for b in batches})
    s: dict[tuple[int, str], Summary] = {
        (c, p): summarise([b for b in batches if (b.concurrency, b.path) == (c, p)])
        for c in concurrencies
        for p in PATHS
    }
    requests = ", ".join(
        f"{c}: {len(next(b for b in batches if b.concurrency == c).samples)}" for c in concurrencies
    )
    command = " ".join(["scripts/benchmark api", *sys.argv[1:]])
    out = [
        "# api proxy benchmark",
        "",
        f"Produced by `{command}` on {time.strftime('%Y-%m-%d')} in {elapsed_s / 60:.1f} min "
        "(measuring only). Every row comes from the same run.",
        "",
        f"- **Machine**: {_cpu_model()}, {os.cpu_count()} cores ({len(os.sched_getaffinity(0))} "
        f"usable), Python {platform.python_version()}; load average "
        f"{load[0]:.2f} before, {load[1]:.2f} after (shared machine: others run tests beside it).",
        f"- **Engine**: `ENGINE=synthetic`, `SYNTHETIC_TOKEN_INTERVAL_S={args.interval}` (one "
        f"token every {args.interval * 1000:.0f} ms per request: {1 / args.interval:.0f} tok/s per "
        "stream at most), `MAX_BATCH_SIZE=64`, one preprocessing and one postprocessing "
        "instance: the whole ensemble runs, only the model is replaced.",
        f"- **Workload**: one prompt, {args.tokens} output tokens per request (the synthetic "
        "engine always emits max_tokens), batches of concurrency × "
        f"{args.waves} requests (at least {args.min_requests}; requests per batch {requests}), "
        "each path warmed up first, then the paths in round-robin, a different one first each "
        f"time, {args.repeats} batches per path and concurrency.",
        "- **Paths**: gRPC with the api's own client (`tritonbox_common.client`, one channel); "
        "Triton's `POST /v2/models/ensemble/generate_stream` (SSE, one event per token; tokens = "
        "sum of `sequence_length`); the api's `POST /v1/completions` with `stream: true` and "
        "`stream_options.include_usage` (tokens = the final chunk's `usage.completion_tokens`) "
        "on two api processes, `LOG_PREDICTIONS=true` and `false`, `MAX_CONCURRENT_REQUESTS=256`. "
        "HTTP client: one `httpx.AsyncClient` (HTTP/1.1, no connection limit). Every request's "
        "token count is checked.",
        "- **Columns**: output tok/s = tokens / wall time of a batch, median batch (every batch "
        "in brackets); TTFT = request sent → first non-empty text, over all requests of the "
        "path's batches; CPU = CPU time per 1 000 output tokens of tritonserver with its backend "
        "stubs, of the api process in use and of this client; busy = all of it / (wall × cores), "
        "others = what every other process on the machine used meanwhile (the same machine's "
        "noise, /proc/stat).",
        "",
    ]
    for c in concurrencies:
        base = s[(c, GRPC)]
        out += [
            f"## Concurrency {c}",
            "",
            "| path | output tok/s | × gRPC | TTFT p50 ms | TTFT p90 ms | Δ TTFT p50 ms "
            "| CPU ms / 1k tok: Triton · api · client | busy | others |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for p in PATHS:
            r = s[(c, p)]
            batch_rates = ", ".join(f"{v:.0f}" for v in r.per_batch)
            cpu = " · ".join(f"{r.cpu_ms_per_1k[k]:.0f}" for k in OURS)
            out.append(
                f"| {p} | {r.tok_s:.0f} ({batch_rates}) | {r.tok_s / base.tok_s:.3f} | "
                f"{r.ttft_p50_ms:.1f} | {r.ttft_p90_ms:.1f} | "
                f"{r.ttft_p50_ms - base.ttft_p50_ms:+.1f} | {cpu} | {r.busy:.0%} | {r.others:.0%} |"
            )
        on, off = s[(c, API_ON)], s[(c, API_OFF)]
        out += [
            "",
            f"Logging on vs off: throughput × {on.tok_s / off.tok_s:.3f}, TTFT p50 "
            f"{on.ttft_p50_ms - off.ttft_p50_ms:+.1f} ms, api CPU × "
            f"{on.cpu_ms_per_1k['api'] / off.cpu_ms_per_1k['api']:.2f}.",
            "",
        ]
    out += _targets(s, concurrencies)
    out += [
        "History: [benchmark-api-changes.md](benchmark-api-changes.md) records what made the "
        "proxy cheaper and the runs before and after it. Several api workers and PostgreSQL: "
        "[benchmark-workers.md](benchmark-workers.md) (`scripts/benchmark workers`).",
        "",
    ]
    out += _two_cores(s, max(concurrencies), args.interval)
    return "\n".join(out) + "\n"


def _two_cores(s: dict[tuple[int, str], Summary], c: int, interval: float) -> list[str]:
    pace = c / interval  # tok/s the engine would emit at this concurrency with CPU to spare

    def cores(path: str) -> float:
        return sum(s[(c, path)].cpu_ms_per_1k[k] for k in OURS) * pace / 1e6

    api_ms = s[(c, API_ON)].cpu_ms_per_1k["api"]
    # How far one path's batches spread at this concurrency: differences below it are noise.
    spread = max(
        (max(r.per_batch) - min(r.per_batch)) / r.tok_s for r in (s[(c, p)] for p in PATHS)
    )
    return [
        "## What the 2 cores do to these numbers",
        "",
        "The load generator, tritonserver (with its three Python-backend processes) and the api "
        "run on the same cores, so a path's CPU cost per token takes CPU from the others, "
        "Triton included: where the cores are full, throughput falls by the proxy's CPU share "
        "rather than by anything on the network path. "
        f"At concurrency {c} the engine's pace is {pace:.0f} tok/s; at the measured CPU cost "
        f"per token that needs {cores(GRPC):.2f} cores for direct gRPC (Triton + client) and "
        f"{cores(API_ON):.2f} for the api path (Triton + api + client) on a machine with "
        f"{len(os.sched_getaffinity(0))} cores that others share too: below saturation every "
        "path keeps the engine's pace and the api's cost shows in TTFT and CPU only; above it, "
        "in throughput. The HTTP paths also cost this client more CPU than gRPC does (SSE over "
        "httpx, the client column), on the same cores. The api's own cost is "
        f"{api_ms / 1000:.2f} ms of CPU per output token at concurrency {c} (its per-request "
        "work included), most of it on its one event-loop thread (the rest: the database "
        "writer, gRPC's poller): one api process cannot pass about "
        f"{1e6 / api_ms:.0f} tok/s even with a core to itself. "
        "TTFT at concurrency 16 and 64 is the time to admit a burst: a closed loop of identical "
        "requests starts and ends them together, so each wave arrives at once, and the api "
        "admits them one after another on its event loop (parse, validate, count the prompt's "
        "tokens, open the stream) while it relays the other streams' tokens. With the cores "
        f"full, the same path's batches at concurrency {c} differ by up to {spread:.0%} of its "
        "median in this run: its ratios and TTFTs move by that much from run to run (the "
        "logging on/off comparison included), unlike those at lower concurrency.",
        "",
    ]


def _targets(s: dict[tuple[int, str], Summary], concurrencies: list[int]) -> list[str]:
    def each(value: Callable[[int], float], fmt: str) -> str:
        return ", ".join(f"c={c}: {fmt.format(value(c))}" for c in concurrencies)

    def ratio(c: int) -> float:
        return s[(c, API_ON)].tok_s / s[(c, GRPC)].tok_s

    def added(c: int) -> float:
        return s[(c, API_ON)].ttft_p50_ms - s[(c, GRPC)].ttft_p50_ms

    def logging(c: int) -> float:
        return 1 - s[(c, API_ON)].tok_s / s[(c, API_OFF)].tok_s

    ok = [
        all(ratio(c) >= TARGET_THROUGHPUT for c in concurrencies),
        all(added(c) <= TARGET_TTFT_MS for c in concurrencies),
        all(logging(c) <= TARGET_LOGGING for c in concurrencies),
    ]
    return [
        "## Targets",
        "",
        f"- The api (logging on) delivers ≥ 95% of direct-gRPC throughput: {_verdict(ok[0])} — "
        f"{each(ratio, '{:.1%}')}.",
        f"- The api adds ≤ 5 ms to median TTFT: {_verdict(ok[1])} — {each(added, '{:+.1f} ms')}.",
        f"- Logging costs ≤ 5% of throughput: {_verdict(ok[2])} — {each(logging, '{:+.1%}')}.",
        "",
    ]
