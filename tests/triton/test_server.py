"""TritonServer without Triton: the command, the environment, the backend directory, and the
process lifecycle driven by a stand-in `tritonserver` (a small Python HTTP server)."""

from __future__ import annotations

import os
import socket
import sys
import sysconfig
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tritonbox_testing.ports import free_ports

from tritonbox_common.ensemble import READY_MODELS
from tritonbox_triton.server import TritonServer, TritonServerError
from tritonbox_triton.server_setup import (
    check_ports_free,
    install_backends,
    server_environment,
    wheel_dir,
)
from tritonbox_triton.settings import TritonSettings

# Answers Triton's readiness routes; FAKE_TRITON_MODE makes it fail in the ways Triton does.
FAKE_TRITONSERVER = textwrap.dedent(
    """\
    import http.server, os, signal, subprocess, sys, time
    args = dict(a[2:].split("=", 1) for a in sys.argv[1:])
    mode = os.environ.get("FAKE_TRITON_MODE", "ok")
    print("fake tritonserver", " ".join(sys.argv[1:]), flush=True)
    if mode == "exit":
        print("E0000 failed to load model 'tensorrt_llm'", flush=True)
        sys.exit(3)
    if mode == "ignore_term":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    # Like a backend stub: a child in the server's process group that outlives a crash.
    child = subprocess.Popen(["sleep", "600"], start_new_session=False)
    with open(os.environ["FAKE_TRITON_CHILD"], "w") as pid_file:
        pid_file.write(str(child.pid))
    if mode == "hang":
        time.sleep(600)
    class Ready(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()
        def log_message(self, *args):
            pass
    server = http.server.HTTPServer(("127.0.0.1", int(args["http-port"])), Ready)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0)) if mode == "ok" else None
    server.serve_forever()
    """
)


def settings_for(tmp_path: Path, **values: Any) -> TritonSettings:
    http, grpc, metrics = free_ports(3)
    ports = {"triton_http_port": http, "triton_grpc_port": grpc, "triton_metrics_port": metrics}
    factory: Any = TritonSettings  # mypy does not know BaseSettings' `_env_file` option
    settings: TritonSettings = factory(
        _env_file=None, cache_dir=tmp_path / "cache", **{**ports, **values}
    )
    return settings


def process_gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state in {"Z", "X"}  # a zombie has ended; only its parent has not reaped it yet


@pytest.fixture
def fake(
    tmp_path: Path, clean_environment: None, monkeypatch: pytest.MonkeyPatch
) -> Iterator[TritonServer]:
    script = tmp_path / "tritonserver"
    script.write_text(f"#!{sys.executable}\n{FAKE_TRITONSERVER}")
    script.chmod(0o755)
    monkeypatch.setenv("FAKE_TRITON_CHILD", str(tmp_path / "child.pid"))
    server = TritonServer(settings_for(tmp_path), model_repository=tmp_path / "repository")
    server.executable = script
    yield server
    server.stop(grace_s=1)


def test_command_passes_the_settings(tmp_path: Path, clean_environment: None) -> None:
    settings = settings_for(tmp_path, triton_host="0.0.0.0", triton_log_verbose=2)
    server = TritonServer(settings, model_repository=tmp_path / "repository")
    command = server.command()
    assert command[0] == str(wheel_dir() / "bin" / "tritonserver")
    assert os.access(command[0], os.X_OK)
    cache = (tmp_path / "cache").resolve()
    assert set(command[1:]) == {
        f"--model-repository={(tmp_path / 'repository').resolve()}",
        f"--backend-directory={cache / 'triton_backends'}",
        "--http-address=0.0.0.0",
        f"--http-port={settings.triton_http_port}",
        "--grpc-address=0.0.0.0",
        f"--grpc-port={settings.triton_grpc_port}",
        "--metrics-address=0.0.0.0",
        f"--metrics-port={settings.triton_metrics_port}",
        "--log-verbose=2",
        # Its Python-backend regions carry a prefix of its own: stop() removes what it leaves.
        f"--backend-config=python,shm-region-prefix-name={server.shm_prefix}",
        "--exit-timeout-secs=5",
    }
    assert server.shm_prefix.startswith("triton_python_backend_shm_region_tritonbox-")
    assert server.shm_prefix != TritonServer(settings).shm_prefix
    # Readiness is polled where this machine reaches a wildcard listen address.
    assert server.local_http_url == f"http://127.0.0.1:{settings.triton_http_port}"
    assert server.log_path == cache / "logs" / f"tritonserver-{settings.triton_grpc_port}.log"


def test_model_repository_defaults_to_the_settings(tmp_path: Path, clean_environment: None) -> None:
    settings = settings_for(tmp_path)
    server = TritonServer(settings)
    assert f"--model-repository={settings.resolved_model_repository}" in server.command()


