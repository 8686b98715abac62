"""A guide's trial compilation in a process of its own, which guide_pool.py kills at the limit.

A thread cannot be stopped, and xgrammar has no way to interrupt a compilation, which for some
short guides takes hours (guide_pool.py). So a new guide is first compiled in a worker process
(`serve`, here), killed (SIGKILL) and replaced once it passes the time limit: no compilation
outlives it. Only a guide whose trial ended is compiled again in the engine's process, where
its grammar is used. xgrammar 0.2.8 can serialize a compiled grammar
(`CompiledGrammar.serialize_json`), but its JSON spells out every state's token masks: a
600-property schema compiled in 0.09 s took 21 s to serialize (222 MB) and 3.6 s to read back
on the 2-core test machine, far more than compiling twice. The second compilation does the
trial's work again (the same input and tokenizer, one thread, no cache), so it ends as the
trial did, in about its time and within its memory.

Workers are forked by multiprocessing's fork server, which imports this module (torch and
xgrammar with it: 2-3 s) once; never from the engine's process, whose threads' locks fork would
copy held. As for any forkserver or spawn child, multiprocessing imports the engine's main
module in each worker: a script that makes a GuidePool needs `if __name__ == "__main__":`
(Triton's stub has no main file). A worker is ready in about 0.1 s (the vocabulary read back
from JSON); it has about 210 MB resident, 26 MB of it its own, the rest shared with the fork
server (275 MB). It bounds its address space (RLIMIT_AS) to MEMORY_BYTES past what it has then
(about 0.8 GB, torch's libraries mapped): xgrammar's std::bad_alloc past it refuses the guide as
too large (the largest guide measured here, 15,000 alternatives, took 25 MB). It ends with the
engine's process, when a pipe only the engine holds closes (its parent is the fork server,
which outlives it while any worker lives).
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import resource
import shutil
import sys
import threading
import time
from multiprocessing.connection import Connection
from multiprocessing.context import ForkServerContext
from pathlib import Path
from typing import Literal

import xgrammar as xgr

from tritonbox_common.errors import RequestError
from tritonbox_common.guided import GUIDE_INPUT

from .grammar import Guide, GuideCompiler, GuideKey, compile_guide

log = logging.getLogger(__name__)

MEMORY_BYTES = 1 << 30  # a worker's address space past its own once started (RLIMIT_AS)
# A compilation longer than this goes on at the lowest priority (nice 19), taking only CPU the
# engine leaves: guides commonly compile in milliseconds (a 600-property schema 0.04 s here).
LOWER_AFTER_S = 0.5
# The fork server's first start imports torch: seconds, more on a loaded machine.
STARTUP_S = 120.0
LOWEST_PRIORITY = 19
# compiled: the guide compiles; refused: it does not (the message names the input); failed: an
# error of the worker's own (the worker goes on); ended: the worker died; late: guide_pool.py
# killed it at the time limit.
Outcome = tuple[Literal["compiled", "refused", "failed", "ended", "late"], str]


class GuideProcess:
    """One worker process, from the engine's side: started ready, tries one guide at a time."""

    def __init__(self, tokenizer_info: str, memory_bytes: int = MEMORY_BYTES) -> None:
        context = _context()
        self._jobs, jobs = context.Pipe()
        alive, self._alive = context.Pipe(duplex=False)  # never written: closes with this process
        self._process = context.Process(
            target=serve,
            args=(jobs, alive, tokenizer_info, memory_bytes),
            name="guide-compiler",
            daemon=True,
        )
        try:
            self._process.start()
        except BaseException:
            self._jobs.close()
            self._alive.close()
            raise
        finally:
            jobs.close()  # the worker's ends, now its own
            alive.close()
        if self._jobs.poll(STARTUP_S) and self.outcome()[0] == "compiled":  # it says it is ready
            return
        self.end()
        raise RuntimeError(f"a guide-compiling process did not start (exit code {self.exitcode})")

    @property
    def pid(self) -> int:
        assert self._process.pid is not None  # started
        return self._process.pid

    @property
    def exitcode(self) -> int | None:
        return self._process.exitcode

    def trial(self, key: GuideKey, timeout_s: float) -> Outcome:
        """The guide compiled in the process: past LOWER_AFTER_S at nice 19, past `timeout_s`
        killed ("late": `end` reaps it, and the next guide needs a new process)."""
        deadline = time.monotonic() + timeout_s
        try:
            self._jobs.send(key)
        except OSError:  # it died while idle (a pipe closed at its end)
            return self.outcome()
        if not self._jobs.poll(min(LOWER_AFTER_S, timeout_s)):
            for task in Path(f"/proc/{self.pid}/task").glob("*"):
                lower(int(task.name))  # each of its threads
            if not self._jobs.poll(max(0.0, deadline - time.monotonic())):
                self.kill()
                return "late", ""
        return self.outcome()

    def outcome(self) -> Outcome:
        try:
            outcome: Outcome = self._jobs.recv()
            return outcome
        except (EOFError, OSError):
            self._process.join(5)
            ended = f"its process ended (exit code {self.exitcode})"
            return "ended", f"{GUIDE_INPUT}: compiling it failed: {ended}"

    def kill(self) -> None:
        """SIGKILL, from any thread; `end` reaps it."""
        self._process.kill()

    def end(self) -> None:
        """Kill the process and wait until it is gone (its pid then names nothing)."""
        self._process.kill()
        self._process.join()
        self._jobs.close()
        self._alive.close()


