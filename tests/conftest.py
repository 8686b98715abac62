"""Session fixtures shared by every test package: the real tritonserver with the default model."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from tritonbox_testing.ports import free_ports

from tritonbox_triton.prepare_model import prepare_default_model
from tritonbox_triton.render import render_repository
from tritonbox_triton.server import TritonServer
from tritonbox_triton.settings import DEFAULT_MODEL_NAME, TritonSettings

REPO_ROOT = Path(__file__).resolve().parent.parent
SERVER_TESTS = Path(__file__).parent / "triton" / "server"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Everything under tests/triton/server, and any test that uses the `triton_server` or
    # `triton_launcher` fixture, talks to the real server: `-m "not server"` skips them all.
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        uses_server = bool(fixtures & {"triton_server", "triton_launcher"})
        if uses_server or SERVER_TESTS in item.path.parents:
            item.add_marker(pytest.mark.server)


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


@contextlib.contextmanager
def serve_triton(
    tmp_path_factory: pytest.TempPathFactory, **overrides: Any
) -> Iterator[RunningTriton]:
    """tritonserver on free ports, serving a repository rendered into a fresh tmp folder.

    The test settings (default model, 512-token limits) updated with `overrides`, given as
    TritonSettings field names (`engine="synthetic"`, ...).
    """
    cache_dir = REPO_ROOT / ".cache"
    # Built once per machine (a fresh CI clone too), then reused by every session.
    prepare_default_model(cache_dir / "models" / DEFAULT_MODEL_NAME)
    factory: Any = TritonSettings  # `_env_file=None`: tests ignore a developer's .env
    http_port, grpc_port, metrics_port = free_ports(3)
    values: dict[str, Any] = {
        "cache_dir": cache_dir,
        "model_repository": tmp_path_factory.mktemp("model_repository"),
        "max_input_len": 512,
        "max_output_len": 512,
        "triton_http_port": http_port,
        "triton_grpc_port": grpc_port,
        "triton_metrics_port": metrics_port,
    }
    with pytest.MonkeyPatch.context() as environment:
        for name in TritonSettings.model_fields:  # ... and their exported settings
            environment.delenv(name.upper(), raising=False)
        settings: TritonSettings = factory(_env_file=None, **(values | overrides))
    render_repository(settings)
    log_path = tmp_path_factory.mktemp("tritonserver") / "tritonserver.log"
    server = TritonServer(settings, log_path=log_path)
    server.start()
    try:
        server.wait_ready(settings.triton_ready_timeout_s)
        yield RunningTriton(settings=settings, server=server)
    finally:
        server.stop()


@pytest.fixture(scope="session")
def triton_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningTriton]:
    """tritonserver serving the cpu flavour of the ensemble with the default model.

    Tests may stop and start `server`; they must leave it ready (`wait_ready`) for the next.
    """
    with serve_triton(tmp_path_factory) as running:
        yield running


@pytest.fixture(scope="session")
def triton_launcher(
    tmp_path_factory: pytest.TempPathFactory,
) -> Callable[..., contextlib.AbstractContextManager[RunningTriton]]:
    """`serve_triton` for a fixture's own server: `with triton_launcher(engine="synthetic")`."""
    return functools.partial(serve_triton, tmp_path_factory)
