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

    PYTHONSAFEPATH=1 .venv/bin/python scripts/bench_api.py [--interval 0.02] [--tokens 128]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx

from tritonbox_api.settings import ApiSettings
from tritonbox_common.client import GenerationRequest, TritonLLMClient
from tritonbox_triton.render import render_repository
from tritonbox_triton.server import TritonServer
from tritonbox_triton.settings import TritonSettings

REPO = Path(__file__).resolve().parent.parent
# The helper module as `scripts.…` (as mypy names it); the repo root only for this import, since
# its `triton/` folder would pass for the `triton` package (why PYTHONSAFEPATH=1).
sys.path.append(str(REPO))
from scripts.bench_api_support import (  # noqa: E402
    PATHS,
    Batch,
    cpu_seconds,
    machine_cpu_seconds,
    process_group_of,
    report,
)

sys.path.remove(str(REPO))
API_EXECUTABLE = Path(sys.executable).parent / "tritonbox-api"
PROMPT = "Write a short story about a fox and a dog who become friends."
# What the api sends for a request with default parameters (its seed is random; the synthetic
# engine ignores sampling anyway): the direct paths send the same, so Triton's work is the same.
SAMPLING: dict[str, float | int | bool] = {
    "temperature": 0.7, "top_p": 0.95, "top_k": 0, "repetition_penalty": 1.0,
    "presence_penalty": 0.0, "frequency_penalty": 0.0, "min_tokens": 0, "beam_width": 1, "seed": 1,
}  # fmt: skip
Sample = tuple[float, int]  # (TTFT in seconds, output tokens) of one request
One = Callable[[int], Awaitable[Sample]]  # runs one request of n tokens


def free_ports(count: int) -> list[int]:
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in sockets]


def start_triton(stack: contextlib.ExitStack, folder: Path, interval: float) -> TritonSettings:
    http, grpc, metrics = free_ports(3)
    for name in TritonSettings.model_fields:  # a developer's exported settings must not leak in
        os.environ.pop(name.upper(), None)
    factory: Any = TritonSettings  # `_env_file=None`: ignore the repo's .env
    settings: TritonSettings = factory(
        _env_file=None, engine="synthetic", synthetic_token_interval_s=interval,
        cache_dir=REPO / ".cache", model_repository=folder / "model_repository",
        max_input_len=512, max_output_len=1024, max_batch_size=64,
        triton_http_port=http, triton_grpc_port=grpc, triton_metrics_port=metrics,
    )  # fmt: skip
    render_repository(settings)
    server = TritonServer(settings, log_path=folder / "tritonserver.log")
    stack.callback(server.stop)
    server.start()
    server.wait_ready(settings.triton_ready_timeout_s)
    return settings


def start_api(
    stack: contextlib.ExitStack, folder: Path, triton_url: str, *, log: bool, profile: Path | None
) -> tuple[str, int]:
    """An api process on a free port with its own database; its URL and pid once ready."""
    folder.mkdir(parents=True)
    port = free_ports(1)[0]
    url = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if k.lower() not in ApiSettings.model_fields}
    env |= {
        "PYTHONSAFEPATH": "1", "TRITON_URL": triton_url, "API_PORT": str(port),
        "PUBLIC_URL": url, "DATABASE_PATH": str(folder / "predictions.db"),
        "LOG_PREDICTIONS": str(log).lower(), "MAX_CONCURRENT_REQUESTS": "256",
    }  # fmt: skip
    command = [str(API_EXECUTABLE), "serve", "--env-file", "/nonexistent/.env"]
    if profile is not None:  # the event loop runs on the main thread: cProfile sees the hot path
        output = profile / f"api-log-{'on' if log else 'off'}.pstats"
        command = [sys.executable, "-m", "cProfile", "-o", str(output), *command]
    with (folder / "api.log").open("wb") as out:
        process = subprocess.Popen(
            command, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=folder
        )

    def stop() -> None:
        if process.poll() is None:
            # uvicorn re-raises the signal once shut down: SIGINT ends in KeyboardInterrupt, which
            # still lets cProfile write its file (SIGTERM would not).
            process.send_signal(signal.SIGINT)
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    stack.callback(stop)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and process.poll() is None:
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(f"{url}/readyz", timeout=5, trust_env=False).status_code == 200:
                return url, process.pid
        time.sleep(0.3)
    raise RuntimeError(f"the api did not start:\n{(folder / 'api.log').read_text()[-3000:]}")


async def sse(http: httpx.AsyncClient, url: str, body: dict[str, Any]) -> list[Any]:
    """POST `body`; [(arrival time, data), ...] of the SSE stream's data lines, then [DONE] ends."""
    events = []
    async with http.stream("POST", url, json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                events.append((time.perf_counter(), json.loads(line[6:])))
    return events


def paths(grpc: TritonLLMClient, http: httpx.AsyncClient, urls: dict[str, str]) -> dict[str, One]:
    async def direct(tokens: int) -> Sample:
        started, ttft, count = time.perf_counter(), 0.0, 0
        async for chunk in grpc.stream(GenerationRequest(PROMPT, tokens, sampling=SAMPLING)):
            if chunk.ids and not count:
                ttft = time.perf_counter() - started
            count += len(chunk.ids)
        return ttft, count

    async def triton_http(tokens: int) -> Sample:
        body = {"text_input": PROMPT, "max_tokens": tokens, "stream": True, **SAMPLING}
        url = f"{urls['triton']}/v2/models/ensemble/generate_stream"
        started = time.perf_counter()
        events = await sse(http, url, body)
        texts = [(at, e) for at, e in events if e.get("text_output")]
        return texts[0][0] - started, sum(int(e["sequence_length"]) for _, e in events)

    def api(base: str) -> One:
        async def one(tokens: int) -> Sample:
            body = {"model": urls["model"], "prompt": PROMPT, "max_tokens": tokens, "stream": True,
                    "stream_options": {"include_usage": True}}  # fmt: skip
            started = time.perf_counter()
            events = await sse(http, f"{base}/v1/completions", body)
            if any("error" in e for _, e in events):
                raise RuntimeError(f"the api failed a request: {events[-1][1]}")
            first = next(at for at, e in events if e["choices"] and e["choices"][0]["text"])
            return first - started, int(events[-1][1]["usage"]["completion_tokens"])

        return one

    return dict(zip(PATHS, (direct, triton_http, api(urls["on"]), api(urls["off"])), strict=True))


async def batch(
    one: One, concurrency: int, requests: int, tokens: int
) -> tuple[float, list[Sample]]:
    gate = asyncio.Semaphore(concurrency)

    async def gated() -> Sample:
        async with gate:
            return await one(tokens)

    started = time.perf_counter()
    samples = await asyncio.gather(*(gated() for _ in range(requests)))
    wall = time.perf_counter() - started
    if any(count != tokens for _, count in samples):
        raise RuntimeError(f"expected {tokens} tokens per request, got {[c for _, c in samples]}")
    return wall, samples


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
                    cpu = {k: cpu_seconds(v) - before[k] for k, v in processes.items()}
                    cpu["client"] = sum(os.times()[:2]) - client_before
                    cpu["machine"] = machine_cpu_seconds() - machine_before
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
            urls[name], pid = start_api(
                stack, folder / f"api-{name}", settings.grpc_url, log=log, profile=args.profile
            )
            pids[path] = [pid]
        started = time.monotonic()
        batches = asyncio.run(measure(args, urls, pids))
        elapsed = time.monotonic() - started
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(report(batches, args, elapsed, (load_before[0], os.getloadavg()[0])))
    print(args.output.read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
