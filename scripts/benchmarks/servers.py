"""The servers the benchmarks start: a tritonserver with the synthetic or the cpu engine, api
processes (`tritonbox-api serve`), or the whole native stack through `scripts/up`; each stopped
when the benchmark's ExitStack unwinds."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
from scripts.benchmarks.proc import stop_group
from tritonbox_testing.ports import free_ports

from tritonbox_api.settings import ApiSettings
from tritonbox_triton.render import render_repository
from tritonbox_triton.server import TritonServer
from tritonbox_triton.settings import TritonSettings

REPO = Path(__file__).resolve().parents[2]
API_EXECUTABLE = Path(sys.executable).parent / "tritonbox-api"


def _serve(stack: contextlib.ExitStack, folder: Path, **values: Any) -> TritonSettings:
    """A tritonserver on free ports with these TritonSettings `values`, no .env; stopped when
    `stack` unwinds."""
    for name in TritonSettings.model_fields:  # a developer's exported settings must not leak in
        os.environ.pop(name.upper(), None)
    http, grpc, metrics = free_ports(3)
    factory: Any = TritonSettings  # `_env_file=None`: ignore the repo's .env
    settings: TritonSettings = factory(
        _env_file=None, cache_dir=REPO / ".cache", model_repository=folder / "model_repository",
        triton_http_port=http, triton_grpc_port=grpc, triton_metrics_port=metrics, **values,
    )  # fmt: skip
    render_repository(settings)
    server = TritonServer(settings, log_path=folder / "tritonserver.log")
    stack.callback(server.stop)
    server.start()
    server.wait_ready(settings.triton_ready_timeout_s)
    return settings


def start_triton(
    stack: contextlib.ExitStack, folder: Path, interval: float, max_batch_size: int = 64
) -> TritonSettings:
    """The synthetic engine: a token every `interval` s per request, no model."""
    return _serve(
        stack, folder, engine="synthetic", synthetic_token_interval_s=interval,
        max_input_len=512, max_output_len=1024, max_batch_size=max_batch_size,
    )  # fmt: skip


def start_cpu_engine(
    stack: contextlib.ExitStack, folder: Path, batch_size: int, **values: Any
) -> TritonSettings:
    """The cpu engine with the default model (and these TritonSettings `values`)."""
    return _serve(stack, folder, engine="cpu", max_batch_size=batch_size, **values)


def start_api(
    stack: contextlib.ExitStack,
    folder: Path,
    triton_url: str,
    env: dict[str, str],
    profile: Path | None = None,
) -> tuple[str, int]:
    """An api process on a free port with its own SQLite file unless `env` names DATABASE_URL
    (`env` is added to the api's settings); its URL and pid once ready. `profile`: run it under
    cProfile, writing this file."""
    folder.mkdir(parents=True)
    port = free_ports(1)[0]
    url = f"http://127.0.0.1:{port}"
    environment = {k: v for k, v in os.environ.items() if k.lower() not in ApiSettings.model_fields}
    environment |= {
        "PYTHONSAFEPATH": "1", "TRITON_URL": triton_url, "API_PORT": str(port),
        "PUBLIC_URL": url, "DATABASE_PATH": str(folder / "predictions.db"),
        "MAX_CONCURRENT_REQUESTS": "256", **env,
    }  # fmt: skip
    command = [str(API_EXECUTABLE), "serve", "--env-file", "/nonexistent/.env"]
    if profile is not None:  # the event loop runs on the main thread: cProfile sees the hot path
        command = [sys.executable, "-m", "cProfile", "-o", str(profile), *command]
    with (folder / "api.log").open("wb") as out:
        process = subprocess.Popen(
            command, env=environment, stdout=out, stderr=subprocess.STDOUT, cwd=folder
        )

    def stop() -> None:
        if process.poll() is None:
            # uvicorn re-raises the signal once shut down: SIGINT ends in KeyboardInterrupt, which
            # still lets cProfile write its file (SIGTERM would not); the supervisor of several
            # workers passes it on to them.
            process.send_signal(signal.SIGINT)
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    stack.callback(stop)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and process.poll() is None:
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(f"{url}/readyz", timeout=5, trust_env=False).status_code == 200:
                return url, process.pid
        time.sleep(0.3)
    raise RuntimeError(f"the api did not start:\n{(folder / 'api.log').read_text()[-3000:]}")


def start_stack(
    stack: contextlib.ExitStack, folder: Path, values: dict[str, str]
) -> tuple[subprocess.Popen[bytes], str, float]:
    """The native stack as a user starts it, `scripts/up --without playground`, with an env file
    of these settings (`values`) and nothing else; the process, the api's URL and the seconds
    from the command to the api's ready (`/readyz`: Triton's engine loaded and the database
    writable). Stopped as Ctrl-C would stop it when `stack` unwinds."""
    folder.mkdir(parents=True, exist_ok=True)
    env_file = folder / "tritonbox.env"
    env_file.write_text("".join(f"{name}={value}\n" for name, value in values.items()))
    url = f"http://127.0.0.1:{values['API_PORT']}"
    names = {*TritonSettings.model_fields, *ApiSettings.model_fields}
    environment = {k: v for k, v in os.environ.items() if k.lower() not in names}
    started = time.monotonic()
    with (folder / "up.log").open("wb") as out:
        process = subprocess.Popen(
            [str(REPO / "scripts" / "up"), "--without", "playground", "--env-file", str(env_file)],
            env=environment, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    stack.callback(stop_group, process)
    while time.monotonic() - started < 300 and process.poll() is None:
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(f"{url}/readyz", timeout=5, trust_env=False).status_code == 200:
                return process, url, time.monotonic() - started
        time.sleep(0.2)
    raise RuntimeError(f"scripts/up did not start:\n{(folder / 'up.log').read_text()[-3000:]}")