def start_process(tokenizer_info: str, memory_bytes: int) -> GuideProcess | None:
    """A new worker process, ready; None (logged) when it could not start."""
    try:
        return GuideProcess(tokenizer_info, memory_bytes)
    except Exception:
        log.exception("a guide-compiling process could not start")
        return None


def compiled(
    process: GuideProcess, compiler: GuideCompiler, key: GuideKey, timeout_s: float
) -> tuple[Guide | None, Outcome]:
    """`key`'s guide, tried in `process` within `timeout_s`, then compiled in this process (and
    cached by `compiler`) if the trial compiled it; else None and the trial's outcome."""
    started = time.monotonic()
    outcome = process.trial(key, timeout_s)
    if outcome[0] != "compiled":
        return None, outcome
    found = _compile_here(compiler, key, time.monotonic() - started)
    return (found, outcome) if isinstance(found, Guide) else (None, ("refused", found))


def _compile_here(compiler: GuideCompiler, key: GuideKey, trial_s: float) -> Guide | str:
    """The guide compiled on a new thread (a lowered one cannot come back up): at nice 19 from
    its start if its trial took LOWER_AFTER_S, else past that; or the error naming its input."""
    found: list[Guide | str] = []

    def run() -> None:
        if trial_s >= LOWER_AFTER_S:
            lower(threading.get_native_id())
        try:
            found.append(compiler.compile(*key))
        except RequestError as invalid:  # xgrammar's reason, naming the input
            found.append(str(invalid))
        except Exception as failure:
            log.error("compiling a guide failed", exc_info=failure)
            found.append(f"{GUIDE_INPUT}: compiling it failed: {failure}")

    thread = threading.Thread(target=run, name="guide-compile", daemon=True)
    thread.start()
    thread.join(LOWER_AFTER_S)
    if thread.is_alive() and trial_s < LOWER_AFTER_S and thread.native_id is not None:
        lower(thread.native_id)
    thread.join()
    return found[0]


def lower(thread_id: int) -> None:
    """A thread to nice 19 (Linux: nice is a thread's own); it cannot come back up unprivileged."""
    try:
        os.setpriority(os.PRIO_PROCESS, thread_id, LOWEST_PRIORITY)
    except OSError as error:  # ended meanwhile, not Linux, or not allowed: it keeps its priority
        log.warning("could not lower a slow guide's priority: %s", error)


def _context() -> ForkServerContext:
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([__name__])
    # Triton's Python-backend stub embeds Python; its sys.executable is the `python3` it found
    # on PATH (parent_watch.py), which starts the fork server. Were it the stub, take that one.
    python = shutil.which("python3")
    if not Path(sys.executable).name.startswith("python") and python is not None:
        context.set_executable(python)
    return context


def serve(jobs: Connection, alive: Connection, tokenizer_info: str, memory_bytes: int) -> None:
    """A worker's life, in its process: guides tried one at a time, each outcome sent back."""
    threading.Thread(target=_end_with_engine, args=(alive,), daemon=True).start()
    info = xgr.TokenizerInfo.deserialize_json(tokenizer_info)
    compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
    _bound_memory(memory_bytes)
    jobs.send(("compiled", "ready"))
    while True:
        try:
            guide_type, guide = jobs.recv()
        except EOFError:  # the engine closed this worker
            return
        jobs.send(_trial(compiler, guide_type, guide, memory_bytes))


def _trial(compiler: xgr.GrammarCompiler, guide_type: str, guide: str, memory: int) -> Outcome:
    try:
        compile_guide(compiler, guide_type, guide)
    except RequestError as invalid:
        return "refused", str(invalid)
    except MemoryError:
        return "refused", (
            f"{GUIDE_INPUT}: compiling the {guide_type} needs more than the engine's "
            f"{memory >> 20} MiB (guide_process.MEMORY_BYTES); a simpler one needs less"
        )
    except Exception as error:
        return "failed", f"{GUIDE_INPUT}: compiling it failed: {error}"
    return "compiled", ""


def _end_with_engine(alive: Connection) -> None:
    with contextlib.suppress(EOFError, OSError):
        alive.recv()  # nothing is ever sent: this returns once the engine's end closes
    os._exit(0)


def _bound_memory(extra: int) -> None:
    status = Path("/proc/self/status").read_text().splitlines()
    size = int(next(line for line in status if line.startswith("VmSize:")).split()[1]) * 1024
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = size + extra if hard == resource.RLIM_INFINITY else min(size + extra, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
