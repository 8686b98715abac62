"""Fixtures: the real api in front of the session's real Triton."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from tritonbox_testing.api_process import RunningApi, launch_api


@pytest.fixture(scope="session")
def api_server(
    triton_server: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningApi]:
    """The api in front of the session's Triton, started once per session.

    Tests that stop or restart it must leave it running (`start()`) for the next.
    """
    running = launch_api(
        triton_server, tmp_path_factory.mktemp("api"), max_concurrent_requests="24"
    )
    try:
        running.wait_ready()
        yield running
    finally:
        running.stop()


@pytest.fixture
def launch(triton_server: Any, tmp_path: Path) -> Iterator[Callable[..., RunningApi]]:
    """Start extra api processes with their own settings; all are stopped after the test."""
    started: list[RunningApi] = []

    def start(**settings: str) -> RunningApi:
        running = launch_api(triton_server, tmp_path / f"api{len(started)}", **settings)
        started.append(running)
        return running

    yield start
    for running in started:
        running.stop()


@pytest.fixture
def api(api_server: RunningApi) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=api_server.url, timeout=120) as client:
        yield client
