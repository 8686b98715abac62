"""Which requests are cancelled: by a `stop` for their id (TensorRT-LLM's `stop` input, seen at
every iteration) or by a client that left (asked at most every `cancel_check_s`: each question is
a round trip to tritonserver)."""

from __future__ import annotations

import threading
import time
from collections import deque

from .request import EngineObserver, EngineRequest, Running


class Cancellations:
    """The stop ids not matched yet and when clients were last asked. `lock` is the engine's:
    it guards the stop ids together with the waiting queue, so a stop cannot slip between a
    request leaving the queue and the check that follows."""

    def __init__(
        self,
        lock: threading.Condition,
        observer: EngineObserver,
        *,
        check_s: float,
        early_stop_ttl_s: float,
    ) -> None:
        self._lock = lock
        self._observer = observer
        self._check_s = check_s
        self._ttl_s = early_stop_ttl_s
        self._stop_ids: dict[str, float] = {}  # request id -> when the stop arrived
        self._clients_asked = 0.0

    def stopped(self, request_id: str) -> None:
        """A stop for `request_id`, which is not waiting: it acts when its request is next
        checked, running or arriving. Called with the lock held."""
        self._stop_ids[request_id] = time.monotonic()

    def stops_pending(self) -> bool:
        """Whether a `stop` waits to act (cheap: no client is asked)."""
        with self._lock:
            return bool(self._stop_ids)

    def clients_due(self, now: float) -> bool:
        """Whether this iteration asks the clients whether they left (and marks it asked)."""
        due = now - self._clients_asked >= self._check_s
        if due:
            self._clients_asked = now
        return due

    def is_cancelled(self, request: EngineRequest, *, ask_client: bool = True) -> bool:
        """A `stop` for it arrived, or (when `ask_client`) its client left. Never called with
        the lock held: asking the client is a round trip to Triton."""
        with self._lock:
            if request.request_id and self._stop_ids.pop(request.request_id, None) is not None:
                return True
        return ask_client and request.sink.is_cancelled()

    def cancel(self, requests: list[EngineRequest]) -> None:
        for request in requests:
            request.sink.on_cancelled()
            self._observer.on_finished("cancelled")

    def drop_waiting(self, waiting: deque[EngineRequest]) -> None:
        """Requests whose clients left while they waited leave the queue."""
        with self._lock:
            queued = list(waiting)
        gone = [request for request in queued if self.is_cancelled(request)]
        if gone:
            with self._lock:
                for request in gone:
                    if request in waiting:
                        waiting.remove(request)
            self.cancel(gone)

    def running_kept(self, running: list[Running], ask_clients: bool) -> list[int] | None:
        """The rows of `running` that go on, the others told they were cancelled; None when all
        go on. Stops that overtook their requests long ago expire here."""
        with self._lock:
            if self._stop_ids:
                expired = time.monotonic() - self._ttl_s
                self._stop_ids = {k: t for k, t in self._stop_ids.items() if t > expired}
        keep = [
            i
            for i, run in enumerate(running)
            if not self.is_cancelled(run.request, ask_client=ask_clients)
        ]
        if len(keep) == len(running):
            return None
        for i, run in enumerate(running):
            if i not in keep:
                run.request.sink.on_cancelled()
                self._observer.on_finished("cancelled")
        return keep
