"""The benchmarks' CPU accounting from /proc: a set of processes' CPU time, the whole machine's,
and which processes make up a server (a process group, or a process and its descendants)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from pathlib import Path


def _stat(pid: int | str) -> list[str]:
    # The fields after the command name, which may itself hold spaces and parentheses.
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def cpu_by_pid(pids: list[int]) -> dict[int, float]:
    """utime + stime of each of these processes (their threads included) so far, in seconds;
    processes that are gone are left out."""
    found = {}
    for pid in pids:
        with contextlib.suppress(OSError):
            fields = _stat(pid)
            found[pid] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return found


def cpu_seconds(pids: list[int]) -> float:
    """utime + stime of these processes (their threads included) so far."""
    return sum(cpu_by_pid(pids).values())


def cpu_since(before: dict[int, float], pids: list[int]) -> float:
    """CPU seconds spent since `before` (cpu_by_pid then) by `pids` (listed now): a process
    started meanwhile (a new PostgreSQL backend, a restarted worker) counts in full."""
    return sum(t - before.get(pid, 0.0) for pid, t in cpu_by_pid(pids).items())


def machine_cpu_seconds() -> float:
    """Busy CPU time of the whole machine so far (/proc/stat: all but idle and iowait)."""
    ticks = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


class OthersLoad:
    """The cores the rest of the machine uses from now on: its busy CPU time less that of
    `pids` (the server measured) and of this process (the client)."""

    def __init__(self, pids: list[int]) -> None:
        self._pids = pids
        self._ours = cpu_seconds(pids) + sum(os.times()[:2])
        self._machine = machine_cpu_seconds()

    def cores(self, wall: float) -> float:
        """Since this was made, over `wall` seconds (the caller's own span of the work)."""
        ours = cpu_seconds(self._pids) + sum(os.times()[:2]) - self._ours
        return max(0.0, machine_cpu_seconds() - self._machine - ours) / wall


def processes_now() -> dict[int, tuple[int, int]]:
    """pid -> (parent pid, process group) of every process now."""
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                fields = _stat(entry.name)
                found[int(entry.name)] = (int(fields[1]), int(fields[2]))
    return found


def process_group_of(marker: bytes) -> list[int]:
    """The pids of the process group led by the process whose command line holds `marker`
    (tritonserver runs in its own group, with its Python-backend stubs)."""
    leader = -1
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if marker in (entry / "cmdline").read_bytes().split(b"\0"):
                    leader = int(entry.name)
    return [pid for pid, (_, group) in processes_now().items() if group == leader]


def process_tree(root: int, table: dict[int, tuple[int, int]] | None = None) -> list[int]:
    """`root` and every process descended from it now (uvicorn's supervisor and its workers,
    PostgreSQL's postmaster and its backends); `table`: processes_now() if already read."""
    children: dict[int, list[int]] = {}
    for pid, (parent, _) in (processes_now() if table is None else table).items():
        children.setdefault(parent, []).append(pid)
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo += children.get(pid, [])
    return tree


def server_listening_on(port: int, program: bytes) -> int:
    """The pid of the `program` process whose command line names `-p PORT` (a PostgreSQL
    postmaster started by pg_ctl, which daemonises it out of our process tree)."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                argv = (entry / "cmdline").read_bytes().split(b"\0")
                if argv[0].endswith(b"/" + program) and str(port).encode() in argv:
                    return int(entry.name)
    raise LookupError(f"no {program.decode()} process on port {port}")


def rss_bytes(pids: list[int], field: str = "VmRSS:") -> int:
    """Resident memory of these processes now, summed (pages shared between them count once per
    process, as `ps` shows them: an upper bound); `field="VmHWM:"`: each one's peak so far."""
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError, ValueError):
            status = Path(f"/proc/{pid}/status").read_text()
            line = next(row for row in status.splitlines() if row.startswith(field))
            total += int(line.split()[1]) * 1024
    return total


def stop_group(process: subprocess.Popen[bytes], timeout_s: float = 60) -> None:
    """Interrupt the process group `process` leads (started with start_new_session) as Ctrl-C
    would, and kill it if it has not ended within `timeout_s`."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGINT)
    try:
        process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
