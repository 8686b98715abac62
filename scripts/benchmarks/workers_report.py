"""scripts/benchmark workers's bookkeeping: the configurations, one summary per (path, concurrency)
and the Markdown tables (the targets and what explains them: workers_targets.py)."""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from dataclasses import dataclass

from scripts.benchmarks.api_report import Batch, _cpu_model

GRPC = "Triton gRPC (direct)"
DATABASES = {"sqlite": "SQLite", "postgresql": "PostgreSQL", "postgresql server": "PostgreSQL"}
# Our processes, per batch: tritonserver (its group), the measured api's process tree, the
# PostgreSQL server (postmaster and backends) and this client. `all_apis`: every api's tree, the
# idle ones included, so that `others` is only what we did not start.
OURS = ("triton", "all_apis", "db", "client")


@dataclass(frozen=True)
class Config:
    """One api under test: API_WORKERS and its database."""

    workers: int
    database: str  # sqlite | postgresql

    @property
    def name(self) -> str:
        return f"api ×{self.workers}, {DATABASES[self.database]}"

    @property
    def slug(self) -> str:
        return f"api-{self.workers}-{self.database}"


def cores() -> int:
    return len(os.sched_getaffinity(0))


def busy_cores(b: Batch) -> float:
    """Cores the whole machine kept busy during the batch (everyone's processes)."""
    return b.cpu_s["machine"] / b.wall_s


def others_cores(b: Batch) -> float:
    """Cores kept busy by processes this benchmark did not start (other people's work)."""
    return max(0.0, b.cpu_s["machine"] - sum(b.cpu_s.get(k, 0.0) for k in OURS)) / b.wall_s


def batch_line(b: Batch) -> str:
    ttft = statistics.median(t for t, _ in b.samples) * 1000
    per_1k = {k: b.cpu_s.get(k, 0.0) * 1e6 / b.tokens for k in ("api", "db", "triton")}
    return (f"c={b.concurrency:<3} {b.path:<24} #{b.repeat}: {b.tok_s:7.1f} tok/s, TTFT p50 "
            f"{ttft:6.1f} ms, CPU ms/1k tok api {per_1k['api']:4.0f} db {per_1k['db']:3.0f} "
            f"triton {per_1k['triton']:4.0f}; busy {busy_cores(b):.2f} of {cores()} cores, "
            f"others' load {others_cores(b):.2f} cores")  # fmt: skip


def percentile(values: list[float], q: float) -> float:
    """The q-th quantile (0 < q < 1) with linear interpolation between the closest ranks."""
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


@dataclass
class Summary:
    tok_s: float  # median batch
    per_batch: list[float]
    ttft_p50_ms: float  # over every request of the path's batches
    ttft_p90_ms: float
    cpu_ms_per_1k: dict[str, float]  # api (its whole tree), db, triton, client
    busy: float  # cores the machine kept busy, averaged over the batches' wall time
    others: float  # of which: processes not started by the benchmark


def summarise(batches: list[Batch]) -> Summary:
    ttft = [t * 1000 for b in batches for t, _ in b.samples]
    thousands = sum(b.tokens for b in batches) / 1000
    cpu = {
        k: sum(b.cpu_s.get(k, 0.0) for b in batches) * 1000 / thousands
        for k in ("api", "db", "triton", "client")
    }
    wall = sum(b.wall_s for b in batches)
    busy = sum(busy_cores(b) * b.wall_s for b in batches) / wall
    others = sum(others_cores(b) * b.wall_s for b in batches) / wall
    per_batch = [b.tok_s for b in batches]
    return Summary(statistics.median(per_batch), per_batch, percentile(ttft, 0.5),
                   percentile(ttft, 0.9), cpu, busy, others)  # fmt: skip


Table = dict[tuple[int, str], Summary]


def summaries(batches: list[Batch]) -> Table:
    keys = sorted({(b.concurrency, b.path) for b in batches})
    return {key: summarise([b for b in batches if (b.concurrency, b.path) == key]) for key in keys}


