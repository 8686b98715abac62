"""The `triton` container stopped and crashed (issue 23), a phase of scripts/test_compose.

`docker compose stop triton` while a prediction generates: the container exits on its own
(code 0) before Docker's 10 s stop timeout would kill it, the api says not ready and saves the
prediction as failed, and after `start` everything serves again. `kill -9` of tritonserver
inside the container: the launcher ends the stubs and exits, Docker restarts the container
(`restart: unless-stopped`) within 10 s, the api is not ready meanwhile, saves the prediction as
failed, and recovers. After each, the
container holds one tritonserver, its stubs (each with its watcher), no zombie (tini is PID 1:
`init: true`), and as many shared-memory regions as stubs.
"""

from __future__ import annotations

import time

import httpx
from tests.compose.docker_engine import docker
from tests.compose.stack import Checks, Stack, predict
from tritonbox_testing.stack_traffic import Generation

LONG = {"prompt": "Tell me a very long story about a dragon.", "max_tokens": 400, "min_tokens": 400}
STUB = "triton_python_backend_stub"
# Run inside the triton container (its image has Python, not procps): SIGKILL tritonserver.
KILL_TRITONSERVER = """
import os, signal
for pid in filter(str.isdigit, os.listdir("/proc")):
    argv = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\\0")
    if argv[0].endswith(b"/tritonserver"):
        os.kill(int(pid), signal.SIGKILL)
        print(pid)
"""


def stop_phase(checks: Checks, stack: Stack) -> None:
    """Both checks; each leaves the stack healthy again for the phases after it."""
    checks.check("triton: compose stop mid-generation, then start", lambda: compose_stop(stack))
    checks.check("triton: kill -9 tritonserver, then a restart", lambda: kill_tritonserver(stack))


def streaming(stack: Stack) -> Generation:
    """A long streamed prediction, generating; read on a thread until it ends however it ends."""
    generation = Generation(stack.api, prediction_input=LONG, headers=stack.auth)
    generation.wait_started(120)
    return generation


def ready(stack: Stack) -> bool:
    try:
        return httpx.get(f"{stack.api}/readyz", timeout=5).status_code == 200
    except httpx.TransportError:
        return False


def wait_until(what: str, condition: object, timeout_s: float) -> float:
    """Seconds until `condition()` is true; AssertionError naming `what` after `timeout_s`."""
    assert callable(condition)
    start = time.monotonic()
    while not condition():
        assert time.monotonic() - start < timeout_s, f"{what}: not after {timeout_s:.0f} s"
        time.sleep(0.5)
    return time.monotonic() - start


def row_status(stack: Stack, prediction_id: str) -> str:
    url = f"{stack.api}/v1/predictions/{prediction_id}"
    return str(httpx.get(url, headers=stack.auth, timeout=30).json()["status"])


def inspect(container: str, template: str) -> str:
    return docker("inspect", "-f", template, container).strip()


def clean_container(stack: Stack) -> str:
    """One tritonserver, a watcher per stub, no zombie, a shared-memory region per stub."""
    container = stack.container("triton")
    table = docker("top", container, "-eo", "pid,stat,args").splitlines()[1:]
    rows = [line.split(None, 2) for line in table]
    zombies = [row for row in rows if row[1].startswith("Z")]
    servers = [row for row in rows if row[2].split(" ", 1)[0].endswith("/tritonserver")]
    stubs = [row for row in rows if row[2].split(" ", 1)[0].endswith(STUB)]
    watchers = [row for row in rows if "parent_watch.py" in row[2]]
    assert not zombies and len(servers) == 1, table
    assert stubs and len(watchers) == len(stubs), table
    regions = docker("exec", container, "ls", "/dev/shm").split()
    assert len(regions) == len(stubs), (regions, table)
    return f"{len(rows)} processes, {len(stubs)} stubs and regions, no zombie"


def compose_stop(stack: Stack) -> str:
    generation = streaming(stack)
    container = stack.container("triton")
    began = time.monotonic()
    stack.compose("stop", "triton")
    stopped_s = time.monotonic() - began
    try:
        state = inspect(container, "{{.State.Status}} {{.State.ExitCode}}")
        assert state == "exited 0", f"{state} after {stopped_s:.1f} s (137: Docker killed it)"
        assert stopped_s < 10, f"stopped in {stopped_s:.1f} s"
        wait_until("the api says not ready", lambda: not ready(stack), 30)
        wait_until("the row ended", lambda: row_status(stack, generation.id) != "processing", 30)
        status = row_status(stack, generation.id)
        assert status in {"failed", "canceled"}, status
    finally:  # started again whatever failed: the phases after this one need it
        stack.compose("start", "triton")
    back_s = wait_until("the api ready again", lambda: ready(stack), 900)
    predict(stack)
    return (
        f"exited 0 in {stopped_s:.1f} s, row {status}, ready again {back_s:.0f} s after start; "
        f"{clean_container(stack)}"
    )


def kill_tritonserver(stack: Stack) -> str:
    generation = streaming(stack)  # a request mid-generation, as when a real crash happens
    container = stack.container("triton")
    restarts = int(inspect(container, "{{.RestartCount}}"))
    killed = docker("exec", container, "python3", "-c", KILL_TRITONSERVER).split()
    began = time.monotonic()
    assert len(killed) == 1, killed
    not_ready_s = wait_until("the api says not ready", lambda: not ready(stack), 30)
    # The launcher ends the stubs and exits, so the container ends and Docker restarts it:
    # within the 10 s a stop is allowed (Docker's own restart delay comes on top).
    wait_until(
        "Docker restarted the container",
        lambda: int(inspect(container, "{{.RestartCount}}")) > restarts,
        60,
    )
    restarted_s = time.monotonic() - began
    assert restarted_s < 10 + 1, f"restarted {restarted_s:.1f} s after the kill"
    wait_until("the row ended", lambda: row_status(stack, generation.id) != "processing", 30)
    status = row_status(stack, generation.id)
    assert status == "failed", status
    back_s = wait_until("the api ready again", lambda: ready(stack), 900)
    predict(stack)
    return (
        f"api not ready after {not_ready_s:.0f} s, container restarted {restarted_s:.1f} s "
        f"after the kill, row {status}, ready again {back_s:.0f} s later; "
        f"{clean_container(stack)}"
    )
