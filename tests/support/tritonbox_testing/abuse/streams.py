"""The interactive users: streamed chat completions with short prompts, one after another on
each of a few connections, each timed to its first token and read to `data: [DONE]`.

They run on an event loop of their own thread in the measuring process; the hostile requests
come from another process (scenario.py), so the client's own CPU and GIL do not pass for the
server's delay."""

from __future__ import annotations

import asyncio
import json
import statistics
import threading
import time
from dataclasses import dataclass, field

import httpx

PROMPTS = (
    "What is the capital of France?",
    "Name a colour of the rainbow.",
    "Say hello in Spanish.",
    "What do bees make?",
)
MAX_TOKENS = 8


@dataclass(frozen=True)
class Sample:
    """One interactive request: when it was sent (time.monotonic()), its time to first token,
    and how it ended."""

    prompt: int
    start: float
    ttft_s: float | None  # None: no token came
    text: str
    finish_reason: str | None
    error: str | None  # an HTTP status, an error chunk or a missing [DONE]


def p50(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


async def _one(client: httpx.AsyncClient, model: str, index: int) -> Sample:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": PROMPTS[index]}],
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "stream": True,
    }
    start = time.monotonic()
    ttft: float | None = None
    text, finish, error, done = "", None, None, False
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        if response.status_code != 200:
            await response.aread()
            return Sample(index, start, None, "", None, f"{response.status_code} {response.text}")
        async for line in response.aiter_lines():
            if not line.startswith("data: "):
                continue
            data = line.removeprefix("data: ")
            if data == "[DONE]":
                done = True
                break
            chunk = json.loads(data)
            if "error" in chunk:
                error = json.dumps(chunk["error"])
                continue
            for choice in chunk.get("choices", []):
                piece = choice.get("delta", {}).get("content") or ""
                if piece and ttft is None:
                    ttft = time.monotonic() - start
                text += piece
                finish = choice.get("finish_reason") or finish
    if not done and error is None:
        error = "the stream ended without data: [DONE]"
    return Sample(index, start, ttft, text, finish, error)


@dataclass
class InteractiveStreams:
    """`len(PROMPTS)` connections, each sending its prompt again as soon as its answer ended."""

    url: str
    key: str
    model: str
    samples: list[Sample] = field(default_factory=list)

    async def _loop(self, index: int, stop: asyncio.Event) -> None:
        headers = {"Authorization": f"Bearer {self.key}"}
        async with httpx.AsyncClient(base_url=self.url, headers=headers, timeout=120) as client:
            while not stop.is_set():
                try:
                    self.samples.append(await _one(client, self.model, index))
                except httpx.HTTPError as failure:  # the server stopped serving: a failed sample
                    now = time.monotonic()
                    self.samples.append(Sample(index, now, None, "", None, repr(failure)))

    async def _main(self) -> None:
        self._stop = asyncio.Event()
        self._event_loop = asyncio.get_running_loop()
        self._ready.set()
        await asyncio.gather(*(self._loop(i, self._stop) for i in range(len(PROMPTS))))

    def __enter__(self) -> InteractiveStreams:
        self._ready = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)
        self._thread.start()
        self._ready.wait()
        return self

    def __exit__(self, *exc: object) -> None:
        """Ask every connection to stop after its current answer, and wait for them."""
        self._event_loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(150)

    def between(self, start: float, end: float) -> list[Sample]:
        """The samples sent between `start` and `end` (time.monotonic())."""
        return [s for s in list(self.samples) if start <= s.start < end]

    def wait_for(self, count: int, timeout_s: float = 120) -> None:
        """Until every connection has answered `count` times."""
        deadline = time.monotonic() + timeout_s
        while any(sum(s.prompt == i for s in self.samples) < count for i in range(len(PROMPTS))):
            if time.monotonic() > deadline:
                raise TimeoutError(f"the interactive streams answered {len(self.samples)} times")
            time.sleep(0.05)