def table(s: Table, concurrency: int, configs: list[Config]) -> list[str]:
    base = s[(concurrency, GRPC)]
    out = [
        f"## Concurrency {concurrency}",
        "",
        "| path | output tok/s (each batch) | × gRPC | TTFT p50 ms | p90 ms | Δ p50 ms | Δ p90 ms "
        "| api CPU ms / 1k tok | PostgreSQL CPU ms / 1k tok | Triton CPU ms / 1k tok "
        f"| busy cores (of {cores()}) | others' cores |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for path in [GRPC, *(c.name for c in configs)]:
        r = s[(concurrency, path)]
        rates = ", ".join(f"{v:.0f}" for v in r.per_batch)
        api = "–" if path == GRPC else f"{r.cpu_ms_per_1k['api']:.0f}"
        db = f"{r.cpu_ms_per_1k['db']:.0f}" if "PostgreSQL" in path else "–"
        d50, d90 = r.ttft_p50_ms - base.ttft_p50_ms, r.ttft_p90_ms - base.ttft_p90_ms
        out.append(
            f"| {path} | {r.tok_s:.0f} ({rates}) | {r.tok_s / base.tok_s:.3f} | "
            f"{r.ttft_p50_ms:.1f} | {r.ttft_p90_ms:.1f} | {d50:+.1f} | {d90:+.1f} | {api} | {db} | "
            f"{r.cpu_ms_per_1k['triton']:.0f} | {r.busy:.2f} | {r.others:.2f} |"
        )
    return [*out, ""]


def header(
    args: argparse.Namespace, batches: list[Batch], elapsed_s: float, others: float, commit: str
) -> list[str]:
    command = " ".join(["scripts/benchmark workers", *args.argv])
    sizes = {b.concurrency: len(b.samples) for b in batches}
    requests = ", ".join(f"{c}: {n}" for c, n in sorted(sizes.items()))
    return [
        "# api workers × database benchmark",
        "",
        f"Produced by `{command}` on {time.strftime('%Y-%m-%d')} at commit `{commit}` in "
        f"{elapsed_s / 60:.1f} min of measuring. Every row comes from the same run. CPU per "
        "token depends on how busy the cores are (a busier process handles more tokens per "
        "wake-up), so compare rows of one run, not numbers across runs: "
        "[benchmark-api-changes.md](benchmark-api-changes.md) compares code versions "
        "interleaved in one run. Where a × gRPC ratio is above 1, the direct path was bound by "
        "this one-process client, which decodes every gRPC response itself (its CPU is in the "
        "table below, *CPU ms / 1k tok (all)*), while the api's paths move that work into the "
        "api's processes.",
        "",
        f"- **Machine**: {_cpu_model()}, {os.cpu_count()} cores ({cores()} usable), Python "
        f"{platform.python_version()}, shared with other engineers: before anything was started "
        f"the machine kept {others:.2f} cores busy; the others' load during each row is its last "
        "column (and was printed beside each batch).",
        f"- **Engine**: `ENGINE=synthetic`, one token every {args.interval * 1000:.0f} ms per "
        f"request ({1 / args.interval:.0f} tok/s per stream at most), `MAX_BATCH_SIZE` = the "
        "largest concurrency, the whole ensemble (preprocessing, engine, postprocessing).",
        f"- **Workload**: one prompt, {args.tokens} output tokens per request, batches of "
        f"concurrency × {args.waves} requests (one wave by default, where "
        "scripts/benchmark api sends two: 7 paths × 3 concurrencies × 3 repeats stay within "
        "about 10 minutes); every path warmed up at each concurrency, then "
        f"the paths in round-robin, a different one first each time, {args.repeats} batches per "
        "path and concurrency, each started once Triton had no request queued (plus 0.5 s for "
        "the api's last writes). Every request's token count is checked.",
        "- **Paths**: gRPC with the api's own client, measured in the same run; the api's "
        "`POST /v1/completions` (streamed, `include_usage`, logging on) on one api per "
        f"configuration (`API_WORKERS` {', '.join(map(str, args.workers))} × "
        f"{', '.join(DATABASES[d] for d in args.databases)}), each with its own database: an "
        "SQLite file, or a database on one throwaway PostgreSQL 15 cluster (Debian's server as "
        "the tests start it: `fsync=off`, on this machine). `MAX_CONCURRENT_REQUESTS` leaves "
        "every worker room for a whole batch. One `httpx.AsyncClient` (HTTP/1.1, keep-alive): "
        "the kernel hands each new connection to one worker, unevenly.",
        "- **Columns**: output tok/s = tokens / wall time of a batch, median batch; TTFT = "
        "request sent → first non-empty text over all requests of the path's batches, Δ against "
        "direct gRPC at the same concurrency; CPU per 1 000 output tokens: the api's whole "
        "process tree (uvicorn's supervisor and every worker), the PostgreSQL server (postmaster "
        "and backends), tritonserver with its backend stubs; busy cores = the whole machine's "
        "busy CPU time (/proc/stat) / wall time, everyone's processes included; others' cores = "
        "the part of it from processes this benchmark did not start.",
        f"- **Requests per batch** (concurrency: requests): {requests}. Every batch is kept in "
        "`.cache/bench-workers-last.json` (not committed); `--report-from` that file redoes "
        "this page without measuring.",
        "",
    ]
