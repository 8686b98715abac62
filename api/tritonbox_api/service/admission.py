"""Which predictions run, and whether one more may start: MAX_CONCURRENT_REQUESTS' slots.

A slot is one engine request, so a prediction of `n` choices takes `n` (it is `n` requests in
the engine's batch and queue). Batch lines take none of these: their slots are the batch
runner's (BATCH_CONCURRENT_REQUESTS, service/batch_runner.py), so a running batch never makes a
live request get 429. The runner also reads here whether live requests run or ran lately, and
is told the moment one is admitted (`on_live`), to make room for it in the engine's batch: it
names the lines that stop, and `admit` hands back their running predictions, whose engine
requests are then stopped before the live request is sent (service/predictions.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from tritonbox_api import metrics
from tritonbox_api.protocol.errors import ApiError
from tritonbox_api.service.batch_context import LineContext
from tritonbox_api.service.running import RunningPrediction


class Admission:
    def __init__(self, max_concurrent: int) -> None:
        self.max_concurrent = max_concurrent
        # Every prediction from its start until its producer has cleaned up, batch lines too.
        self.running: dict[str, RunningPrediction] = {}
        self.live_slots = 0  # slots live requests hold now
        self.live_ended_at = float("-inf")  # time.monotonic() when the last live one ended
        # Called as a live request is admitted: the lines that stop to make room for it.
        self.on_live: Callable[[], list[LineContext]] | None = None
        self._batch_lines: dict[str, LineContext] = {}  # prediction id -> the line it runs

    def check(self, slots: int, line: LineContext | None) -> None:
        """429 when `slots` more would take the live engine requests past MAX_CONCURRENT_REQUESTS.
        Alone, a prediction runs whatever its `n` (never more than the routes' limit on `n`):
        else it could never run at all."""
        if line is None and self.live_slots and self.live_slots + slots > self.max_concurrent:
            metrics.REJECTED.labels("overloaded").inc()
            free = max(self.max_concurrent - self.live_slots, 0)
            raise ApiError(
                429,
                f"the api is generating its maximum of {self.max_concurrent} predictions "
                f"(MAX_CONCURRENT_REQUESTS; each choice of `n` takes one): {free} free, this "
                f"request needs {slots}; retry shortly",
                type="rate_limit_error",
                headers={"Retry-After": "1"},
            )

    def admit(
        self, running: RunningPrediction, line: LineContext | None
    ) -> list[RunningPrediction]:
        """Take `running`'s slots (none for a batch line); the producer gives them back. For a
        live request: the running predictions of the lines that stop to make room for it."""
        self.running[running.id] = running
        if line is not None:
            self._batch_lines[running.id] = line
            return []
        self.live_slots += 1 + len(running.extra)
        stopping = {id(each) for each in self.on_live()} if self.on_live is not None else set()
        return [self.running[p] for p, each in self._batch_lines.items() if id(each) in stopping]

    def release(self, running: RunningPrediction) -> None:
        """Give back what `admit` took; a second call gives nothing back."""
        if self.running.pop(running.id, None) is None:
            return
        if self._batch_lines.pop(running.id, None) is None:
            self.live_slots -= 1 + len(running.extra)
            self.live_ended_at = time.monotonic()
