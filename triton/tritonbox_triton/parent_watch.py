"""A Python-backend stub must not outlive its tritonserver: a watcher process ends it.

A model's `initialize` calls `watch_parent()`. Outside a stub (unit tests that load model.py
in-process) it does nothing; inside one it starts this file as a small interpreter of its own
(`python -I -S`, the standard library only) that checks every POLL_S whether tritonserver is
still the stub's living parent. Once it is not (killed, crashed, or exited without stopping the
stub), the watcher removes the stub's shared-memory region and SIGKILLs the stub.

Why a process and not a thread in the stub: a stub whose tritonserver died was seen hanging for
good (issue 23), its engine thread blocked in a metric update that waits for tritonserver's
reply while holding the GIL, and the stub's own parent check deadlocked in its queue monitors; a
thread of the stub would never have run again. Why not PR_SET_PDEATHSIG on the stub itself: it
fires when the *thread* that forked the stub ends, and Triton forks stubs from model-loading
threads that may end while the server lives. The watcher does use it for itself: it is forked by
the stub's main thread (which runs `initialize` and lives as long as the stub), so it ends with
the stub and never outlives what it watches. The signal is SIGTERM, handled: a stub that is not
hung sees its server gone by itself (python_backend checks every 300 ms) and exits, sometimes
before this watcher's next look, and the region must still go; so a watcher whose stub ended
removes the region if the server is gone too.

The watcher stays in tritonserver's process group, so the launcher's group kill reaches it too.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

STUB = "triton_python_backend_stub"
POLL_S = 0.25
SHM = Path("/dev/shm")
_PR_SET_PDEATHSIG = 1
# The Popen objects, kept so that they are not collected (the watchers run as long as the stub).
_watchers: list[subprocess.Popen[bytes]] = []


def stub_arguments(cmdline: bytes) -> tuple[int, str] | None:
    """(tritonserver's pid, the shared-memory region) from a stub's /proc/PID/cmdline, or None
    when it is not a stub's. The stub is started as `STUB MODEL_PATH REGION DEFAULT_BYTES
    GROWTH_BYTES PARENT_PID ...` (python_backend's stub_launcher)."""
    argv = cmdline.split(b"\0")
    if len(argv) < 6 or not argv[0].endswith(STUB.encode()):
        return None
    region = argv[2].decode(errors="replace")
    if not region or "/" in region or not argv[5].isdigit():
        return None
    return int(argv[5]), region


def _interpreter() -> str | None:
    """A Python to run the watcher: the stub embeds one, and its sys.executable is the `python3`
    it found on PATH (the launcher puts the environment's bin/ first)."""
    if Path(sys.executable).name.startswith("python"):
        return sys.executable
    return shutil.which("python3")


def watch_parent() -> None:
    """From a model's `initialize`: start the watcher for this stub (once per process)."""
    try:
        found = stub_arguments(Path("/proc/self/cmdline").read_bytes())
    except OSError:
        return
    python = _interpreter()
    if found is None or python is None or _watchers:
        return
    parent, region = found
    command = [python, "-I", "-S", __file__, str(os.getpid()), str(parent), region]
    # stderr stays tritonserver's log: the watcher says there when it acts.
    _watchers.append(subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL))


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, parent pid) of `pid`, None when it does not exist."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text.rsplit(")", 1)[-1].split()
    return fields[0], int(fields[1])


def _server_gone(parent: int) -> bool:
    """tritonserver is dead: no such process, or a zombie not yet reaped."""
    server = _stat(parent)
    return server is None or server[0] in ("Z", "X")


def _parent_gone(stub: int, parent: int) -> bool:
    mine = _stat(stub)
    if mine is None:
        return False  # the stub itself is gone: nothing to do (and this process is ending)
    # A reaped server leaves the stub re-parented.
    return _server_gone(parent) or mine[1] != parent


class _StubEnded(Exception):
    """The stub ended (this watcher's parent-death signal)."""


def _stub_ended(signum: int, frame: object) -> None:
    raise _StubEnded


def _remove(region: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        (SHM / region).unlink()  # removes the name; the mappings end with the processes


def _watch(stub: int, parent: int, region: str) -> int:
    signal.signal(signal.SIGTERM, _stub_ended)
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    try:
        while os.getppid() == stub:  # else the stub has already ended
            if _parent_gone(stub, parent):
                _remove(region)
                print(
                    f"tritonbox parent_watch: tritonserver (pid {parent}) is gone; "
                    f"ending its Python backend stub (pid {stub}) and removing {region}",
                    file=sys.stderr,
                    flush=True,
                )
                os.kill(stub, signal.SIGKILL)
                return 0
            time.sleep(POLL_S)
    except _StubEnded:
        pass
    # The stub ended. A stub that sees its server gone exits by itself, which may come before
    # this watcher's next look; the region is then nobody else's to remove. Where the server
    # still runs, the region is its own (it restarts or unloads stubs itself).
    if _server_gone(parent):
        _remove(region)
    return 0


if __name__ == "__main__":
    sys.exit(_watch(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]))
