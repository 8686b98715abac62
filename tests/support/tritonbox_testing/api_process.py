"""Run the real api (`tritonbox-api serve`, uvicorn in its own process) for tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from tritonbox_testing.ports import free_port

from tritonbox_api.settings import ApiSettings

API_EXECUTABLE = Path(sys.executable).parent / "tritonbox-api"


@dataclass
class RunningApi:
    """One api process; tests may kill and restart it (with the same database and port)."""

    env: dict[str, str]
    port: int
    database_path: Path
    log_path: Path
    process: subprocess.Popen[bytes] | None = None
    _logs: list[Path] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 60.0, **overrides: str) -> None:
        env = {**self.env, **{key.upper(): value for key, value in overrides.items()}}
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [str(API_EXECUTABLE), "serve", "--env-file", "/nonexistent/.env"],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.database_path.parent,
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the api exited:\n{self.log_path.read_text()[-3000:]}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"the api did not start:\n{self.log_path.read_text()[-3000:]}")

    def stop(self, sig: signal.Signals = signal.SIGTERM) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def wait_ready(self, timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/readyz", timeout=5).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.3)
        raise RuntimeError("the api did not become ready")


def api_environment(triton: Any, **values: str) -> dict[str, str]:
    """The process environment minus any TritonBox setting a developer exported, plus `values`."""
    env = {
        key: value
        for key, value in os.environ.items()
        if key.lower() not in ApiSettings.model_fields
    }
    env["PYTHONSAFEPATH"] = "1"
    env["TRITON_URL"] = triton.grpc_url
    env.update({key.upper(): value for key, value in values.items()})
    return env


def launch_api(triton: Any, folder: Path, **settings: str) -> RunningApi:
    """Start an api process on a free port with its own SQLite file in `folder`."""
    port = free_port()
    defaults = {
        "api_port": str(port),
        "database_path": str(folder / "predictions.db"),
        "public_url": f"http://127.0.0.1:{port}",
        "playground_url": "http://127.0.0.1:7860",
        # Tests make their adapters in pytest's temporary folders, all under this one.
        "adapter_dirs": tempfile.gettempdir(),
    }
    running = RunningApi(
        env=api_environment(triton, **(defaults | settings)),
        port=port,
        database_path=folder / "predictions.db",
        log_path=folder / "api.log",
    )
    running.start()
    return running
