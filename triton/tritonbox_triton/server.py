"""Run the real `tritonserver`: the binary shipped in the `nvidia-pytriton` wheel (CPU, natively
and in the cpu image), or NVIDIA's own (TRITONSERVER_BIN, the GPU image).

`server_setup` prepares what the wheel's binary needs (backend directory, environment) and checks
the ports; `launch` builds the command line (one rank per GPU under mpirun); this module owns the
process: start, readiness with a time-out, logs, and a stop that leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Self

from tritonbox_common.ensemble import READY_MODELS

from .launch import EXIT_TIMEOUT_S, server_command
from .server_setup import (
    TritonServerError,
    check_ports_free,
    die_with_parent,
    install_backends,
    new_shm_prefix,
    remove_shm_regions,
    server_environment,
    wheel_dir,
)
from .settings import TritonSettings

__all__ = ["TritonServer", "TritonServerError"]

log = logging.getLogger(__name__)

# Readiness polls go straight to the server: an http_proxy in the environment must not see them.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))
# A server that has not left this long after SIGTERM (which ends open streams after
# --exit-timeout-secs) is stuck: it is killed.
STOP_GRACE_S = EXIT_TIMEOUT_S + 3.0


class TritonServer:
    """One `tritonserver` process (in its own process group) serving a model repository."""

    def __init__(
        self,
        settings: TritonSettings,
        *,
        model_repository: Path | None = None,
        log_path: Path | None = None,
    ) -> None:
        self.settings = settings
        self.model_repository = (model_repository or settings.resolved_model_repository).resolve()
        self.cache_dir = settings.cache_dir.resolve()
        self.backend_directory = self.cache_dir / "triton_backends"
        default_log = self.cache_dir / "logs" / f"tritonserver-{settings.triton_grpc_port}.log"
        self.log_path = (log_path or default_log).resolve()
        # The wheel's binary needs its backends copied next to this Python's stub (server_setup);
        # NVIDIA's image brings its own backend directory, TensorRT-LLM's backend included.
        self.bundled = settings.tritonserver_bin is None
        self.executable = settings.tritonserver_bin or wheel_dir() / "bin" / "tritonserver"
        # Its Python-backend regions' names begin with this: what a killed server leaves in
        # /dev/shm is removed by stop(), and only that.
        self.shm_prefix = new_shm_prefix()
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def local_http_url(self) -> str:
        """Where this machine reaches the HTTP port (a wildcard listen address is not one)."""
        host = {"0.0.0.0": "127.0.0.1", "::": "[::1]"}.get(self.settings.triton_host)
        host = host or self.settings.triton_host
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"
        return f"http://{host}:{self.settings.triton_http_port}"

    @property
    def returncode(self) -> int | None:
        """The exit code once the process has ended; None while it runs or before start()."""
        return None if self._process is None else self._process.poll()

    def command(self) -> list[str]:
        return server_command(
            self.settings,
            executable=self.executable,
            model_repository=self.model_repository,
            backend_directory=self.backend_directory if self.bundled else None,
            shm_prefix=self.shm_prefix,
        )

    def start(self) -> None:
        """Start the server (no-op while it runs); output goes to `log_path`, truncated first.

        Call it from a thread that outlives the server: the kernel kills the server when the
        thread that forked it ends (so a launcher killed outright leaves no server behind).
        """
        if self.is_alive():
            return
        check_ports_free(self.settings)
        if self.bundled:
            install_backends(self.backend_directory)
        command = self.command()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log.info("starting %s (log: %s)", " ".join(command), self.log_path)
        with self.log_path.open("wb") as output:
            self._process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                env=server_environment(bundled=self.bundled),
                # Never the repo root: its `triton/` folder would shadow the `triton` package.
                cwd=self.cache_dir,
                # Own process group: stop() signals the server and its backend stubs together,
                # and a Ctrl-C in the terminal reaches only the launcher, which then stops it.
                start_new_session=True,
                preexec_fn=die_with_parent(),
            )

    def is_alive(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def _ok(self, path: str) -> bool:
        try:
            with _OPENER.open(self.local_http_url + path, timeout=2) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def is_ready(self) -> bool:
        """Server ready and every model of the ensemble loaded and ready."""
        return self._ok("/v2/health/ready") and all(
            self._ok(f"/v2/models/{model}/ready") for model in READY_MODELS
        )

    def log_tail(self, lines: int = 30) -> str:
        if not self.log_path.is_file():
            return "(no server log)"
        with self.log_path.open("rb") as stream:
            stream.seek(max(0, stream.seek(0, os.SEEK_END) - 64 * 1024))
            text = stream.read().decode(errors="replace")
        return "\n".join(text.splitlines()[-lines:])

    def wait_ready(self, timeout_s: float) -> None:
        """Block until is_ready(); raise TritonServerError (with the log's tail) when the process
        ends first or `timeout_s` passes."""
        if self._process is None:
            raise TritonServerError("tritonserver was not started")
        deadline = time.monotonic() + timeout_s
        while True:
            # The exit check comes first: another server on our HTTP port must not pass for us.
            code = self._process.poll()
            if code is not None:
                raise TritonServerError(
                    f"tritonserver exited with code {code} before it was ready; "
                    f"the end of {self.log_path}:\n{self.log_tail()}"
                )
            if self.is_ready():
                log.info("tritonserver is ready at %s", self.local_http_url)
                return
            if time.monotonic() >= deadline:
                raise TritonServerError(
                    f"tritonserver (still running) was not ready after {timeout_s:.0f} s "
                    f"(TRITON_READY_TIMEOUT_S); the end of {self.log_path}:\n{self.log_tail()}"
                )
            time.sleep(0.5)

    def _signal_group(self, process: subprocess.Popen[bytes], signum: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):  # the whole group has already exited
            os.killpg(process.pid, signum)

    def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        """SIGTERM to the process group, SIGKILL after `grace_s`, then the shared memory a
        killed server leaves. Idempotent; also after the server ended by itself (a crash).

        A second Ctrl-C while waiting kills at once rather than leaving the server behind.
        """
        process = self._process
        if process is None:
            return
        try:
            if process.poll() is None:
                log.info("stopping tritonserver (pid %d)", process.pid)
                self._signal_group(process, signal.SIGTERM)
                try:
                    process.wait(grace_s)
                except subprocess.TimeoutExpired:
                    log.warning("tritonserver did not stop in %.0f s; killing it", grace_s)
        finally:
            # Also ends backend stubs that outlived the server.
            self._signal_group(process, signal.SIGKILL)
            process.wait()
            self._process = None
            removed = remove_shm_regions(self.shm_prefix)
            if removed:
                log.info("removed %d shared-memory region(s) the server left", len(removed))

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
