"""Run the whole stack natively: Triton, the api and the playground, each its own process.

Started by `scripts/up`. Each service is its own CLI (the same ones the containers run); this
supervisor starts them, prints where they listen once the api is ready, and stops all of them
on Ctrl-C, on SIGTERM, or as soon as one of them exits.

Nothing outlives it (issue 23): each service runs in a process group of its own, asked to stop
with SIGTERM (which every service handles, also when a background start left SIGINT ignored)
and then killed as a group; each gets SIGTERM from the kernel should this supervisor be killed
outright (PR_SET_PDEATHSIG), and tritonbox-triton ends tritonserver, its stubs and their shared
memory in turn.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType
from typing import Any

import httpx

from tritonbox_api.settings import ApiSettings
from tritonbox_triton.server import STOP_GRACE_S
from tritonbox_triton.server_setup import die_with_parent

BIN = Path(sys.executable).parent
SERVICES = ("triton", "api", "playground")
# Stopped in this order, each step given this long before its process groups are killed: the api
# first, so that it stops its predictions' engine requests and saves their rows while Triton
# still serves (uvicorn ends open responses after 5 s); Triton's launcher kills a stuck server
# after STOP_GRACE_S and then removes its shared memory.
STOP_STEPS = ((("api", "playground"), 8.0), (("triton",), STOP_GRACE_S + 2.0))


def _start(command: list[str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        command,
        env=os.environ,
        # Own process groups: a Ctrl-C reaches only this supervisor, which stops them in order,
        # and a service's whole group (uvicorn's workers, say) can be killed at the end.
        start_new_session=True,
        # Killed outright, this supervisor still stops them: the kernel sends SIGTERM.
        preexec_fn=die_with_parent(signal.SIGTERM),
    )


def _stop(processes: dict[str, subprocess.Popen[bytes]]) -> None:
    try:
        for names, grace_s in STOP_STEPS:
            step = [processes[name] for name in names if name in processes]
            for process in step:
                if process.poll() is None:
                    process.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + grace_s
            for process in step:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(max(0.1, deadline - time.monotonic()))
    finally:  # also after a second Ctrl-C: nothing of a service stays behind
        for process in processes.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def _wait_ready(url: str, processes: dict[str, subprocess.Popen[bytes]], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if any(process.poll() is not None for process in processes.values()):
            return False
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return True
        except httpx.TransportError:
            pass
        time.sleep(1)
    return False


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--env-file", type=Path, default=Path(".env"))
    parser.add_argument("--without", choices=SERVICES[1:], action="append", default=[])
    args = parser.parse_args()
    factory: Any = ApiSettings
    api: ApiSettings = factory(_env_file=args.env_file)
    signal.signal(signal.SIGTERM, _interrupt)
    processes: dict[str, subprocess.Popen[bytes]] = {}
    try:
        for name in SERVICES:
            if name in args.without:
                continue
            command = [str(BIN / f"tritonbox-{name}"), "serve", "--env-file", str(args.env_file)]
            processes[name] = _start(command)
        local_api = f"http://127.0.0.1:{api.api_port}"
        if not _wait_ready(f"{local_api}/readyz", processes, timeout_s=900):
            failed = [name for name, p in processes.items() if p.poll() is not None]
            print(f"scripts/up: {', '.join(failed) or 'the api'} did not start; see above.")
            return 1
        print("\nTritonBox is ready:", flush=True)
        print(f"  api         {api.public_url}  (OpenAPI docs: {api.public_url}/docs)")
        if "playground" in processes:
            print(f"  playground  {api.playground_url}")
        print("Press Ctrl-C to stop.", flush=True)
        while all(process.poll() is None for process in processes.values()):
            time.sleep(1)
        exited = [name for name, p in processes.items() if p.poll() is not None]
        print(f"scripts/up: {', '.join(exited)} exited; stopping the rest.", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\nscripts/up: stopping", file=sys.stderr)
        return 0
    finally:
        _stop(processes)


if __name__ == "__main__":
    sys.exit(main())
