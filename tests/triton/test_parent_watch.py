"""The stub's watcher (tritonbox_triton.parent_watch) and the launcher's shared-memory clean-up,
without Triton: a stand-in stub (Python started under the stub's name, with its arguments) under
a stand-in tritonserver."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tritonbox_triton.launch import server_arguments
from tritonbox_triton.parent_watch import STUB, stub_arguments
from tritonbox_triton.server_setup import SHM, SHM_PREFIX, remove_shm_regions
from tritonbox_triton.settings import TritonSettings

TRITON_SOURCES = Path(__file__).resolve().parents[2] / "triton"

# The stub's model: starts the watcher as model.py's initialize does, then serves "forever".
STUB_MODEL = textwrap.dedent(
    """\
    import os, sys, time
    from tritonbox_triton.parent_watch import watch_parent
    watch_parent()
    print("watching", flush=True)
    if sys.argv[-1] == "follows":  # as python_backend's stub does: it exits once its server is gone
        server = os.getppid()
        while os.getppid() == server:
            time.sleep(0.01)
        sys.exit(1)
    time.sleep(60 if sys.argv[-1] == "forever" else 1)
    """
)
# tritonserver's part: start the stub as python_backend does, print its pid, wait.
SERVER = textwrap.dedent(
    """\
    import os, subprocess, sys, time
    stub, model, region, mode = sys.argv[1:5]
    args = [stub, model, region, "1048576", "1048576", str(os.getpid()), "lib", "0", "m_0", mode]
    child = subprocess.Popen(args, stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline() == "watching\\n"
    print(child.pid, flush=True)
    child.wait()
    time.sleep(60)
    """
)


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state not in {"Z", "X"}


def the_watcher_of(pid: int, timeout_s: float = 15.0) -> int:
    """The one watcher of stub `pid`, once it runs Python itself (its command line is briefly
    unreadable while it execs, which a loaded machine can stretch)."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = [w for w in watchers_of(pid) if _runs_python(w)]
        if len(found) == 1 or time.monotonic() > deadline:
            (watcher,) = found
            return watcher
        time.sleep(0.05)


def _runs_python(pid: int) -> bool:
    try:
        return Path(os.readlink(f"/proc/{pid}/exe")).name.startswith("python")
    except OSError:
        return False


def watchers_of(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                words = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if any(w.endswith(b"parent_watch.py") for w in words) and str(pid).encode() in words:
                found.append(int(entry.name))
    return found


@pytest.fixture
def region() -> Iterator[str]:
    name = f"{SHM_PREFIX}tritonbox-test-{secrets.token_hex(4)}_region"
    (SHM / name).write_bytes(b"\0" * 16)
    yield name
    (SHM / name).unlink(missing_ok=True)


def start_server(tmp_path: Path, region: str, mode: str) -> tuple[subprocess.Popen[str], int]:
    stub = tmp_path / STUB
    stub.symlink_to(Path(sys.executable).resolve())  # so the stub's argv[0] is the stub's name
    model = tmp_path / "model.py"
    model.write_text(STUB_MODEL)
    # The environment's bin/ first on PATH, as the launcher puts it: the watcher's `python3`.
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    env = {**os.environ, "PYTHONPATH": str(TRITON_SOURCES), "PYTHONSAFEPATH": "1", "PATH": path}
    server = subprocess.Popen(
        [sys.executable, "-c", SERVER, str(stub), str(model), region, mode],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    assert server.stdout is not None
    return server, int(server.stdout.readline())


def test_stub_arguments_come_from_the_stubs_command_line() -> None:
    argv = [f"/x/{STUB}", "/r/m/1/model.py", "region_1", "1048576", "1048576", "4242", "/lib"]
    assert stub_arguments("\0".join(argv).encode() + b"\0") == (4242, "region_1")
    assert stub_arguments(b"/usr/bin/python3\0-m\0pytest\0") is None
    assert stub_arguments("\0".join(argv).replace("region_1", "../x").encode()) is None


@pytest.mark.parametrize(
    "stub_mode",
    [
        # The stub hangs on (issue 23): the watcher removes the region and ends the stub.
        "forever",
        # As python_backend's stub, which checks its server every 300 ms: it exits by itself
        # within 10 ms, before the watcher's 250 ms look; the watcher, ended with it, still
        # removes the region.
        "follows",
    ],
)
def test_a_killed_server_takes_its_stub_and_region_with_it(
    tmp_path: Path, region: str, stub_mode: str
) -> None:
    server, stub = start_server(tmp_path, region, stub_mode)
    try:
        watcher = the_watcher_of(stub)
        server.kill()  # tritonserver crashes: nobody is left to end the stub
        deadline = time.monotonic() + 5
        while any((alive(stub), alive(watcher), (SHM / region).exists())) and (
            time.monotonic() < deadline
        ):
            time.sleep(0.05)
        assert not alive(stub)
        assert not (SHM / region).exists()
        assert not alive(watcher)
    finally:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()


def test_a_stub_that_ends_ends_its_watcher_and_leaves_the_region(
    tmp_path: Path, region: str
) -> None:
    """Triton restarts and unloads stubs itself: their regions are its own to manage."""
    server, stub = start_server(tmp_path, region, "briefly")
    try:
        watcher = the_watcher_of(stub)
        deadline = time.monotonic() + 10
        while alive(watcher) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(watcher)
        assert (SHM / region).exists()
        assert alive(server.pid)
    finally:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()


def test_the_launcher_removes_only_its_own_regions(region: str) -> None:
    prefix = region.removesuffix("region")
    other = f"{SHM_PREFIX}tritonbox-test-{secrets.token_hex(4)}_region"
    (SHM / other).write_bytes(b"")
    try:
        assert remove_shm_regions(prefix) == [region]
        assert (SHM / other).exists()
        with pytest.raises(ValueError, match="not a prefix of ours"):
            remove_shm_regions(SHM_PREFIX)  # every Triton's regions: never
    finally:
        (SHM / other).unlink(missing_ok=True)


def test_each_rank_gets_its_own_prefix(trtllm: TritonSettings) -> None:
    settings = trtllm.model_copy(update={"tensor_parallelism": 2})
    prefixes = [
        next(a for a in server_arguments(settings, Path("/r"), None, rank, "P_") if "shm" in a)
        for rank in (0, 1)
    ]
    assert prefixes == [
        "--backend-config=python,shm-region-prefix-name=P_0_",
        "--backend-config=python,shm-region-prefix-name=P_1_",
    ]
