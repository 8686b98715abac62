"""Resident memory of the real servers, read from /proc: the api's process with its children,
and tritonserver's process group (its Python-backend stubs, where the cpu engine runs)."""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

MIB = 1024 * 1024


def _stat(pid: str) -> list[str]:
    # The fields after the command name, which may itself hold spaces and parentheses.
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def _table() -> dict[int, tuple[int, int]]:
    """pid -> (parent, process group) of every process now."""
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                fields = _stat(entry.name)
                found[int(entry.name)] = (int(fields[1]), int(fields[2]))
    return found


def tree(root: int) -> list[int]:
    """`root` and every process descended from it now."""
    children: dict[int, list[int]] = {}
    for pid, (parent, _) in _table().items():
        children.setdefault(parent, []).append(pid)
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += children.get(pid, [])
    return found


def group_of(mark: str) -> list[int]:
    """The process group of the process whose command line holds the argument `mark`
    (tritonserver runs in a session of its own, with its backend stubs)."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if mark.encode() in (entry / "cmdline").read_bytes().split(b"\0"):
                    leader = int(_stat(entry.name)[2])
                    return [pid for pid, (_, group) in _table().items() if group == leader]
    raise LookupError(f"no process with the argument {mark}")


def rss(pids: list[int]) -> int:
    """VmRSS of these processes, summed (pages they share count once for each: an upper bound)."""
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError, StopIteration, ValueError):
            status = Path(f"/proc/{pid}/status").read_text().splitlines()
            total += int(next(r for r in status if r.startswith("VmRSS:")).split()[1]) * 1024
    return total


@dataclass
class MemorySampler:
    """Every `interval_s`, the resident memory of each named set of processes (re-listed each
    time: a process started meanwhile counts), on a thread of its own."""

    processes: dict[str, list[int] | int]  # a name -> pids, or the root of a tree
    interval_s: float = 0.05
    samples: list[tuple[float, dict[str, int]]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def _pids(self, which: list[int] | int) -> list[int]:
        return tree(which) if isinstance(which, int) else which

    def _run(self) -> None:
        while not self._stop.is_set():
            now = time.monotonic()
            self.samples.append((now, {n: rss(self._pids(p)) for n, p in self.processes.items()}))
            self._stop.wait(self.interval_s)

    def __enter__(self) -> MemorySampler:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def peak(self, name: str, start: float = 0.0, end: float = float("inf")) -> int:
        """The largest reading of `name` between `start` and `end` (time.monotonic())."""
        return max((s[name] for t, s in self.samples if start <= t <= end), default=0)
