"""Several api processes on one database, in front of the real tritonserver: API_WORKERS=2 on
one port, on SQLite and PostgreSQL (200 concurrent mixed requests -> as many rows, lists that
agree from any worker, metrics summed over the workers, cancel from any connection), and a
cancel made on one api process reaching a prediction another one streams (PostgreSQL; the
engine stops)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import create_engine, text
from tritonbox_testing.api_process import RunningApi, launch_api
from tritonbox_testing.postgres import RunningPostgres
from tritonbox_testing.stack_traffic import Generation

LONG = {"prompt": "Tell me a very long story about a dragon.", "max_tokens": 400, "min_tokens": 400}
SHORT = {"prompt": "Say hello.", "max_tokens": 4, "min_tokens": 4}
MODEL = "SmolLM2-135M-Instruct"  # the session's default model


@pytest.fixture
def url(postgres_server: RunningPostgres) -> str:
    return postgres_server.create_database()


def _rows(url: str) -> list[dict[str, Any]]:
    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            query = "SELECT id, status, owner, cancel_requested_at FROM prediction"
            result = connection.execute(text(query))
            return [dict(row._mapping) for row in result]
    finally:
        engine.dispose()


def _stream_in_background(api: RunningApi) -> Generation:
    """A long streamed prediction on `api`, generating."""
    generation = Generation(api.url, prediction_input=LONG)
    generation.wait_started(60)
    return generation


def _engine_active(triton: Any) -> float:
    """The engine's own gauge of requests it is generating (the cpu engine reports it)."""
    for line in httpx.get(triton.metrics_url, timeout=5).text.splitlines():
        if line.startswith("nv_trt_llm_request_metrics{") and 'request_type="active"' in line:
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError("no nv_trt_llm_request_metrics active gauge on Triton's /metrics")


def test_a_cancel_on_one_api_stops_a_stream_of_another(
    launch: Callable[..., RunningApi], url: str, triton_server: Any
) -> None:
    first = launch(database_url=url)
    second = launch(database_url=url)
    first.wait_ready()
    second.wait_ready()
    generation = _stream_in_background(first)
    began = time.monotonic()
    with httpx.Client(base_url=second.url, timeout=30) as client:
        answer = client.post(f"/v1/predictions/{generation.id}/cancel")
    took = time.monotonic() - began
    assert answer.status_code == 200, answer.text
    assert answer.json()["status"] == "canceled", answer.json()
    assert generation.join(30) and generation.events[-1] == "done", generation.error
    print(f"cancel through the other api process: {took:.2f} s to a canceled row")
    assert took < 5
    # The owner stopped the engine's work too, not only the row (an earlier test's short
    # leftovers aside, nothing of ours may keep generating).
    deadline = time.monotonic() + 10
    while _engine_active(triton_server) > 0:
        assert time.monotonic() < deadline, "the engine kept generating after the cancel"
        time.sleep(0.05)
    (row,) = [r for r in _rows(url) if r["id"] == generation.id]
    assert row["status"] == "canceled" and row["owner"]


@pytest.fixture(scope="module")
def synthetic_triton(triton_launcher: Callable[..., Any]) -> Iterator[Any]:
    """tritonserver with the synthetic engine (the benchmark's): the same ensemble and tensors,
    a token every 20 ms without a model's CPU cost, so 200 requests at once measure the api and
    the database, not two shared cores running a model. Its queue unbounded (MAX_QUEUE_SIZE 0):
    the 200 wait their turn, where the default (4 x MAX_BATCH_SIZE, 64) refuses most with 429."""
    settings = {"synthetic_token_interval_s": 0.02, "max_queue_size": 0}
    with triton_launcher(engine="synthetic", **settings) as running:
        yield running


