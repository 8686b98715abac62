"""The proxy benchmarks' load: one streaming request on a path (direct gRPC, or an SSE endpoint)
timed to its first token, and a closed-loop batch of them at a concurrency."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx

from tritonbox_common.client import GenerationRequest, TritonLLMClient

PROMPT = "Write a short story about a fox and a dog who become friends."
# What the api sends for a request with default parameters (its seed is random; the synthetic
# engine ignores sampling anyway): the direct paths send the same, so Triton's work is the same.
SAMPLING: dict[str, float | int | bool] = {
    "temperature": 0.7, "top_p": 0.95, "top_k": 0, "repetition_penalty": 1.0,
    "presence_penalty": 0.0, "frequency_penalty": 0.0, "min_tokens": 0, "beam_width": 1, "seed": 1,
}  # fmt: skip
Sample = tuple[float, int]  # (TTFT in seconds, output tokens) of one request
One = Callable[[int], Awaitable[Sample]]  # runs one request of n tokens


async def sse(http: httpx.AsyncClient, url: str, body: dict[str, Any]) -> list[Any]:
    """POST `body`; [(arrival time, data), ...] of the SSE stream's data lines, then [DONE] ends."""
    events = []
    async with http.stream("POST", url, json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                events.append((time.perf_counter(), json.loads(line[6:])))
    return events


def grpc_path(
    grpc: TritonLLMClient,
    prompt: str = PROMPT,
    sampling: dict[str, float | int | bool] = SAMPLING,
    *,
    exact_length: bool = False,
) -> One:
    """Straight to Triton with the api's own gRPC client; `exact_length`: every request gets
    exactly the tokens it asks for (min_tokens, and end_id -1 as `ignore_eos` sends)."""

    async def direct(tokens: int) -> Sample:
        asked = {**sampling, "min_tokens": tokens, "end_id": -1} if exact_length else sampling
        started, ttft, count = time.perf_counter(), 0.0, 0
        async for chunk in grpc.stream(GenerationRequest(prompt, tokens, sampling=asked)):
            if chunk.ids and not count:
                ttft = time.perf_counter() - started
            count += len(chunk.ids)
        return ttft, count

    return direct


def api_path(http: httpx.AsyncClient, base: str, model: str) -> One:
    """The api's streamed `POST /v1/completions`, tokens counted by its final usage chunk."""

    async def one(tokens: int) -> Sample:
        body = {"model": model, "prompt": PROMPT, "max_tokens": tokens, "stream": True,
                "stream_options": {"include_usage": True}}  # fmt: skip
        started = time.perf_counter()
        events = await sse(http, f"{base}/v1/completions", body)
        if any("error" in e for _, e in events):
            raise RuntimeError(f"the api failed a request: {events[-1][1]}")
        first = next(at for at, e in events if e["choices"] and e["choices"][0]["text"])
        return first - started, int(events[-1][1]["usage"]["completion_tokens"])

    return one


async def batch(
    one: One, concurrency: int, requests: int, tokens: int
) -> tuple[float, list[Sample]]:
    """`requests` requests, `concurrency` at a time; the wall time and each one's sample."""
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
