"""Session fixtures shared by every test package: the real tritonserver with the default model."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tritonbox_triton.prepare_model import prepare_default_model
from tritonbox_triton.render import render_repository
from tritonbox_triton.server import TritonServer
from tritonbox_triton.settings import TritonSettings

REPO_ROOT = Path(__file__).resolve().parent.parent
SERVER_TESTS = Path(__file__).parent / "triton" / "server"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Everything under tests/triton/server talks to the real server: `-m "not server"` skips it.
    for item in items:
        if SERVER_TESTS in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.server)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class RunningTriton:
    settings: TritonSettings
    server: TritonServer

    @property
    def grpc_url(self) -> str:
        return self.settings.grpc_url

    @property
    def http_url(self) -> str:
        return self.settings.http_url

    @property
    def metrics_url(self) -> str:
        return f"http://{self.settings.triton_host}:{self.settings.triton_metrics_port}/metrics"


@pytest.fixture(scope="session")
def triton_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningTriton]:
    """tritonserver serving the cpu flavour of the ensemble with the default model."""
    cache_dir = REPO_ROOT / ".cache"
    prepare_default_model(cache_dir / "models" / "SmolLM2-135M-Instruct")
    factory: Any = TritonSettings  # `_env_file=None`: tests ignore a developer's .env
    settings: TritonSettings = factory(
        _env_file=None,
        cache_dir=cache_dir,
        model_repository=tmp_path_factory.mktemp("model_repository"),
        max_input_len=512,
        max_output_len=512,
        triton_http_port=free_port(),
        triton_grpc_port=free_port(),
        triton_metrics_port=free_port(),
    )
    render_repository(settings)
    server = TritonServer(settings)
    server.start()
    try:
        server.wait_ready(settings.triton_ready_timeout_s)
        yield RunningTriton(settings=settings, server=server)
    finally:
        server.stop()
