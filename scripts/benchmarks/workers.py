"""Benchmark api workers × database: API_WORKERS 1/2/4 on SQLite and on PostgreSQL, beside gRPC.

In one run, against one tritonserver with the synthetic engine (ENGINE=synthetic: a token every
--interval seconds per request, no model), one throwaway PostgreSQL cluster (Debian's server, as
the tests start it: tests/support/tritonbox_testing/postgres.py) and one api per (workers,
database) configuration, all started before measuring, the same streamed requests go at each
concurrency (16, 64, 128) directly to Triton over gRPC and through each api's
`POST /v1/completions` (logging on). The paths are interleaved (round-robin, a different one
first each time) and repeated; the median batch counts. Each batch starts from an idle engine
(Triton has no request pending) and records the CPU time of tritonserver, of the api's whole
process tree (uvicorn's supervisor and every worker), of the PostgreSQL server and of this
client, and the machine's busy time (/proc/stat), so the others' load is printed beside each
batch. Writes docs/benchmark-workers.md. Usage (from the repo root):

    scripts/benchmark workers [--tokens 128] [--repeats 3]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import httpx
from scripts.benchmarks.api_report import Batch
from scripts.benchmarks.load import One, api_path, batch, grpc_path
from scripts.benchmarks.proc import (
    cpu_by_pid,
    cpu_since,
    machine_cpu_seconds,
    process_group_of,
    process_tree,
    processes_now,
    server_listening_on,
)
from scripts.benchmarks.servers import start_api, start_triton
from scripts.benchmarks.workers_report import GRPC, Config, batch_line
from scripts.benchmarks.workers_targets import report
from tritonbox_testing.postgres import run_postgres

from tritonbox_common.client import TritonLLMClient
from tritonbox_triton.settings import TritonSettings

REPO = Path(__file__).resolve().parents[2]

RAW = REPO / ".cache" / "bench-workers-last.json"
# The options the report reads (kept with the raw batches, so --report-from can redo it).
REPORTED = ("interval", "tokens", "concurrency", "workers", "databases", "waves", "repeats", "argv")


def start_apis(
    stack: contextlib.ExitStack, folder: Path, triton_url: str, args: argparse.Namespace
) -> dict[Config, tuple[str, int]]:
    """One api per (workers, database), each with its own database; URL and supervisor pid."""
    apis = {}
    postgres = stack.enter_context(run_postgres()) if "postgresql" in args.databases else None
    for database in args.databases:
        for workers in args.workers:
            config = Config(workers, database)
            env = {"API_WORKERS": str(workers), "LOG_PREDICTIONS": "true",
                   # Each worker admits MAX_CONCURRENT_REQUESTS / N; the kernel spreads connections
                   # unevenly, so leave every worker room for the whole of the largest batch.
                   "MAX_CONCURRENT_REQUESTS": str(max(args.concurrency) * workers * 2)}  # fmt: skip
            if postgres is not None and database == "postgresql":
                env["DATABASE_URL"] = postgres.create_database()
            print(f"starting {config.name}", file=sys.stderr, flush=True)
            apis[config] = start_api(stack, folder / config.slug, triton_url, env)
    if postgres is not None:
        apis[Config(0, "postgresql server")] = ("", server_listening_on(postgres.port, b"postgres"))
    return apis


async def idle(http: httpx.AsyncClient, metrics_url: str) -> None:
    """Until Triton has no request queued (the batch before has ended: every stream got its final
    response), then a pause for the api's last database writes."""
    for _ in range(100):
        lines = (await http.get(metrics_url)).text.splitlines()
        pending = (v for v in lines if v.startswith("nv_inference_pending_request_count{"))
        if sum(float(line.rsplit(" ", 1)[1]) for line in pending) == 0:
            break
        await asyncio.sleep(0.1)
    await asyncio.sleep(0.5)


