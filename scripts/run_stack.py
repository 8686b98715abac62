"""Run the whole stack natively: Triton, the api and the playground, each its own process.

Started by `scripts/up`. Each service is its own CLI (the same ones the containers run); this
supervisor starts them, prints where they listen once the api is ready, and stops all of them
on Ctrl-C, on SIGTERM, or as soon as one of them exits.
"""

from __future__ import annotations

import argparse
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

BIN = Path(sys.executable).parent
SERVICES = ("triton", "api", "playground")


def _stop(processes: dict[str, subprocess.Popen[bytes]]) -> None:
    # Reverse order: the playground and the api leave before the server they talk to.
    for name in reversed(list(processes)):
        if processes[name].poll() is None:
            processes[name].send_signal(signal.SIGINT)
    deadline = time.monotonic() + 20
    for process in processes.values():
        try:
            process.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()


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
            # Own process groups: a Ctrl-C reaches only this supervisor, which stops them in order.
            processes[name] = subprocess.Popen(command, env=os.environ, start_new_session=True)
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
