"""Run the real `tritonserver` natively: the binary shipped in the `nvidia-pytriton` wheel, on CPU.

The wheel holds a full Triton (2.51): the server, its libraries, the Python backend and one
backend stub per Python version. Three details make it work in a virtual environment
(DESIGN.md §7): the stub for the running Python is put next to `libtriton_python.so`; the
interpreter's own libpython comes first on `LD_LIBRARY_PATH` (Debian's copy is otherwise found
first and `ssl` fails to import inside models); and the environment's `bin/` comes first on
`PATH`, so the stub runs with this environment's packages.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Self

from .settings import TritonSettings

log = logging.getLogger(__name__)

ENSEMBLE_MODELS = ("preprocessing", "tensorrt_llm", "postprocessing", "ensemble")


class TritonServerError(RuntimeError):
    """The server could not be started or did not become ready; the message says why."""


def wheel_dir() -> Path:
    spec = importlib.util.find_spec("pytriton")
    if spec is None or spec.origin is None:
        raise TritonServerError("nvidia-pytriton is not installed: run scripts/install")
    return Path(spec.origin).parent / "tritonserver"


def backends_dir(cache_dir: Path) -> Path:
    """A backend directory whose python backend has the stub for this interpreter."""
    source = wheel_dir()
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = source / "python_backend_stubs" / version / "triton_python_backend_stub"
    if not stub.is_file():
        raise TritonServerError(f"the Triton wheel has no Python backend stub for Python {version}")
    target = cache_dir.resolve() / "triton_backends"
    python = target / "python"
    python.mkdir(parents=True, exist_ok=True)
    for item in (source / "backends" / "python").iterdir():
        if item.is_file():
            shutil.copy2(item, python / item.name)
    shutil.copy2(stub, python / stub.name)
    return target


def server_environment(base: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    libs = wheel_dir().parent.parent / "nvidia_pytriton.libs"
    libdir = sysconfig.get_config_var("LIBDIR") or ""
    paths = [libdir, str(libs), env.get("LD_LIBRARY_PATH", "")]
    env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in paths if p)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    # The repo's top-level `triton/` folder must never shadow OpenAI's `triton` package.
    env["PYTHONSAFEPATH"] = "1"
    return env


class TritonServer:
    """One `tritonserver` process serving a rendered model repository."""

    def __init__(self, settings: TritonSettings, *, model_repository: Path | None = None) -> None:
        self.settings = settings
        self.model_repository = (model_repository or settings.resolved_model_repository).resolve()
        self.cache_dir = settings.cache_dir.resolve()
        self.log_path = self.cache_dir / "logs" / f"tritonserver-{settings.triton_grpc_port}.log"
        self._process: subprocess.Popen[bytes] | None = None

    def command(self, backend_directory: Path) -> list[str]:
        s = self.settings
        return [
            str(wheel_dir() / "bin" / "tritonserver"),
            f"--model-repository={self.model_repository}",
            f"--backend-directory={backend_directory}",
            f"--http-address={s.triton_host}",
            f"--http-port={s.triton_http_port}",
            f"--grpc-address={s.triton_host}",
            f"--grpc-port={s.triton_grpc_port}",
            f"--metrics-address={s.triton_host}",
            f"--metrics-port={s.triton_metrics_port}",
            f"--log-verbose={s.triton_log_verbose}",
            # Open streams hold shutdown for this long; the default (30 s) stalls restarts.
            "--exit-timeout-secs=5",
        ]

    def start(self) -> None:
        if self.is_alive():
            return
        command = self.command(backends_dir(self.cache_dir))
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log.info("starting %s", " ".join(command))
        with self.log_path.open("wb") as output:
            self._process = subprocess.Popen(
                command,
                stdout=output,
                stderr=subprocess.STDOUT,
                env=server_environment(),
                cwd=self.cache_dir,  # never the repo root: see server_environment()
                start_new_session=True,
            )

    def is_alive(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def _get(self, path: str) -> bool:
        try:
            with urllib.request.urlopen(self.settings.http_url + path, timeout=2) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def is_ready(self) -> bool:
        return self._get("/v2/health/ready") and all(
            self._get(f"/v2/models/{model}/ready") for model in ENSEMBLE_MODELS
        )

    def log_tail(self, lines: int = 30) -> str:
        if not self.log_path.is_file():
            return "(no server log)"
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.is_ready():
                return
            if self._process is not None and self._process.poll() is not None:
                raise TritonServerError(
                    f"tritonserver exited with code {self._process.returncode} before it was "
                    f"ready; the end of {self.log_path}:\n{self.log_tail()}"
                )
            time.sleep(0.5)
        raise TritonServerError(
            f"tritonserver was not ready after {timeout_s:.0f} s (TRITON_READY_TIMEOUT_S); "
            f"the end of {self.log_path}:\n{self.log_tail()}"
        )

    def stop(self, grace_s: float = 15.0) -> None:
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(grace_s)
        except subprocess.TimeoutExpired:
            log.warning("tritonserver did not stop in %.0f s; killing it", grace_s)
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()
