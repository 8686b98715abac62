"""Traffic for a stack under test: a long streamed prediction read on a thread (the native
stack's tests/triton/server/test_stop_clean.py, the api workers' tests and the compose checks),
a warm-up answer, and a watch on the engine's active requests."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Mapping
from typing import Any

import httpx

ACTIVE = re.compile(r'^nv_trt_llm_request_metrics\{[^}]*request_type="active"[^}]*\} (\S+)$', re.M)


class Generation:
    """A long streamed prediction through the api (POST /v1/predictions), read on a thread until
    its stream ends however it ends: its id, its token chunks, its events' names, its first
    lines (for messages) and the HTTP error that ended it, if one did.

    `prediction_input`: the prediction's input (a long story of `max_tokens` unless given);
    `headers`: the request's (an api key); `timeout_s`: httpx's time-out for the stream."""

    def __init__(
        self,
        api: str,
        max_tokens: int = 480,
        *,
        prediction_input: Mapping[str, object] | None = None,
        headers: Mapping[str, str] | None = None,
        timeout_s: float = 120,
    ) -> None:
        self.id = ""
        self.chunks = 0
        self.events: list[str] = []
        self.lines: list[str] = []
        self.started = threading.Event()
        self.error: BaseException | None = None
        if prediction_input is None:
            prediction_input = {
                "prompt": "Tell a very long story about the sea.",
                "max_tokens": max_tokens,
                "min_tokens": max_tokens,  # no early end of sequence
            }
        body = {"input": dict(prediction_input), "stream": True}
        request = {"json": body, "headers": dict(headers or {}), "timeout": timeout_s}
        self._thread = threading.Thread(target=self._read, args=(api, request), daemon=True)
        self._thread.start()

    def _read(self, api: str, request: dict[str, Any]) -> None:
        try:
            with httpx.stream("POST", f"{api}/v1/predictions", **request) as r:
                self.id = r.headers.get("x-prediction-id", "")
                for line in r.iter_lines():
                    if len(self.lines) < 20:
                        self.lines.append(f"{r.status_code} {line}")
                    if line.startswith("event:"):
                        self.events.append(line.split(":", 1)[1].strip())
                    if line.startswith("data: ") and not line.startswith("data: {"):
                        self.chunks += 1
                        if self.chunks >= 2:  # generating, not only admitted
                            self.started.set()
        except httpx.HTTPError as error:
            self.error = error
        finally:
            self.started.set()

    def wait_started(self, timeout_s: float = 120) -> None:
        assert self.started.wait(timeout_s), "the generation did not start"
        assert self.id and self.chunks >= 2, (self.id, self.lines, self.error)

    def join(self, timeout_s: float) -> bool:
        """Waits up to `timeout_s` for the stream to end; True when it has."""
        self._thread.join(timeout_s)
        return not self._thread.is_alive()


def warm(api: str) -> None:
    """One short greedy answer: the engine is loaded and has run a request."""
    body = {"prompt": "The capital of France is", "max_tokens": 2, "temperature": 0}
    answer = httpx.post(f"{api}/predict", json=body | {"stream": False}, timeout=300).json()
    assert answer["status"] == "succeeded", answer


class ActiveRequests:
    """Polls Triton's count of the engine's active requests until Triton no longer answers:
    the last value seen is the engine's state just before Triton went away."""

    def __init__(self, metrics_url: str) -> None:
        self.last: float | None = None
        self._thread = threading.Thread(target=self._poll, args=(metrics_url,), daemon=True)
        self._thread.start()

    def _poll(self, url: str) -> None:
        while True:
            try:
                found = ACTIVE.search(httpx.get(url, timeout=1).text)
            except httpx.HTTPError:
                return
            if found:
                self.last = float(found.group(1))
            time.sleep(0.05)

    def settle(self, timeout_s: float) -> float | None:
        self._thread.join(timeout_s)
        return self.last
