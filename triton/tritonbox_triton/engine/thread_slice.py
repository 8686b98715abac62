"""A long scheduler slice for the engine's threads, so that what a token passes through next gets
a core at once.

The engine's thread and its OpenMP workers keep both cores busy from one step to the next, while
each token still has to pass the sending thread, tritonserver, the api and the client, each of
which wakes up for it. Linux's EEVDF scheduler (6.6 on) lets a running task keep its core until
its slice is used (`RUN_TO_PARITY`), unless the task that wakes asked for a shorter slice
(`PREEMPT_SHORT`, 6.12 on); with every task at the default slice (0.7–3 ms, by the number of
cores), each of those wake-ups could wait for an engine thread's slice to run out. A first token
took ~5 ms (median) from the engine's send to the client's event through the api
(docs/cpu-engine-history.md, twelfth round). A longer slice for the engine's own threads
(`sched_setattr`'s `sched_runtime` for a normal task, 6.12 on) leaves every other task's slice the
shorter, so they preempt the engine as they wake; the engine's share of the cores is unchanged
(its weight decides that, not its slice).

A kernel without per-task slices accepts the call and keeps its default; one that refuses it
(no syscall, seccomp) leaves the engine as it was. Either way the engine runs, and its start-up
log line says which.
"""

from __future__ import annotations

import ctypes
import os
import platform
import struct

# Long against the default; the kernel's upper bound is 100 ms. 3, 20 and 100 ms were alike in
# the twelfth round's A/B (docs/cpu-engine-history.md; all better than the default); 20 ms
# stays well inside the bound.
ENGINE_SLICE_NS = 20_000_000

_SCHED_SETATTR = {"x86_64": 314, "aarch64": 274}
_SCHED_GETATTR = {"x86_64": 315, "aarch64": 275}
# struct sched_attr up to sched_period (SCHED_ATTR_SIZE_VER0): size, policy, flags, nice,
# priority, runtime, deadline, period.
_ATTR = struct.Struct("IIQiIQQQ")
_SCHED_OTHER = 0


def _syscall(table: dict[str, int], *args: object) -> None:
    number = table.get(platform.machine())
    if number is None:
        raise OSError(f"no sched_setattr/getattr numbers known for {platform.machine()}")
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(number, *args) != 0:
        error = ctypes.get_errno()
        raise OSError(error, os.strerror(error))


def current_slice_ns(thread_id: int = 0) -> int:
    """The slice the kernel reports for `thread_id` (0: the calling thread), in ns."""
    buffer = ctypes.create_string_buffer(_ATTR.size)
    _syscall(_SCHED_GETATTR, thread_id, buffer, _ATTR.size, 0)
    return int(_ATTR.unpack(buffer.raw)[5])


def request_slice(slice_ns: int = ENGINE_SLICE_NS) -> str:
    """Ask for `slice_ns` for the calling thread (threads it starts later inherit it); what
    happened, for the log."""
    try:
        if os.sched_getscheduler(0) != _SCHED_OTHER:
            return "the thread's own scheduling policy (not a normal one: kept)"
        nice = os.getpriority(os.PRIO_PROCESS, 0)  # this thread's: kept as it is
        attr = _ATTR.pack(_ATTR.size, _SCHED_OTHER, 0, nice, 0, slice_ns, 0, 0)
        _syscall(_SCHED_SETATTR, 0, ctypes.create_string_buffer(attr, _ATTR.size), 0)
        granted = current_slice_ns()
    except OSError as error:
        return f"the default scheduler slice (sched_setattr refused: {error})"
    if granted == 0:  # before 6.12 a normal task's slice is not reported, nor settable
        return "the default scheduler slice (this kernel has no slice per task)"
    if granted != slice_ns:
        return f"a {granted / 1e6:g} ms scheduler slice (the kernel's bound)"
    return f"a {slice_ns / 1e6:g} ms scheduler slice"
