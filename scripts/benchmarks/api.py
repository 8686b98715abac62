"""Benchmark what the api proxy costs: one streaming workload sent to Triton and through the api.

In one run, against one tritonserver with the synthetic engine (ENGINE=synthetic: no model, a
token every --interval seconds per request, so the load is not bounded by a real model), at each
concurrency (1, 16, 64) the same requests go
- directly to Triton over gRPC (`tritonbox_common.client`, the api's own client),
- to Triton's HTTP `POST /v2/models/ensemble/generate_stream` (SSE, one event per token),
- through the api's `POST /v1/completions` (OpenAI SSE, `include_usage`), logging on,
- through a second api process started with LOG_PREDICTIONS=false.
Per batch: output tokens/s (tokens / wall time), time to first token (TTFT: to the first non-empty
text) and the CPU time each process spent. Paths are interleaved and repeated (the median batch
counts) because the machine is shared. Writes docs/benchmark-api.md. Usage (from the repo root):

    scripts/benchmark api [--interval 0.02] [--tokens 128]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

import httpx
from scripts.benchmarks.api_report import PATHS, Batch, report
from scripts.benchmarks.load import (
    PROMPT,
    SAMPLING,
    One,
    Sample,
    api_path,
    batch,
    grpc_path,
    sse,
)
from scripts.benchmarks.proc import cpu_seconds, machine_cpu_seconds, process_group_of
from scripts.benchmarks.servers import start_api, start_triton

from tritonbox_common.client import TritonLLMClient

REPO = Path(__file__).resolve().parents[2]


def paths(grpc: TritonLLMClient, http: httpx.AsyncClient, urls: dict[str, str]) -> dict[str, One]:
    async def triton_http(tokens: int) -> Sample:
        body = {"text_input": PROMPT, "max_tokens": tokens, "stream": True, **SAMPLING}
        url = f"{urls['triton']}/v2/models/ensemble/generate_stream"
        started = time.perf_counter()
        events = await sse(http, url, body)
        texts = [(at, e) for at, e in events if e.get("text_output")]
        return texts[0][0] - started, sum(int(e["sequence_length"]) for _, e in events)

    api_on, api_off = (api_path(http, urls[k], urls["model"]) for k in ("on", "off"))
    return dict(zip(PATHS, (grpc_path(grpc), triton_http, api_on, api_off), strict=True))


async def measure(
    args: argparse.Namespace, urls: dict[str, str], pids: dict[str, list[int]]
) -> list[Batch]:
    grpc = TritonLLMClient(urls["grpc"])
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    http = httpx.AsyncClient(timeout=300, limits=limits, http2=False, trust_env=False)
    models = (await http.get(f"{urls['on']}/v1/models")).json()
    urls["model"] = models["data"][0]["id"]
    runs = paths(grpc, http, urls)
    batches: list[Batch] = []
    try:
        for concurrency in args.concurrency:
            for one in runs.values():  # warm-up: connections for this concurrency, caches
                await batch(one, concurrency, concurrency, 8)
            requests = max(args.min_requests, concurrency * args.waves)
            for rep in range(args.repeats):
                for index in range(len(PATHS)):  # round-robin, a different path first each time
                    path = PATHS[(index + rep) % len(PATHS)]
                    processes = {"triton": pids["triton"], "api": pids.get(path, [])}
                    before = {k: cpu_seconds(v) for k, v in processes.items()}
                    client_before, machine_before = sum(os.times()[:2]), machine_cpu_seconds()
                    wall, samples = await batch(runs[path], concurrency, requests, args.tokens)
                    machine = machine_cpu_seconds() - machine_before  # the same window as `wall`
                    cpu = {k: cpu_seconds(v) - before[k] for k, v in processes.items()}
                    cpu["client"] = sum(os.times()[:2]) - client_before
                    cpu["machine"] = machine
                    batches.append(Batch(path, concurrency, rep, wall, samples, cpu))
                    print(batches[-1].line(), file=sys.stderr, flush=True)
    finally:
        await http.aclose()
        await grpc.close()
    return batches


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--interval", type=float, default=0.02, help="seconds between tokens")
    parser.add_argument("--tokens", type=int, default=128, help="output tokens per request")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--waves", type=int, default=2, help="requests per batch: concurrency ×")
    parser.add_argument("--min-requests", type=int, default=4, help="at least this many per batch")
    parser.add_argument("--repeats", type=int, default=3, help="batches per path and concurrency")
    parser.add_argument("--profile", type=Path, help="cProfile both api processes into this folder")
    parser.add_argument("--output", type=Path, default=REPO / "docs" / "benchmark-api.md")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind: stop what was started
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench-api-") as tmp, contextlib.ExitStack() as stack:
        folder = Path(tmp)
        settings = start_triton(stack, folder, args.interval)
        urls = {"grpc": settings.grpc_url, "triton": settings.http_url}
        pids = {"triton": process_group_of(f"--grpc-port={settings.triton_grpc_port}".encode())}
        print(f"tritonserver: {len(pids['triton'])} processes", file=sys.stderr)
        for log, path in ((True, PATHS[2]), (False, PATHS[3])):
            name = "on" if log else "off"
            profile = args.profile / f"api-log-{name}.pstats" if args.profile else None
            env = {"LOG_PREDICTIONS": str(log).lower()}
            urls[name], pid = start_api(
                stack, folder / f"api-{name}", settings.grpc_url, env, profile=profile
            )
            pids[path] = [pid]
        started = time.monotonic()
        batches = asyncio.run(measure(args, urls, pids))
        elapsed = time.monotonic() - started
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(report(batches, args, elapsed, (load_before[0], os.getloadavg()[0])))
    print(args.output.read_text())
    return 0
