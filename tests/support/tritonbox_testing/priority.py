"""Peer clients run beside the engine at the lowest CPU priority.

A client nobody here wrote (aiperf, schemathesis) is a busy process of its own. tritonserver is
started in a session of its own, and Linux's autogroups share the CPU between sessions first,
whatever a process's nice value: a client niced in the tests' session still took one of two
cores from the engine, whose OpenMP workers then waited at every barrier for the one it
preempted (two streams of 16 tokens: 4 s alone, 72 s beside one busy process at nice 19, the
engine's threads spinning 36 s each). In a session of its own whose autogroup is niced, the
client gets only what the engine leaves.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

LOWEST = 19


def lowest_priority() -> None:
    """`preexec_fn` for a client's process: a session of its own, its autogroup and itself at
    nice 19 (where the kernel has no autogroups, the process's own nice is what counts)."""
    os.setsid()
    with contextlib.suppress(OSError):  # no autogroups here (or not writable): nice alone
        Path("/proc/self/autogroup").write_text(str(LOWEST))
    os.nice(LOWEST)
