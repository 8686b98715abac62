"""The open loop's client: mixed requests streamed through an OpenAI-compatible
`POST /v1/completions`, each sent at its Poisson arrival time whatever the server's backlog;
and the server's capacity on such requests, measured first, that the rates are fractions of.

Every request asks for exactly its output length (`max_tokens` = `min_tokens`, `ignore_eos`),
greedy; its prompt and output token counts are checked against the server's usage chunk, and a
run with any count off is refused.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import httpx
from scripts.benchmarks.load import sse
from scripts.benchmarks.mixed_workload import MixedRequest, mean_output
from scripts.benchmarks.proc import OthersLoad

SAMPLING = {"temperature": 0.0, "seed": 1}


@dataclass(frozen=True)
class Outcome:
    sent: float  # time.perf_counter() when it was sent
    ttft: float
    e2e: float
    tokens: int  # output tokens, as the usage chunk counts them
    prompt_tokens: int


Send = Callable[[MixedRequest], Awaitable[Outcome]]


@dataclass(frozen=True)
class OpenRun:
    label: str  # which rate, in words: "80% of its capacity"
    rate: float  # requests/s offered
    wall: float  # from the first request sent to the last one's end
    outcomes: list[Outcome]
    others: float  # cores the rest of the machine used meanwhile

    @property
    def tokens_per_s(self) -> float:
        return sum(o.tokens for o in self.outcomes) / self.wall


@dataclass(frozen=True)
class Capacity:
    streams: int
    tokens_per_s: float  # while every stream was busy
    requests_per_s: float  # tokens_per_s over the requests' mean output length
    outcomes: list[Outcome]


def completions(http: httpx.AsyncClient, base: str, model: str) -> Send:
    """One request streamed through `base`/v1/completions."""

    async def send(request: MixedRequest) -> Outcome:
        body = {
            "model": model, "prompt": request.prompt, "max_tokens": request.output_tokens,
            "min_tokens": request.output_tokens, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}, **SAMPLING,
        }  # fmt: skip
        sent = time.perf_counter()
        events = await sse(http, f"{base}/v1/completions", body)
        ended = time.perf_counter()
        if any("error" in e for _, e in events):
            raise RuntimeError(f"{base} failed a request: {events[-1][1]}")
        chunks = [at for at, e in events if e.get("choices") and e["choices"][0]["text"]]
        usage = events[-1][1]["usage"]
        return Outcome(
            sent, chunks[0] - sent, ended - sent,
            int(usage["completion_tokens"]), int(usage["prompt_tokens"]),
        )  # fmt: skip

    return send


def check(name: str, requests: Sequence[MixedRequest], outcomes: Sequence[Outcome]) -> None:
    """Every request got exactly its output length, and its prompt was counted as ours."""
    wrong = [
        f"#{i}: {o.prompt_tokens}/{r.prompt_tokens} prompt, {o.tokens}/{r.output_tokens} output"
        for i, (r, o) in enumerate(zip(requests, outcomes, strict=True))
        if o.tokens != r.output_tokens or o.prompt_tokens != r.prompt_tokens
    ]
    if wrong:
        raise RuntimeError(f"{name}: {len(wrong)} requests off their lengths: {wrong[:5]}")


async def open_loop(
    name: str,
    send: Send,
    requests: Sequence[MixedRequest],
    rate: float,
    label: str,
    pids: list[int],
) -> OpenRun:
    """Each request sent at its arrival / `rate` seconds after the start, none waiting for
    another; `pids`: the server's processes, whose CPU is not counted as the others' load."""

    async def at_arrival(request: MixedRequest) -> Outcome:
        await asyncio.sleep(max(0.0, started + request.arrival / rate - time.perf_counter()))
        return await send(request)

    others, started = OthersLoad(pids), time.perf_counter()
    outcomes = await asyncio.gather(*(at_arrival(r) for r in requests))
    wall = time.perf_counter() - started
    check(name, requests, outcomes)
    return OpenRun(label, rate, wall, list(outcomes), others.cores(wall))


def pct(values: Sequence[float], q: int) -> float:
    """The q-th percentile, linearly interpolated between the two nearest values."""
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    return statistics.quantiles(ordered, n=100, method="inclusive")[q - 1]


def busy_tokens_per_s(outcomes: Sequence[Outcome]) -> float:
    """Output tok/s until the last request was sent, while every stream still had one: a
    request's first token counted when it came, the rest spread evenly over its decode (the
    tail, when streams fall idle one by one, would understate what the server sustains)."""
    start = min(o.sent for o in outcomes)
    until = max(o.sent for o in outcomes)
    tokens = 0.0
    for o in outcomes:
        first = o.sent + o.ttft
        if first <= until:
            decode = max(o.e2e - o.ttft, 1e-9)
            tokens += 1 + (o.tokens - 1) * min(1.0, (until - first) / decode)
    return tokens / (until - start)


async def capacity(
    name: str, send: Send, requests: Sequence[MixedRequest], streams: int
) -> Capacity:
    """The server saturated: the requests `streams` at a time (its most sequences), each sent
    as soon as one ends; its tok/s while every stream was busy, and in requests/s."""
    if len(requests) < 2 * streams:
        raise ValueError(f"{len(requests)} requests cannot keep {streams} streams busy")
    gate = asyncio.Semaphore(streams)

    async def gated(request: MixedRequest) -> Outcome:
        async with gate:
            return await send(request)

    outcomes = await asyncio.gather(*(gated(r) for r in requests))
    check(name, requests, outcomes)
    tokens_per_s = busy_tokens_per_s(outcomes)
    return Capacity(streams, tokens_per_s, tokens_per_s / mean_output(requests), list(outcomes))
