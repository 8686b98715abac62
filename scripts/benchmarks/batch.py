"""Benchmark batch jobs beside live traffic: a batch's throughput alone against the engine's
closed loop at full batch, and live time to first token on an idle stack against beside a
running batch.

One run, one stack (tritonserver with the cpu engine and the default model, MAX_BATCH_SIZE
streams; the api in front of it, its BATCH_* settings at their defaults), in turns:
- throughput: MAX_BATCH_SIZE streamed `/v1/chat/completions` requests at a time (a closed loop),
  and a batch of as many lines uploaded and run through the Batch API, alternating;
- TTFT: streamed chat requests at concurrency 1 and 4 on the idle stack, and beside a batch of
  1,000 short lines created for the turn (running at full before the live requests start,
  cancelled after them), alternating, a different one first each turn.
Every request and line asks for exactly --tokens output tokens (`min_tokens` + `ignore_eos`;
counted), greedy, with one of a few questions of similar length. Beside each turn: the load
average and the CPU the rest of the machine used meanwhile. Writes docs/benchmark-batch.md and
its plot. Usage (from the repo root):

    scripts/benchmark batch [--tokens 64] [--turns 3]
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
from pathlib import Path
from typing import Any

import httpx
from scripts.benchmarks.batch_report import Turn, beside_kind, report
from scripts.benchmarks.load import sse
from scripts.benchmarks.proc import OthersLoad, process_group_of
from scripts.benchmarks.servers import start_api, start_cpu_engine

from tritonbox_api.service.batch_room import LIVE_QUIET_S
from tritonbox_api.settings import ApiSettings

REPO = Path(__file__).resolve().parents[2]
QUESTIONS = [
    "Summarise in a few sentences why the printing press changed how people learned.",
    "Explain in a few sentences how a bicycle stays upright while it is moving forward.",
    "Describe in a few sentences what a city needs to do to keep its drinking water clean.",
    "Write a few sentences for a museum label about a bronze statue of a running horse.",
    "Explain in a few sentences why the sky looks blue in the day and red in the evening.",
    "Describe in a few sentences how bread dough rises and what yeast does inside it.",
]
ENDED = {"completed", "failed", "expired", "cancelled"}
DEFAULT_KEPT = ApiSettings.model_fields["batch_requests_beside_live"].default


def body(model: str, index: int, tokens: int, **extra: Any) -> dict[str, Any]:
    return {
        "model": model, "max_tokens": tokens, "min_tokens": tokens, "ignore_eos": True,
        "temperature": 0.0, "seed": 1, **extra,
        "messages": [{"role": "user", "content": QUESTIONS[index % len(QUESTIONS)]}],
    }  # fmt: skip


class Bench:
    def __init__(self, http: httpx.AsyncClient, url: str, model: str, pids: list[int]) -> None:
        self.http, self.url, self.model, self.pids = http, url, model, pids

    async def stream(self, index: int, tokens: int) -> float:
        """One streamed chat request; its TTFT (to the first non-empty content)."""
        asked = body(self.model, index, tokens, stream=True, stream_options={"include_usage": True})
        started = time.perf_counter()
        events = await sse(self.http, f"{self.url}/v1/chat/completions", asked)
        first = next(
            at for at, e in events if e.get("choices") and e["choices"][0]["delta"].get("content")
        )
        count = events[-1][1]["usage"]["completion_tokens"]
        if count != tokens:
            raise RuntimeError(f"asked {tokens} tokens, got {count}")
        return first - started

    async def closed_loop(self, concurrency: int, requests: int, tokens: int) -> list[float]:
        gate = asyncio.Semaphore(concurrency)

        async def gated(index: int) -> float:
            async with gate:
                return await self.stream(index, tokens)

        return list(await asyncio.gather(*(gated(i) for i in range(requests))))

    async def create_batch(self, lines: int, tokens: int) -> str:
        rows = [
            {"custom_id": f"l{i}", "method": "POST", "url": "/v1/chat/completions",
             "body": body(self.model, i, tokens)}
            for i in range(lines)
        ]  # fmt: skip
        data = "".join(json.dumps(row) + "\n" for row in rows).encode()
        upload = await self.http.post(
            f"{self.url}/v1/files", files={"file": ("in.jsonl", data)}, data={"purpose": "batch"}
        )
        upload.raise_for_status()
        created = await self.http.post(
            f"{self.url}/v1/batches",
            json={"input_file_id": upload.json()["id"], "endpoint": "/v1/chat/completions",
                  "completion_window": "1h"},
        )  # fmt: skip
        created.raise_for_status()
        return str(created.json()["id"])

    async def batch_state(self, batch_id: str) -> dict[str, Any]:
        answer = await self.http.get(f"{self.url}/v1/batches/{batch_id}")
        answer.raise_for_status()
        return dict(answer.json())

    async def until(self, batch_id: str, done: Any, every_s: float = 0.05) -> dict[str, Any]:
        while not done(state := await self.batch_state(batch_id)):
            await asyncio.sleep(every_s)
        return state

    async def output_tokens(self, file_id: str) -> list[int]:
        answer = await self.http.get(f"{self.url}/v1/files/{file_id}/content")
        answer.raise_for_status()
        lines = [json.loads(x) for x in answer.text.splitlines()]
        return [x["response"]["body"]["usage"]["completion_tokens"] for x in lines]


async def timed(bench: Bench, turn: Turn, work: Any) -> Turn:
    """Run `work` (a coroutine) and fill `turn`'s wall time and the machine's other load."""
    turn.load = os.getloadavg()[0]
    others, started = OthersLoad(bench.pids), time.perf_counter()
    await work
    turn.wall = time.perf_counter() - started
    turn.others = others.cores(turn.wall)
    return turn


async def throughput(bench: Bench, args: argparse.Namespace, rep: int) -> list[Turn]:
    size, tokens = args.batch_size, args.tokens
    count = size * args.waves

    async def loop(turn: Turn) -> None:
        turn.ttfts = await bench.closed_loop(size, count, tokens)
        turn.requests, turn.tokens = count, count * tokens

    async def alone(turn: Turn) -> None:
        batch_id = await bench.create_batch(count, tokens)
        state = await bench.until(batch_id, lambda s: s["status"] in ENDED)
        if state["status"] != "completed" or state["request_counts"]["completed"] != count:
            raise RuntimeError(f"the batch ended {state['status']}: {state['request_counts']}")
        produced = await bench.output_tokens(state["output_file_id"])
        if set(produced) != {tokens}:
            raise RuntimeError(f"asked {tokens} tokens a line, got {sorted(set(produced))}")
        turn.requests, turn.tokens = count, sum(produced)

    order = ["closed loop", "batch alone"][:: 1 if rep % 2 == 0 else -1]
    turns = []
    for kind in order:
        turn = Turn(kind, size, rep)
        if kind == "batch alone":  # alone: no live request within the runner's hold-back
            await asyncio.sleep(LIVE_QUIET_S + 0.5)
        turns.append(await timed(bench, turn, (loop if kind == "closed loop" else alone)(turn)))
        print(turn.line(), file=sys.stderr, flush=True)
    return turns


async def beside(bench: Bench, args: argparse.Namespace, turn: Turn, live: Any) -> None:
    """`live` (a coroutine) beside a batch of --batch-lines lines created for it, once the
    engine is full of lines; the lines completed meanwhile; the batch cancelled after."""
    batch_id = await bench.create_batch(args.batch_lines, args.line_tokens)
    # Running at full: a first wave of lines done, the next ones started.
    done = lambda s: s["request_counts"]["completed"] >= args.batch_size  # noqa: E731
    before = (await bench.until(batch_id, done))["request_counts"]["completed"]

    async def work() -> None:
        turn.ttfts = await live

    await timed(bench, turn, work())
    after = await bench.batch_state(batch_id)
    turn.lines, turn.line_tokens = after["request_counts"]["completed"] - before, args.line_tokens
    await bench.http.post(f"{bench.url}/v1/batches/{batch_id}/cancel")
    ended = await bench.until(batch_id, lambda s: s["status"] in ENDED, 0.2)
    if ended["status"] != "cancelled":
        raise RuntimeError(f"the {args.batch_lines}-line batch ended {ended['status']} in a turn")
    await asyncio.sleep(1.0)  # its stopped lines leave the engine


async def interactive(benches: dict[str, Bench], args: argparse.Namespace, rep: int) -> list[Turn]:
    turns = []
    for concurrency in args.concurrency:
        requests = max(args.min_requests, concurrency * args.waves)
        kinds = list(benches)
        shift = (rep + concurrency) % len(kinds)
        for kind in kinds[shift:] + kinds[:shift]:
            bench, turn = benches[kind], Turn(kind, concurrency, rep)
            live = bench.closed_loop(concurrency, requests, args.interactive_tokens)
            turn.requests, turn.tokens = requests, requests * args.interactive_tokens
            if kind == "idle":

                async def work(turn: Turn = turn, live: Any = live) -> None:
                    turn.ttfts = await live

                await timed(bench, turn, work())
            else:
                await beside(bench, args, turn, live)
            print(turn.line(), file=sys.stderr, flush=True)
            turns.append(turn)
    return turns


async def measure(args: argparse.Namespace, urls: dict[int, str], pids: list[int]) -> list[Turn]:
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(timeout=600, limits=limits, trust_env=False) as http:
        first = next(iter(urls.values()))
        model = (await http.get(f"{first}/v1/models")).json()["data"][0]["id"]
        benches = {"idle": Bench(http, first, model, pids)}
        benches |= {beside_kind(k): Bench(http, url, model, pids) for k, url in urls.items()}
        for bench in benches.values():  # warm-up: connections, the engine's first steps
            await bench.closed_loop(args.batch_size, args.batch_size, 8)
            done = await bench.create_batch(args.batch_size, 8)
            await bench.until(done, lambda s: s["status"] in ENDED)
        turns: list[Turn] = []
        for rep in range(args.turns):
            turns += await throughput(benches["idle"], args, rep)
        for rep in range(args.turns):
            turns += await interactive(benches, args, rep)
        return turns


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=16, help="MAX_BATCH_SIZE")
    parser.add_argument("--tokens", type=int, default=64, help="output tokens, throughput turns")
    parser.add_argument("--waves", type=int, default=4, help="requests or lines: streams ×")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--interactive-tokens", type=int, default=32)
    parser.add_argument("--min-requests", type=int, default=24, help="live requests a turn")
    parser.add_argument("--batch-lines", type=int, default=1000)
    parser.add_argument("--line-tokens", type=int, default=16, help="output tokens of its lines")
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument(
        "--also-beside-live", type=int, nargs="*", default=[4],
        help="beside-batch turns also on an api with BATCH_REQUESTS_BESIDE_LIVE at these",
    )  # fmt: skip
    parser.add_argument("--output", type=Path, default=REPO / "docs" / "benchmark-batch.md")
    args = parser.parse_args()
    args.settings = {
        name.upper(): ApiSettings.model_fields[name].default
        for name in ApiSettings.model_fields
        if name.startswith("batch_")
    }
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind: stop what was started
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench-batch-") as tmp, contextlib.ExitStack() as stack:
        folder = Path(tmp)
        settings = start_cpu_engine(stack, folder, args.batch_size)
        pids = process_group_of(f"--grpc-port={settings.triton_grpc_port}".encode())
        urls = {}
        for kept in [DEFAULT_KEPT, *args.also_beside_live]:
            env = {"MAX_CONCURRENT_REQUESTS": "256", "BATCH_REQUESTS_BESIDE_LIVE": str(kept)}
            urls[kept], pid = start_api(stack, folder / f"api-{kept}", settings.grpc_url, env)
            pids.append(pid)
        turns = asyncio.run(measure(args, urls, pids))
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(report(turns, args, time.monotonic() - started))
    print(args.output.read_text())
    return 0
