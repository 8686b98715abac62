"""A full engine queue (MAX_QUEUE_SIZE) on the real cpu engine: the engine refuses with its
"Maximum queue size of N has been reached" error and the api answers 429 with Retry-After,
never 500 or 503, while the admitted requests finish. The default bound is the settings'."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from tritonbox_testing.api_process import RunningApi, launch_api

from tritonbox_triton.settings import QUEUE_BATCHES, TritonSettings

SETTINGS: Any = TritonSettings


def test_the_engine_queue_is_bounded_by_default() -> None:
    assert SETTINGS(_env_file=None).max_queue_size == QUEUE_BATCHES * 16
    assert SETTINGS(_env_file=None, max_batch_size="2").max_queue_size == QUEUE_BATCHES * 2
    assert SETTINGS(_env_file=None, max_queue_size="0").max_queue_size == 0  # unbounded: asked


@pytest.fixture(scope="module")
def one_slot_api(
    triton_launcher: Callable[..., Any], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningApi]:
    # One running and one waiting: a third request at once finds the engine's queue full.
    with triton_launcher(max_batch_size=1, max_queue_size=1) as triton:
        running = launch_api(triton, Path(tmp_path_factory.mktemp("api")))
        try:
            running.wait_ready()
            yield running
        finally:
            running.stop()


def test_a_full_engine_queue_is_a_429_with_retry_after(one_slot_api: RunningApi) -> None:
    model = httpx.get(f"{one_slot_api.url}/v1/models", timeout=30).json()["data"][0]["id"]
    body = {"model": model, "prompt": "Once upon a time", "max_tokens": 32, "min_tokens": 32}

    def complete(_: int) -> httpx.Response:
        return httpx.post(f"{one_slot_api.url}/v1/completions", json=body, timeout=120)

    with ThreadPoolExecutor(6) as pool:
        answers = list(pool.map(complete, range(6)))
    statuses = sorted(answer.status_code for answer in answers)
    refusals: list[str] = []
    assert set(statuses) == {200, 429}, [a.text for a in answers]
    for answer in answers:
        if answer.status_code == 429:
            assert int(answer.headers["Retry-After"]) >= 1
            error = answer.json()["error"]
            assert error["type"] == "rate_limit_error"
            assert "the engine's queue is full (MAX_QUEUE_SIZE)" in error["message"]
            # The row says who refused: the engine's own queue, or Triton's in front of it.
            row = httpx.get(
                f"{one_slot_api.url}/v1/predictions/{answer.headers['x-prediction-id']}",
                timeout=30,
            ).json()
            refusals.append(row["error"])
        else:
            assert answer.json()["usage"]["completion_tokens"] == 32
    known = ("Maximum queue size of 1 has been reached", "Exceeds maximum queue size")
    assert refusals and all(any(k in refusal for k in known) for refusal in refusals), refusals
    # The engine refused only for now: once the others are done, it serves again.
    assert complete(0).status_code == 200
