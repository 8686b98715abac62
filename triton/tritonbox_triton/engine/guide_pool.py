"""Structured-output guides compiled off Triton's request thread, with a time limit.

xgrammar compiles some short guides slowly: each distinct bounded repetition of a broad class
(`.{1,1000}`, a string's maxLength) costs about 1.5 s of a core here, whatever its count (16:
25 s; 100,000 characters: hours). A guide the LRU lacks (grammar.py) is compiled on a thread of
this pool while Triton's thread goes on admitting requests (xgrammar lets go of the GIL); its
request goes to the engine once it is compiled. Requests with the same guide (type and text)
share one compilation, whether it waits, runs or is past its time.

Neither xgrammar nor Python can stop a compilation once started, so what one may take is bounded:

- a request waits at most `timeout_s` (GUIDE_COMPILE_TIMEOUT_S) from its arrival, then fails with
  an error naming its guide input and the limit (the api: a 400 naming the client's field);
- past MAX_WAITING waiting requests, one more is refused at once with TensorRT-LLM's "Maximum
  queue size" words (the api: 429 with Retry-After);
- a compilation nobody waits for any longer is dropped if it has not started; one that runs past
  LOWER_AFTER_S goes on at nice 19 (it takes only CPU the engine leaves), past `timeout_s` runs on
  to its end (then cached) and gives its place to the next guide: WORKERS compilations within
  their time run at once, plus MAX_OVERDUE past it. Past that, new guides wait (refused at their
  limit); requests without a guide or with a cached one are served as ever.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from tritonbox_common.errors import RequestError
from tritonbox_common.guided import GUIDE_INPUT

from .grammar import Guide, GuideCompiler, GuideKey

log = logging.getLogger(__name__)

# Compilations within their time at once, each on one thread (grammar.py's max_threads=1): two
# keep one slow guide from holding up every other new guide, and leave the engine its cores.
WORKERS = 2
MAX_OVERDUE = 2  # compilations past their time limit still running, beside WORKERS
# Requests waiting for a compilation at once: each holds its prompt and its guide (up to
# MAX_GUIDE_CHARS) until answered. A client's few concurrent guided requests fit many times.
MAX_WAITING = 32
# A compilation longer than this goes on at the lowest priority (nice 19), taking only CPU the
# engine leaves: guides commonly compile in milliseconds (a 600-property schema 0.04 s here).
LOWER_AFTER_S = 0.5
LOWEST_PRIORITY = 19
STOPPING = f"{GUIDE_INPUT}: the engine is stopping"

Ready = Callable[[Guide | None], None]  # the request's start, with its compiled guide
Refuse = Callable[[str], None]  # its error answer


@dataclass(eq=False)
class _Waiter:
    ready: Ready
    refuse: Refuse
    deadline: float


@dataclass(eq=False)
class _Compilation:
    key: GuideKey
    waiters: list[_Waiter] = field(default_factory=list)
    started: float | None = None  # when it started (time.monotonic())
    thread_id: int | None = None  # the compiling thread's while it compiles, for its priority
    lowered: bool = False  # past LOWER_AFTER_S: at the lowest priority
    overdue: bool = False  # past timeout_s and out of the WORKERS count


class GuidePool:
    """Compiles guides for `compiler` on threads of its own; see the module's words."""

    def __init__(
        self,
        compiler: GuideCompiler,
        timeout_s: float,
        max_waiting: int = MAX_WAITING,
        workers: int = WORKERS,
        max_overdue: int = MAX_OVERDUE,
    ) -> None:
        self._compiler = compiler
        self._timeout_s = timeout_s
        self._max_waiting, self._workers, self._max_overdue = max_waiting, workers, max_overdue
        self._lock = threading.Condition()
        self._compilations: dict[GuideKey, _Compilation] = {}  # not started, or running
        self._queued: deque[_Compilation] = deque()  # not started, oldest first
        self._in_time = 0  # running within their time (at most `workers`)
        self._overdue = 0  # running past it, out of that count (at most `max_overdue`)
        self._waiting = 0
        self._closed = False
        threading.Thread(target=self._watch, name="guide-deadlines", daemon=True).start()

    def waiting(self) -> int:
        with self._lock:  # requests waiting for a compilation now
            return self._waiting

    def running(self) -> tuple[int, int]:
        with self._lock:  # compilations running: (within their time, overdue)
            return self._in_time, self._overdue

    def request(self, key: GuideKey | None, ready: Ready, refuse: Refuse) -> None:
        """Call `ready(guide)` once `key`'s guide is compiled (now, on this thread, when cached
        or None), else `refuse(message)`: from a compiling thread or the deadlines' thread."""
        cached = None if key is None else self._compiler.lookup(key)
        if key is None or cached is not None:
            _deliver(_Waiter(ready, refuse, 0.0), cached)
            return
        with self._lock:
            refusal = self._refusal()
            if refusal is None:
                self._waiting += 1
                compilation = self._compilations.get(key)
                if compilation is None:
                    compilation = self._compilations[key] = _Compilation(key)
                    self._queued.append(compilation)
                deadline = time.monotonic() + self._timeout_s
                compilation.waiters.append(_Waiter(ready, refuse, deadline))
                self._start_queued()
                self._lock.notify()  # the deadlines' thread: a new deadline
        if refusal is not None:
            _refuse(_Waiter(ready, refuse, 0.0), refusal)

    def _refusal(self) -> str | None:
        if self._closed or self._waiting < self._max_waiting:
            return STOPPING if self._closed else None
        return (f"{GUIDE_INPUT}: Maximum queue size of {self._max_waiting} requests waiting for a "
                "guide to compile has been reached, please try again later")  # fmt: skip

    def _start_queued(self) -> None:
        """Start the oldest queued compilations while WORKERS allows (the lock held)."""
        while self._queued and self._in_time < self._workers and not self._closed:
            compilation = self._queued.popleft()
            compilation.started = time.monotonic()
            self._in_time += 1
            threading.Thread(target=self._compile, args=(compilation,), daemon=True).start()

    def _compile(self, compilation: _Compilation) -> None:
        with self._lock:
            compilation.thread_id = threading.get_native_id()
        guide, error = None, None
        try:
            guide = self._compiler.compile(*compilation.key)
        except RequestError as invalid:  # xgrammar's reason, naming the input
            error = str(invalid)
        except Exception as failure:
            log.error("compiling a guide failed", exc_info=failure)
            error = f"{GUIDE_INPUT}: compiling it failed: {failure}"
        with self._lock:
            compilation.thread_id = None  # its thread ends: never lowered from here
            if self._compilations.get(compilation.key) is compilation:
                del self._compilations[compilation.key]
            if compilation.overdue:
                self._overdue -= 1
            else:
                self._in_time -= 1
            waiters, compilation.waiters = compilation.waiters, []
            self._waiting -= len(waiters)
            self._start_queued()
            self._lock.notify()
        for waiter in waiters:
            _deliver(waiter, guide) if error is None else _refuse(waiter, error)

    def _watch(self) -> None:
        """Refuses waiters at their limit and lowers overdue compilations, on a thread."""
        while True:
            with self._lock:
                if self._closed:
                    return
                expired, wake = self._expire(time.monotonic())
                if not expired:
                    self._lock.wait(None if wake == float("inf") else wake - time.monotonic())
            for key, waiter in expired:
                _refuse(waiter, self._late(key))

    def _expire(self, now: float) -> tuple[list[tuple[GuideKey, _Waiter]], float]:
        """Waiters past their deadline (taken out), and the next deadline (the lock held)."""
        expired: list[tuple[GuideKey, _Waiter]] = []
        wake = float("inf")
        for key, compilation in list(self._compilations.items()):
            for waiter in [w for w in compilation.waiters if w.deadline <= now]:
                compilation.waiters.remove(waiter)
                self._waiting -= 1
                expired.append((key, waiter))
            wake = min([wake, *(w.deadline for w in compilation.waiters)])
            if compilation.started is None and not compilation.waiters:
                self._queued.remove(compilation)  # nobody waits for it: its place goes on
                del self._compilations[key]
            elif compilation.started is not None and not compilation.overdue:
                lower_at = compilation.started + min(LOWER_AFTER_S, self._timeout_s)
                if lower_at <= now:
                    self._lower(compilation)
                deadline = compilation.started + self._timeout_s
                if deadline > now:
                    wake = min(wake, deadline if compilation.lowered else lower_at)
                    continue
                if self._overdue < self._max_overdue:
                    compilation.overdue = True
                    self._overdue += 1
                    self._in_time -= 1
                    self._start_queued()
        return expired, wake

    def _lower(self, compilation: _Compilation) -> None:
        """Its thread to the lowest priority (Linux: a thread's own nice value), once."""
        if compilation.lowered or compilation.thread_id is None:
            return
        compilation.lowered = True
        try:
            os.setpriority(os.PRIO_PROCESS, compilation.thread_id, LOWEST_PRIORITY)
        except OSError as error:  # not Linux, or not allowed: it keeps its priority
            log.warning("could not lower a slow guide's priority: %s", error)

    def _late(self, key: GuideKey) -> str:
        return (f"{GUIDE_INPUT}: the {key[0]} was not compiled within the engine's limit of "
                f"{self._timeout_s:g} s (GUIDE_COMPILE_TIMEOUT_S); its compilation goes on, and "
                "the same guide sent once it is done is served at once; a simpler one compiles "
                "sooner (fewer bounded repetitions such as .{1,1000} or a maxLength)")  # fmt: skip

    def close(self) -> None:
        """Refuse every waiting request; running compilations are left to end on their own."""
        with self._lock:
            self._closed = True
            waiters = [w for c in self._compilations.values() for w in c.waiters]
            for compilation in self._compilations.values():
                compilation.waiters.clear()
            self._queued.clear()
            self._waiting = 0
            self._lock.notify()  # the deadlines' thread ends
        for waiter in waiters:
            _refuse(waiter, STOPPING)


def _deliver(waiter: _Waiter, guide: Guide | None) -> None:
    """`waiter.ready(guide)`; should it raise, the request is refused, not left unanswered."""
    try:
        waiter.ready(guide)
    except Exception as error:
        log.exception("starting a guided request failed")
        _refuse(waiter, f"the engine could not take the request: {error}")


def _refuse(waiter: _Waiter, message: str) -> None:
    try:
        waiter.refuse(message)
    except Exception:  # a sender already closed: nothing more can be told to its client
        log.exception("refusing a guided request failed")
