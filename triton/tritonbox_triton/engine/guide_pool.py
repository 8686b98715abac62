"""Structured-output guides compiled off Triton's request thread, with a time limit.

xgrammar compiles some short guides slowly: each distinct bounded repetition of a broad class
(`.{1,1000}`, a string's maxLength) costs about 1.5 s of a core here, whatever its count (16:
25 s; 100,000 characters: hours). A guide the LRU lacks (grammar.py) is compiled by one of
WORKERS workers while Triton's thread goes on admitting requests; its request goes to the engine
once it is compiled. Requests with the same guide (type and text) share one compilation.

Nothing stops a compilation on a thread, so a worker tries each guide first in a process of its
own (guide_process.py), and compiles it here only once that trial ended (the same work: it ends
too), then caches it. What a guide may take is bounded:

- a trial runs at most `timeout_s` (GUIDE_COMPILE_TIMEOUT_S): past it, its process is killed
  (SIGKILL) and replaced, and the requests still waiting for the guide are refused; so is, at
  once and without a trial, a request for one of the last LATE_KEPT such (guide_late.py);
- a request waits at most `timeout_s` from its arrival, then fails with an error naming its guide
  input and the limit (the api: a 400 naming the client's field);
- past MAX_WAITING waiting requests, one more is refused at once with TensorRT-LLM's "Maximum
  queue size" words (the api: 429 with Retry-After);
- a compilation nobody waits for any longer is dropped if not started, else goes on to its end
  (then cached) or its limit; WORKERS run at once, each at nice 19 past LOWER_AFTER_S.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from tritonbox_common.guided import GUIDE_INPUT

from .grammar import Guide, GuideCompiler, GuideKey
from .guide_late import LateGuides, late
from .guide_process import MEMORY_BYTES, GuideProcess, compiled, start_process

log = logging.getLogger(__name__)

# Compilations at once, each on one thread (grammar.py's max_threads=1): two keep one slow guide
# from holding up every other new guide, and leave the engine its cores. Each has a process.
WORKERS = 2
# Requests waiting for a compilation at once: each holds its prompt and its guide (up to
# MAX_GUIDE_CHARS) until answered. A client's few concurrent guided requests fit many times.
MAX_WAITING = 32
RESTART_AFTER_S = 5.0  # a worker whose process could not start tries again after this
STOPPING = f"{GUIDE_INPUT}: the engine is stopping"
INF = float("inf")

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
    started: bool = False


class GuidePool:
    """Compiles guides for `compiler` with workers of its own; see the module's words."""

    def __init__(
        self,
        compiler: GuideCompiler,
        timeout_s: float,
        max_waiting: int = MAX_WAITING,
        workers: int = WORKERS,
        memory_bytes: int = MEMORY_BYTES,
    ) -> None:
        self._compiler = compiler
        self._timeout_s, self._max_waiting = timeout_s, max_waiting
        self._lock = threading.Lock()
        self._queued_one = threading.Condition(self._lock)  # for the workers
        self._new_deadline = threading.Condition(self._lock)  # for the deadlines' thread
        self._compilations: dict[GuideKey, _Compilation] = {}  # not started, or running
        self._queued: deque[_Compilation] = deque()  # not started, oldest first
        self._processes: dict[int, GuideProcess] = {}  # each worker's, by its number
        self._late = LateGuides()  # guides whose trial was killed at the limit
        self._running, self._waiting, self._closed = 0, 0, False
        info = compiler.tokenizer_info.serialize_json()
        for number in range(workers):  # started here: the engine is ready once they are
            process = self._start(number, info, memory_bytes)
            args, name = (number, process, info, memory_bytes), f"guide-worker-{number}"
            threading.Thread(target=self._work, args=args, name=name, daemon=True).start()
        threading.Thread(target=self._watch, name="guide-deadlines", daemon=True).start()

    def waiting(self) -> int:
        with self._lock:  # requests waiting for a compilation now
            return self._waiting

    def running(self) -> int:
        with self._lock:  # compilations running now
            return self._running

    def pids(self) -> list[int]:
        with self._lock:  # the workers' processes now
            return [process.pid for process in self._processes.values()]

    def request(self, key: GuideKey | None, ready: Ready, refuse: Refuse) -> None:
        """Call `ready(guide)` once `key`'s guide is compiled (now, on this thread, when cached
        or None), else `refuse(message)`: from a worker's thread or the deadlines' thread."""
        cached = None if key is None else self._compiler.lookup(key)
        if key is None or cached is not None:
            _deliver(_Waiter(ready, refuse, 0.0), cached)
            return
        with self._lock:
            refusal = self._refusal(key)
            if refusal is None:
                self._waiting += 1
                compilation = self._compilations.get(key)
                if compilation is None:
                    compilation = self._compilations[key] = _Compilation(key)
                    self._queued.append(compilation)
                    self._queued_one.notify()
                deadline = time.monotonic() + self._timeout_s
                compilation.waiters.append(_Waiter(ready, refuse, deadline))
                self._new_deadline.notify()
        if refusal is not None:
            _refuse(_Waiter(ready, refuse, 0.0), refusal)

    def _refusal(self, key: GuideKey) -> str | None:
        if self._closed or key in self._late:  # the latter would only be late again
            return STOPPING if self._closed else late(key, self._timeout_s)
        if self._waiting < self._max_waiting:
            return None
        return (f"{GUIDE_INPUT}: Maximum queue size of {self._max_waiting} requests waiting for a "
                "guide to compile has been reached, please try again later")  # fmt: skip

    def _start(self, number: int, info: str, memory: int) -> GuideProcess | None:
        """A new process for worker `number`, or None (closed, or it could not start)."""
        process = start_process(info, memory)
        with self._lock:
            if process is not None and not self._closed:
                self._processes[number] = process
                return process
        if process is not None:
            process.end()
        return None

    def _work(self, number: int, process: GuideProcess | None, info: str, memory: int) -> None:
        """A worker's thread: the oldest queued guide, tried in its process, then compiled."""
        while not self._closed:
            if process is None:  # (re)started before it takes a guide, off the guide's time
                process = self._start(number, info, memory)
                if process is None:
                    time.sleep(RESTART_AFTER_S)
                continue
            with self._lock:
                while not self._queued and not self._closed:
                    self._queued_one.wait()
                if self._closed:
                    break
                compilation = self._queued.popleft()
                compilation.started, self._running = True, self._running + 1
            key = compilation.key
            guide, (kind, message) = compiled(process, self._compiler, key, self._timeout_s)
            if kind in ("ended", "failed") and not self._closed:
                log.error("trying a guide failed: %s", message)
            if kind in ("late", "ended"):  # killed at the limit, or died: a new one is started
                process.end()
                process = None
            self._finish(compilation, guide, message, kind == "late")
        if process is not None:
            process.end()

    def _finish(self, job: _Compilation, guide: Guide | None, error: str, was_late: bool) -> None:
        error = late(job.key, self._timeout_s) if was_late else error
        with self._lock:
            if was_late:  # remembered as its compilation ends: no new trial for it
                self._late.add(job.key)
            if self._compilations.get(job.key) is job:
                del self._compilations[job.key]
            self._running -= 1
            waiters, job.waiters = job.waiters, []
            self._waiting -= len(waiters)
            self._new_deadline.notify()
        for waiter in waiters:
            _deliver(waiter, guide) if guide is not None else _refuse(waiter, error)

    def _watch(self) -> None:
        """Refuses waiters at their limit, on a thread."""
        while True:
            with self._lock:
                if self._closed:
                    return
                expired, wake = self._expire(time.monotonic())
                if not expired:
                    self._new_deadline.wait(None if wake == INF else wake - time.monotonic())
            for key, waiter in expired:
                _refuse(waiter, late(key, self._timeout_s))

    def _expire(self, now: float) -> tuple[list[tuple[GuideKey, _Waiter]], float]:
        """Waiters past their deadline (taken out), and the next deadline (the lock held)."""
        expired: list[tuple[GuideKey, _Waiter]] = []
        wake = INF
        for key, compilation in list(self._compilations.items()):
            for waiter in [w for w in compilation.waiters if w.deadline <= now]:
                compilation.waiters.remove(waiter)
                self._waiting -= 1
                expired.append((key, waiter))
            wake = min([wake, *(w.deadline for w in compilation.waiters)])
            if not compilation.started and not compilation.waiters:
                self._queued.remove(compilation)  # nobody waits for it: its place goes on
                del self._compilations[key]
        return expired, wake

    def close(self) -> None:
        """Refuse every waiting request and kill the workers' processes (a compilation in this
        process, which the trial showed to end, ends on its own)."""
        with self._lock:
            self._closed = True
            waiters = [w for c in self._compilations.values() for w in c.waiters]
            for compilation in self._compilations.values():
                compilation.waiters.clear()
            self._queued.clear()
            self._waiting = 0
            processes = list(self._processes.values())
            self._queued_one.notify_all()  # the workers end
            self._new_deadline.notify()  # the deadlines' thread ends
        for process in processes:
            process.kill()
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
