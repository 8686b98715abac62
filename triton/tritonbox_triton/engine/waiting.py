"""The requests waiting for the engine, and an idle engine's waits for more of them.

Triton's thread puts requests in (`put`, `withdraw`); the engine's thread takes them out in
turn (`pop_fitting`), after waiting for the rest of a burst or a wave where one is expected
(`first_pass`, admission.py). One condition guards the queue, the burst window and the stop
flag, and wakes the engine's thread when something arrives.
"""

from __future__ import annotations

import threading
import time
from collections import deque

from .admission import BurstWindow, first_pass
from .request import EngineRequest
from .timings import EngineTimings


class WaitingQueue:
    """Requests in arrival order; `lock` is shared with cancellation.py's stop ids."""

    def __init__(self, timings: EngineTimings, *, max_size: int, batch: int) -> None:
        self.lock = threading.Condition()
        self.requests: deque[EngineRequest] = deque()
        self.bursts = BurstWindow(timings)  # how long an idle engine waits for company
        self.stopping = False
        self._max_size = max_size  # 0 = unbounded, as MAX_QUEUE_SIZE
        self._batch = batch  # the engine's MAX_BATCH_SIZE
        self._split_from = timings.split_from
        self._started = 0.0  # when the oldest waiting request arrived

    def __len__(self) -> int:
        with self.lock:
            return len(self.requests)

    def put(self, request: EngineRequest) -> bool:
        """Queue `request` and wake the engine; False when `max_size` are waiting."""
        with self.lock:
            if 0 < self._max_size <= len(self.requests):
                return False
            now = time.monotonic()
            self.bursts.arrived(now)
            if not self.requests:
                self._started = now
            self.requests.append(request)
            self.lock.notify()
            return True

    def withdraw(self, request_id: str) -> list[EngineRequest]:
        """The waiting requests with this id, taken out. Called with the lock held."""
        queued = [r for r in self.requests if r.request_id == request_id]
        for request in queued:
            self.requests.remove(request)
        return queued

    def first_pass(self, busy: bool) -> int | None:
        """Idle (not `busy`) with requests waiting: give the rest of a burst its moment to
        arrive, while requests come in bursts; then how many to prefill in the first pass
        (admission.py). None when busy or nothing waits: the batch's room is the only limit."""
        with self.lock:
            if busy or not self.requests:
                return None
            while not self.stopping and len(self.requests) < self._batch:
                # Each arrival moves the deadline (a quiet gap ends the burst), so it is asked anew.
                until = self.bursts.wait_until(
                    self._started, time.monotonic(), len(self.requests), self._batch
                )
                left = -1.0 if until is None else until - time.monotonic()
                if left <= 0:
                    break
                self.lock.wait(left)
            if len(self.requests) == 1:
                self.bursts.alone()
            return self.bursts.first_pass_size(self._started, len(self.requests), self._batch)

    def next_pass(self) -> int:
        """How many of those waiting the next pass before the step takes (admission.py)."""
        with self.lock:
            return first_pass(len(self.requests), self._split_from)

    def pop_fitting(self, reserved: int, most: int, *, must_fit: bool) -> EngineRequest | None:
        """The first in line, taken out, unless none waits or (`must_fit`) its reservation does
        not fit beside `reserved` tokens within `most`: it then stays first in line."""
        with self.lock:
            if not self.requests:
                return None
            first = self.requests[0]
            if must_fit and reserved + first.reserved_tokens > most:
                return None
            return self.requests.popleft()

    def ended(self, count: int, *, idle: bool) -> None:
        """`count` requests ended in a step just now; `idle`: none runs after it."""
        with self.lock:
            self.bursts.ended(count, time.monotonic(), idle=idle)

    def stop(self) -> None:
        """The engine's loop ends after its iteration in progress."""
        with self.lock:
            self.stopping = True
            self.lock.notify()

    def drain(self) -> list[EngineRequest]:
        """The requests still waiting, taken out (once the loop has ended)."""
        with self.lock:
            waiting = list(self.requests)
            self.requests.clear()
            return waiting

    def sleep(self) -> None:
        """Until a request arrives or the engine stops (an idle engine spends no CPU)."""
        with self.lock:
            if not self.requests and not self.stopping:
                self.lock.wait()

    def quiet_for(self, seconds: float) -> bool:
        """Whether nothing arrives (and no stop) for `seconds`."""
        with self.lock:
            if self.requests or self.stopping:
                return False
            return not self.lock.wait(seconds) and not (self.requests or self.stopping)