def test_environment_puts_this_libpython_first() -> None:
    base = {"LD_LIBRARY_PATH": "/opt/other", "PATH": "/usr/bin", "HOME": "/root"}
    env = server_environment(base)
    libdir, libs, other = env["LD_LIBRARY_PATH"].split(os.pathsep)
    assert libdir == sysconfig.get_config_var("LIBDIR")
    assert Path(libs) == wheel_dir().parent.parent / "nvidia_pytriton.libs"
    assert Path(libs).is_dir()
    assert other == "/opt/other"
    assert env["PATH"].split(os.pathsep) == [str(Path(sys.executable).parent), "/usr/bin"]
    assert env["PYTHONSAFEPATH"] == "1"
    assert env["HOME"] == "/root"
    assert base["PATH"] == "/usr/bin"  # the caller's mapping is left alone


def test_environment_without_a_library_path() -> None:
    env = server_environment({})
    assert not env["LD_LIBRARY_PATH"].endswith(os.pathsep)
    assert len(env["LD_LIBRARY_PATH"].split(os.pathsep)) == 2
    assert env["PATH"] == str(Path(sys.executable).parent)


def test_backend_directory_has_this_pythons_stub(tmp_path: Path) -> None:
    python = install_backends(tmp_path / "backends") / "python"
    stub = python / "triton_python_backend_stub"
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    wheel_stub = wheel_dir() / "python_backend_stubs" / version / stub.name
    assert stub.read_bytes() == wheel_stub.read_bytes()
    assert os.access(stub, os.X_OK)
    assert (python / "libtriton_python.so").is_file()
    assert (python / "triton_python_backend_utils.py").is_file()


def test_backend_files_are_never_rewritten_in_place(tmp_path: Path) -> None:
    # A running server maps these files: an unchanged one is kept, a stale one is replaced by a
    # new file (new inode) so that the old mapping stays valid.
    python = install_backends(tmp_path) / "python"
    library = python / "libtriton_python.so"
    inode = library.stat().st_ino
    install_backends(tmp_path)
    assert library.stat().st_ino == inode
    stub = python / "triton_python_backend_stub"
    stub.write_bytes(b"stale")
    with stub.open("rb") as old:
        install_backends(tmp_path)
        assert old.read() == b"stale"
    assert stub.read_bytes() != b"stale"
    assert not list(python.glob(".*partial"))


def test_port_in_use_is_named(tmp_path: Path, clean_environment: None) -> None:
    settings = settings_for(tmp_path)
    check_ports_free(settings)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", settings.triton_grpc_port))
        busy.listen()
        with pytest.raises(
            TritonServerError, match=f"TRITON_GRPC_PORT={settings.triton_grpc_port}"
        ):
            TritonServer(settings).start()


def test_start_wait_ready_and_stop(fake: TritonServer, tmp_path: Path) -> None:
    with fake as server:
        assert server.is_alive()
        server.start()  # a second start while it runs is a no-op
        server.wait_ready(30)
        assert server.is_ready()
        assert "fake tritonserver --model-repository=" in server.log_tail()
        child = int((tmp_path / "child.pid").read_text())
    assert not fake.is_alive()
    assert fake.returncode is None
    assert process_gone(child)  # the whole process group went
    fake.stop()  # idempotent


def test_server_restarts(fake: TritonServer) -> None:
    fake.start()
    fake.wait_ready(30)
    fake.stop()
    assert not fake.is_ready()
    fake.start()
    fake.wait_ready(30)
    assert fake.is_ready()


def test_exit_before_ready_shows_code_and_log(
    fake: TritonServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_TRITON_MODE", "exit")
    fake.start()
    with pytest.raises(TritonServerError, match="exited with code 3") as error:
        fake.wait_ready(30)
    assert "failed to load model 'tensorrt_llm'" in str(error.value)
    assert str(fake.log_path) in str(error.value)


def test_time_out_while_running(fake: TritonServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_TRITON_MODE", "hang")
    fake.start()
    with pytest.raises(TritonServerError, match=r"still running.*not ready after 1 s") as error:
        fake.wait_ready(1)
    assert "fake tritonserver" in str(error.value)
    assert fake.is_alive()


def test_stop_kills_a_server_that_ignores_sigterm(
    fake: TritonServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_TRITON_MODE", "ignore_term")
    fake.start()
    fake.wait_ready(30)
    started = time.monotonic()
    fake.stop(grace_s=0.5)
    assert time.monotonic() - started < 10
    assert not fake.is_alive()


def test_wait_ready_needs_a_started_server(tmp_path: Path, clean_environment: None) -> None:
    with pytest.raises(TritonServerError, match="not started"):
        TritonServer(settings_for(tmp_path)).wait_ready(1)


def test_ready_means_every_model(fake: TritonServer) -> None:
    assert set(READY_MODELS) == {"ensemble", "preprocessing", "tensorrt_llm", "postprocessing"}
    assert not fake.is_ready()  # nothing listens before start()
