"""Responses sent to Triton from a thread of their own, in the order the engine produced them.

A Python-backend model sends each response through shared memory to the tritonserver process
and waits there for it to be taken: about half a millisecond each on 2 busy cores. The cpu
engine streams one response per request per decode step, so at 16 requests the engine's thread
spent a third of every step sending (py-spy, docs/cpu-engine.md). Here the engine only queues
them; this thread sends while the engine computes its next step (the backend lets go of the GIL
while it waits).

One thread and one queue keep every request's responses in order, the final one last.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)

Send = Callable[[], None]


class BackgroundSender:
    """Runs queued sends one at a time, in order, on a daemon thread started on first use."""

    def __init__(self, name: str = "response-sender") -> None:
        self._queue: queue.SimpleQueue[Send | None] = queue.SimpleQueue()
        self._name = name
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def submit(self, send: Send) -> None:
        if self._thread is None:
            with self._lock:
                if self._thread is None:
                    self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                    self._thread.start()
        self._queue.put(send)

    def _run(self) -> None:
        while (send := self._queue.get()) is not None:
            try:
                send()
            except Exception:  # one failed send must not stop the others
                log.exception("sending a response failed")

    def close(self, timeout_s: float = 10.0) -> None:
        """Send what is queued, then end the thread."""
        thread = self._thread
        if thread is None:
            return
        self._queue.put(None)
        thread.join(timeout_s)
        self._thread = None
