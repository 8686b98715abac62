"""Run the real playground (`tritonbox-playground serve`, Gradio in its own process) for tests."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from tritonbox_api.settings import ApiSettings
from tritonbox_playground.settings import PlaygroundSettings

PLAYGROUND_EXECUTABLE = Path(sys.executable).parent / "tritonbox-playground"


@dataclass
class RunningPlayground:
    port: int
    log_path: Path
    process: subprocess.Popen[bytes]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def launch_playground(api_url: str, folder: Path, port: int, **settings: str) -> RunningPlayground:
    """Start a playground on `port` in front of the api at `api_url`; wait until it serves."""
    ours = set(PlaygroundSettings.model_fields) | set(ApiSettings.model_fields)
    env = {key: value for key, value in os.environ.items() if key.lower() not in ours}
    env.update(
        PYTHONSAFEPATH="1",
        GRADIO_ANALYTICS_ENABLED="False",
        GRADIO_TEMP_DIR=str(folder / "gradio"),
        API_URL=api_url,
        PLAYGROUND_PORT=str(port),
    )
    env.update({key.upper(): value for key, value in settings.items()})
    folder.mkdir(parents=True, exist_ok=True)
    log_path = folder / "playground.log"
    with log_path.open("ab") as log:
        process = subprocess.Popen(
            [str(PLAYGROUND_EXECUTABLE), "serve", "--env-file", "/nonexistent/.env"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=folder,
        )
    running = RunningPlayground(port=port, log_path=log_path, process=process)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the playground exited:\n{log_path.read_text()[-3000:]}")
        try:
            if httpx.get(f"{running.url}/gradio_api/info", timeout=2).status_code in (200, 401):
                return running
        except httpx.TransportError:
            pass
        time.sleep(0.3)
    running.stop()
    raise RuntimeError(f"the playground did not start:\n{log_path.read_text()[-3000:]}")
