"""What the `tritonserver` of the `nvidia-pytriton` wheel needs around it (docs/architecture.md,
"Facts about the platform").

The wheel holds a full Triton (2.51): the server, its libraries, the Python backend and one
backend stub per Python version. Three details make it work in a virtual environment: the stub
for the running Python is put next to `libtriton_python.so`; the interpreter's own libpython
comes first on `LD_LIBRARY_PATH` (Debian's copy is otherwise found first and `ssl` fails to
import inside models); and the environment's `bin/` comes first on `PATH`, so the stub runs with
this environment's packages.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import importlib.util
import os
import secrets
import shutil
import signal
import socket
import sys
import sysconfig
from collections.abc import Callable
from pathlib import Path

from .settings import TritonSettings

_PR_SET_PDEATHSIG = 1
SHM = Path("/dev/shm")
# Triton's own prefix for its Python-backend regions; ours extends it, so that the usual
# `triton_python_backend_shm_region_*` still finds them.
SHM_PREFIX = "triton_python_backend_shm_region_"


class TritonServerError(RuntimeError):
    """The server could not be started or did not become ready; the message says why."""


def wheel_dir() -> Path:
    """`pytriton/tritonserver` inside the installed nvidia-pytriton wheel (found, not imported)."""
    spec = importlib.util.find_spec("pytriton")
    if spec is None or spec.origin is None:
        raise TritonServerError("nvidia-pytriton is not installed: run scripts/install")
    return Path(spec.origin).parent / "tritonserver"


def _install(source: Path, target: Path) -> None:
    """Copy `source` to `target` unless an identical copy is there, replacing it atomically.

    A running tritonserver maps these files: rewriting one in place (as a plain copy does) would
    crash it with SIGBUS, and a test session shares the cache dir with `scripts/up`.
    """
    stat = source.stat()
    if target.is_file():
        current = target.stat()
        if current.st_size == stat.st_size and int(current.st_mtime) == int(stat.st_mtime):
            return
    partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
    shutil.copy2(source, partial)
    os.replace(partial, target)


def install_backends(target: Path) -> Path:
    """Make `target` a backend directory whose python backend has this interpreter's stub."""
    source = wheel_dir()
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = source / "python_backend_stubs" / version / "triton_python_backend_stub"
    if not stub.is_file():
        raise TritonServerError(f"the Triton wheel has no Python backend stub for Python {version}")
    python = target / "python"
    python.mkdir(parents=True, exist_ok=True)
    for item in (source / "backends" / "python").iterdir():
        if item.is_file():
            _install(item, python / item.name)
    _install(stub, python / stub.name)
    return target


def server_environment(
    base: dict[str, str] | None = None, *, bundled: bool = True
) -> dict[str, str]:
    """The environment tritonserver and its Python backend stubs need (`base`: os.environ).

    `bundled`: the wheel's binary, which needs its libraries and this Python's libpython; NVIDIA's
    image is set up for its own binary already.
    """
    env = dict(os.environ if base is None else base)
    # The repo's top-level `triton/` folder must never shadow OpenAI's `triton` package.
    env["PYTHONSAFEPATH"] = "1"
    if not bundled:
        return env
    libs = wheel_dir().parent.parent / "nvidia_pytriton.libs"
    libdir = sysconfig.get_config_var("LIBDIR") or ""
    paths = [libdir, str(libs), env.get("LD_LIBRARY_PATH", "")]
    env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in paths if p)
    # Not resolved: in a venv `python` is a link and its folder is the venv's bin/.
    env["PATH"] = os.pathsep.join(
        p for p in (str(Path(sys.executable).parent), env.get("PATH", "")) if p
    )
    return env


def check_ports_free(settings: TritonSettings) -> None:
    """Fail fast on a port in use: Triton would load every model first and only then exit, and
    our readiness polls could meanwhile be answered by whatever server holds the HTTP port."""
    for key, port in (
        ("TRITON_HTTP_PORT", settings.triton_http_port),
        ("TRITON_GRPC_PORT", settings.triton_grpc_port),
        ("TRITON_METRICS_PORT", settings.triton_metrics_port),
    ):
        family = socket.AF_INET6 if ":" in settings.triton_host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            # SO_REUSEADDR: a port whose old connections are in TIME_WAIT is free for Triton too.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((settings.triton_host, port))
            except OSError as error:
                reason = "in use" if error.errno == errno.EADDRINUSE else str(error)
                raise TritonServerError(
                    f"{key}={port} on {settings.triton_host}: {reason}; stop what listens there "
                    f"or choose another port"
                ) from error


def die_with_parent(signum: signal.Signals = signal.SIGKILL) -> Callable[[], None]:
    """A preexec_fn: if the launcher is killed outright, the child gets `signum` instead of
    holding its ports and memory. Tied to the thread that started it (see TritonServer.start).

    SIGKILL for tritonserver: nobody is left to end a server whose graceful stop hangs, and its
    Python-backend stubs and their shared memory go with it (tritonbox_triton.parent_watch).
    """
    # Looked up here, in the parent: the child only calls it (no dlopen between fork and exec).
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    parent = os.getpid()

    def set_signal() -> None:
        prctl(_PR_SET_PDEATHSIG, signum)
        if os.getppid() != parent:  # the launcher died before the signal was armed
            os.kill(os.getpid(), signum)

    return set_signal


def new_shm_prefix() -> str:
    """A prefix for one server's Python-backend regions that no other server shares."""
    return f"{SHM_PREFIX}tritonbox-{os.getpid()}-{secrets.token_hex(4)}_"


def remove_shm_regions(prefix: str) -> list[str]:
    """Remove the shared-memory regions whose names start with `prefix` (a server's, once its
    processes are gone: a killed server never removes them itself); their names."""
    if not prefix.startswith(f"{SHM_PREFIX}tritonbox-"):
        raise ValueError(f"not a prefix of ours: {prefix!r}")  # never anyone else's regions
    removed = []
    for path in SHM.glob(f"{prefix}*"):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
            removed.append(path.name)
    return removed
