"""Fixtures: tritonserver with the synthetic engine (the ensemble's tensors, tokens at a fixed
pace, no model's CPU) for this folder's tests, and api processes in front of it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from tritonbox_testing.api_process import RunningApi, launch_api


@pytest.fixture(scope="session")
def synthetic_triton(triton_launcher: Callable[..., Any]) -> Iterator[Any]:
    with triton_launcher(engine="synthetic", synthetic_token_interval_s=0.02) as running:
        yield running


@pytest.fixture
def start_api(synthetic_triton: Any, tmp_path: Path) -> Iterator[Callable[..., RunningApi]]:
    started: list[RunningApi] = []

    def start(**settings: str) -> RunningApi:
        running = launch_api(synthetic_triton, tmp_path / f"api{len(started)}", **settings)
        started.append(running)
        running.wait_ready()
        return running

    yield start
    for running in started:
        running.stop()
