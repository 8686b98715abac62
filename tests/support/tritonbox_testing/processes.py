"""Processes found by a mark in their command line or environment, and the Python-backend
shared-memory regions they name (tritonbox_testing.native_stack)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

STUB = "triton_python_backend_stub"


@dataclass(frozen=True)
class Process:
    pid: int
    state: str  # /proc/PID/stat's state: R, S, Z (a zombie), ...
    command: str


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:  # gone meanwhile, or not ours to read
        return b""


def marked_processes(mark: str) -> list[Process]:
    """Processes whose command line or environment holds `mark` (this process excluded)."""
    needle = mark.encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        command = _read(entry / "cmdline")
        if needle not in command and needle not in _read(entry / "environ"):
            continue
        stat = _read(entry / "stat").decode(errors="replace")
        state = stat.rsplit(")", 1)[-1].split()[0] if ")" in stat else "?"
        if state in ("", "?"):
            continue  # it ended between the two reads
        text = command.replace(b"\0", b" ").decode(errors="replace").strip()
        found.append(Process(int(entry.name), state, text))
    return found


def stub_regions(processes: list[Process]) -> set[str]:
    """The shared-memory regions the Python-backend stubs among `processes` use (the stub's
    second argument, after the model's path)."""
    regions = set()
    for process in processes:
        words = process.command.split()
        if words and words[0].endswith(STUB) and len(words) > 2:
            regions.add(words[2])
    return regions


def region_prefixes(processes: list[Process]) -> set[str]:
    """The region prefixes the tritonservers among `processes` were given."""
    return set(re.findall(r"shm-region-prefix-name=(\S+)", " ".join(p.command for p in processes)))