async def measure(
    args: argparse.Namespace, triton: TritonSettings, apis: dict[Config, tuple[str, int]]
) -> list[Batch]:
    triton_pids = process_group_of(f"--grpc-port={triton.triton_grpc_port}".encode())
    metrics_url = f"http://127.0.0.1:{triton.triton_metrics_port}/metrics"
    grpc = TritonLLMClient(triton.grpc_url)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    http = httpx.AsyncClient(timeout=600, limits=limits, http2=False, trust_env=False)
    served = {c: v for c, v in apis.items() if c.workers}
    model = (await http.get(f"{next(iter(served.values()))[0]}/v1/models")).json()["data"][0]["id"]
    runs: dict[str, One] = {GRPC: grpc_path(grpc)}
    runs |= {c.name: api_path(http, url, model) for c, (url, _) in served.items()}
    roots = {c.name: pid for c, (_, pid) in served.items()}
    db_root = next((pid for c, (_, pid) in apis.items() if not c.workers), None)
    names = list(runs)

    def processes(path: str) -> dict[str, list[int]]:
        """Our processes now: Triton's, the measured api's tree, PostgreSQL's, every api's."""
        table = processes_now()  # one walk of /proc for every tree
        trees = {name: process_tree(pid, table) for name, pid in roots.items()}
        return {
            "triton": triton_pids, "api": trees.get(path, []),
            "db": process_tree(db_root, table) if db_root else [],
            "all_apis": [pid for tree in trees.values() for pid in tree],
        }  # fmt: skip

    batches: list[Batch] = []
    try:
        for concurrency in args.concurrency:
            for one in runs.values():  # warm-up: connections for this concurrency, every worker
                await batch(one, concurrency, concurrency, 8)
            requests = concurrency * args.waves
            for rep in range(args.repeats):
                for index in range(len(names)):  # round-robin, a different path first each time
                    path = names[(index + rep) % len(names)]
                    await idle(http, metrics_url)
                    # Walked again after the batch: processes started meanwhile count too.
                    before = {k: cpu_by_pid(v) for k, v in processes(path).items()}
                    client_before, machine_before = sum(os.times()[:2]), machine_cpu_seconds()
                    wall, samples = await batch(runs[path], concurrency, requests, args.tokens)
                    # The machine's and the client's clocks first: the same window as `wall`.
                    machine = machine_cpu_seconds() - machine_before
                    client = sum(os.times()[:2]) - client_before
                    cpu = {k: cpu_since(before[k], v) for k, v in processes(path).items()}
                    cpu |= {"client": client, "machine": machine}
                    batches.append(Batch(path, concurrency, rep, wall, samples, cpu))
                    print(batch_line(batches[-1]), file=sys.stderr, flush=True)
    finally:
        await http.aclose()
        await grpc.close()
    return batches


def machine_busy(seconds: float) -> float:
    """Cores the machine keeps busy over `seconds` (before anything is started: others' load)."""
    before = machine_cpu_seconds()
    time.sleep(seconds)
    return (machine_cpu_seconds() - before) / seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--interval", type=float, default=0.02, help="seconds between tokens")
    parser.add_argument("--tokens", type=int, default=128, help="output tokens per request")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[16, 64, 128])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument(
        "--databases", nargs="+", default=["sqlite", "postgresql"], choices=["sqlite", "postgresql"]
    )
    parser.add_argument("--waves", type=int, default=1, help="requests per batch: concurrency ×")
    parser.add_argument("--repeats", type=int, default=3, help="batches per path and concurrency")
    parser.add_argument("--output", type=Path, default=REPO / "docs" / "benchmark-workers.md")
    parser.add_argument("--raw", type=Path, default=RAW, help="every batch measured, as JSON")
    parser.add_argument("--report-from", type=Path, help="no measuring: report a --raw file")
    args = parser.parse_args()
    if args.report_from:
        run = json.loads(args.report_from.read_text())
        batches = [Batch(**b) for b in run.pop("batches")]
        args.__dict__.update(run.pop("args"))
    else:
        args.argv = sys.argv[1:]  # for the report's command line
        run, batches = run_benchmark(args)
        raw = {**run, "args": {k: v for k, v in vars(args).items() if k in REPORTED}}
        args.raw.parent.mkdir(parents=True, exist_ok=True)
        args.raw.write_text(json.dumps({**raw, "batches": [asdict(b) for b in batches]}))
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(report(batches, args, **run))
    print(args.output.read_text())
    return 0


def run_benchmark(args: argparse.Namespace) -> tuple[dict[str, Any], list[Batch]]:
    """Start everything, measure, stop everything: what the report needs besides the batches."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind: stop what was started
    commit = os.popen(f"git -C {REPO} rev-parse --short HEAD").read().strip()
    # The code measured is the working tree's: say so where it differs from the commit.
    changed = os.popen(f"git -C {REPO} status --porcelain -- api common triton").read().split()
    if changed:
        commit += f"` plus uncommitted changes to `{', '.join(changed[1::2])}"
    others_before = machine_busy(5)
    print(f"before starting: the machine kept {others_before:.2f} cores busy", file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="bench-workers-") as tmp, contextlib.ExitStack() as st:
        folder = Path(tmp)
        # The batch must hold every stream of the largest concurrency, or Triton queues some.
        settings = start_triton(st, folder, args.interval, min(256, max(args.concurrency)))
        apis = start_apis(st, folder, settings.grpc_url, args)
        started = time.monotonic()
        batches = asyncio.run(measure(args, settings, apis))
        elapsed = time.monotonic() - started
    return {"elapsed_s": elapsed, "others": others_before, "commit": commit}, batches