@pytest.fixture
def workers_api(synthetic_triton: Any, database_url: str, tmp_path: Path) -> Iterator[RunningApi]:
    """Two workers on one port, on SQLite (the default path with workers) and on PostgreSQL."""
    api = launch_api(
        synthetic_triton,
        tmp_path / "api",
        database_url=database_url,
        api_workers="2",
        # Each worker takes half (256 each): the kernel need not spread 200 connections evenly,
        # and with 128 each one worker once got more than its share and answered 429 (CI8).
        max_concurrent_requests="512",
    )
    try:
        api.wait_ready()
        yield api
    finally:
        api.stop()


async def _one(url: str, index: int) -> str:
    # A connection per request: the kernel spreads them over the workers.
    async with httpx.AsyncClient(base_url=url, timeout=300) as client:
        kind = index % 3
        if kind == 0:
            answer = await client.post("/v1/predictions", json={"input": SHORT})
            assert answer.status_code == 201, answer.text
            return str(answer.json()["id"])
        if kind == 1:
            answer = await client.post("/predict", json=SHORT)
            assert answer.status_code == 200, answer.text
            return answer.headers["x-prediction-id"]
        body = {"model": MODEL, "prompt": SHORT["prompt"], "max_tokens": 4, "stream": True}
        async with client.stream("POST", "/v1/completions", json=body) as response:
            assert response.status_code == 200
            async for _ in response.aiter_raw():
                pass
            return response.headers["x-prediction-id"]


async def _burst(url: str, count: int) -> list[str]:
    return await asyncio.gather(*(_one(url, i) for i in range(count)))


def test_two_workers_on_one_port(workers_api: RunningApi, database_url: str) -> None:
    count = 200

    began = time.monotonic()
    ids = asyncio.run(_burst(workers_api.url, count))
    print(f"{count} concurrent mixed requests through 2 workers: {time.monotonic() - began:.1f} s")
    assert len(set(ids)) == count
    rows = _rows(database_url)
    assert {r["id"] for r in rows} == set(ids)  # rows == requests, none lost
    assert all(r["status"] == "succeeded" for r in rows)
    owners = {r["owner"] for r in rows}
    assert len(owners) == 2, owners  # both workers served

    # The list pages agree whichever worker serves each page.
    listed: list[str] = []
    page_url: str | None = f"{workers_api.url}/v1/predictions?limit=37"
    while page_url:
        page = httpx.get(page_url, timeout=30).json()
        listed += [p["id"] for p in page["results"]]
        page_url = page["next"]
    assert sorted(listed) == sorted(ids) and len(listed) == count
    # Any worker reads any row.
    for prediction_id in ids[:20]:
        assert httpx.get(f"{workers_api.url}/v1/predictions/{prediction_id}").status_code == 200

    # Metrics add up over the workers.
    metrics = httpx.get(f"{workers_api.url}/metrics", timeout=30).text
    finished = sum(
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("tritonbox_requests_total{")
    )
    assert finished == count, [m for m in metrics.splitlines() if "requests_total" in m]


def test_cancel_from_any_connection_with_two_workers(
    workers_api: RunningApi, database_url: str
) -> None:
    # Each worker loads the engine's context (tokenizer) on its first request, seconds on busy
    # cores during which it answers nothing, a cancel included: warm both up first.
    for _ in range(5):
        asyncio.run(_burst(workers_api.url, 16))
        if len({r["owner"] for r in _rows(database_url)}) == 2:
            break
    # The kernel picks each connection's worker: stream and cancel until two cancels went to a
    # worker that does not run the prediction (only those mark the row's cancel_requested_at).
    crossed: list[str] = []
    for _ in range(12):
        generation = _stream_in_background(workers_api)
        with httpx.Client(base_url=workers_api.url, timeout=30) as client:
            answer = client.post(f"/v1/predictions/{generation.id}/cancel")
        assert answer.status_code == 200 and answer.json()["status"] == "canceled", answer.text
        assert generation.join(30)
        (row,) = [r for r in _rows(database_url) if r["id"] == generation.id]
        assert row["status"] == "canceled"
        if row["cancel_requested_at"] is not None:
            crossed.append(row["id"])
            if len(crossed) == 2:
                break
    assert crossed, "no cancel reached the other worker in 12 tries"
