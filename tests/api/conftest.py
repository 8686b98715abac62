"""Fixtures: the real api in front of the session's real Triton."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from tritonbox_testing.api_process import RunningApi, launch_api
from tritonbox_testing.postgres import RunningPostgres, run_postgres


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


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[RunningPostgres]:
    """One real PostgreSQL server for the session, started only if a test asks for it."""
    with run_postgres() as server:
        yield server


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The URL of a new, empty database: an SQLite file, then a PostgreSQL database (the tests
    that take it run on both; `-k sqlite` or `-k postgresql` picks one)."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'tritonbox.db'}"
    server: RunningPostgres = request.getfixturevalue("postgres_server")
    return server.create_database()
