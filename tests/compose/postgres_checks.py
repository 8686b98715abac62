"""The checks of the PostgreSQL run of scripts/test_compose (tests/compose/postgres.py), each
from outside the containers: the api's HTTP port, `docker top`, `psql` in the postgres container
through `docker exec` (local connections need no password there, as in the official image), and
Triton's metrics read inside its container (its metrics port is not published)."""

from __future__ import annotations

import asyncio
import time

import httpx
from tests.compose.docker_engine import docker
from tests.compose.stack import Stack
from tritonbox_testing.stack_traffic import Generation

ACTIVE = 'nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="active"'
TOKENS = "tritonbox_engine_generated_tokens_total"
LONG = {"prompt": "Tell me a very long story about a dragon.", "max_tokens": 400, "min_tokens": 400}
SHORT = {"prompt": "Say hello.", "max_tokens": 2, "min_tokens": 2}
SQLITE_COUNT = (
    "import sqlite3; print(sqlite3.connect('/data/tritonbox.db')"
    ".execute('SELECT count(*) FROM prediction').fetchone()[0])"
)


def psql(stack: Stack, query: str) -> list[list[str]]:
    """Rows of `query`, as psql's unaligned output (`|` between columns)."""
    out = docker(
        "exec", stack.container("postgres"),
        "psql", "-U", "tritonbox", "-d", "tritonbox", "-v", "ON_ERROR_STOP=1", "-Atc", query,
    )  # fmt: skip
    return [line.split("|") for line in out.splitlines()]


def rows(stack: Stack) -> int:
    return int(psql(stack, "SELECT count(*) FROM prediction")[0][0])


def sqlite_rows(stack: Stack) -> int:
    """Rows in the api's SQLite file (the `data` volume), read inside the api container."""
    return int(docker("exec", stack.container("api"), "python", "-c", SQLITE_COUNT))


def workers(stack: Stack, expected: int) -> str:
    """The api container runs uvicorn's supervisor and `expected` worker processes under it,
    and as many workers have a heartbeat row in the database."""
    table = docker("top", stack.container("api"), "-eo", "pid,ppid,args").splitlines()[1:]
    processes = [line.split(None, 2) for line in table]
    (supervisor,) = [pid for pid, _, args in processes if "tritonbox-api serve" in args]
    children = [args for _, ppid, args in processes if ppid == supervisor and "spawn_main" in args]
    assert len(children) == expected, table
    deadline = time.monotonic() + 30  # each worker writes its row once it has started
    while (beating := int(psql(stack, "SELECT count(*) FROM api_worker")[0][0])) != expected:
        assert time.monotonic() < deadline, f"{beating} heartbeat rows"
        time.sleep(1)
    return f"{len(children)} worker processes under the supervisor, {beating} heartbeat rows"


def metric(stack: Stack, prefix: str) -> float:
    """A sample of Triton's /metrics, read inside the triton container."""
    script = "import urllib.request as u; print(u.urlopen('http://127.0.0.1:8002/metrics').read().decode())"
    for line in docker("exec", stack.container("triton"), "python3", "-c", script).splitlines():
        if line.startswith(prefix):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def _stream(stack: Stack) -> Generation:
    """A long streamed prediction, generating."""
    generation = Generation(stack.api, prediction_input=LONG, headers=stack.auth, timeout_s=300)
    generation.wait_started(120)
    return generation


def _cancel_once(stack: Stack) -> bool:
    """Stream, cancel on a fresh connection, check the row and the engine; True when the
    cancel reached the stream through another worker (the row's cancel mark is set)."""
    generation = _stream(stack)
    # A fresh connection, closed after: the kernel hands it to any of the workers.
    headers = stack.auth | {"Connection": "close"}
    answer = httpx.post(
        f"{stack.api}/v1/predictions/{generation.id}/cancel", headers=headers, timeout=60
    )
    assert answer.status_code == 200 and answer.json()["status"] == "canceled", answer.text
    done = generation.join(30)
    assert done and generation.events[-1] == "done", (generation.events, generation.error)
    deadline = time.monotonic() + 10
    while metric(stack, ACTIVE) > 0:
        assert time.monotonic() < deadline, "the engine kept generating after the cancel"
        time.sleep(0.2)
    # The engine publishes its token counter every 0.5 s and its active gauge at once.
    time.sleep(0.7)
    tokens = metric(stack, TOKENS)
    time.sleep(1.0)
    assert metric(stack, TOKENS) == tokens, "the engine's token counter still moves"
    marked_query = "SELECT status, owner, cancel_requested_at IS NOT NULL FROM prediction"
    ((status, owner, marked),) = psql(stack, f"{marked_query} WHERE id = '{generation.id}'")
    assert status == "canceled" and owner, (status, owner)
    return marked == "t"


def cancel_across_workers(stack: Stack, attempts: int = 5) -> str:
    """A cancel sent on a fresh connection ends a stream `canceled` and stops the engine; repeated
    until one of them went through a worker other than the stream's (the kernel picks)."""
    for attempt in range(1, attempts + 1):
        if _cancel_once(stack):
            return f"canceled through another worker on attempt {attempt}; the engine stopped"
    raise AssertionError(f"{attempts} cancels, each reached the stream's own worker")


async def _one(client: httpx.AsyncClient, index: int, model: str, refused: list[int]) -> str:
    """One request of a mixed kind; a 429 (this worker's share is taken) is retried after
    Retry-After, as a client does (counted in `refused`)."""
    while True:
        kind = index % 3
        if kind == 0:
            answer = await client.post("/v1/predictions", json={"input": SHORT})
        elif kind == 1:
            answer = await client.post("/predict", json=SHORT)
        else:
            body = {"model": model, "prompt": SHORT["prompt"], "max_tokens": 2, "stream": True}
            async with client.stream("POST", "/v1/completions", json=body) as answer:
                await answer.aread()
        if answer.status_code != 429:
            assert answer.status_code in (200, 201), answer.text
            return answer.headers["x-prediction-id"]
        refused.append(index)
        await asyncio.sleep(float(answer.headers.get("retry-after", "1")))


async def _burst(stack: Stack, count: int, model: str, refused: list[int]) -> list[str]:
    async def fresh(index: int) -> str:
        # A connection per request: the kernel spreads them over the workers.
        async with httpx.AsyncClient(base_url=stack.api, headers=stack.auth, timeout=600) as c:
            return await _one(c, index, model, refused)

    return await asyncio.gather(*(fresh(i) for i in range(count)))


def concurrent_rows(stack: Stack, count: int) -> str:
    """`count` requests at once (predictions, /predict, streamed completions) leave exactly
    `count` new rows, all succeeded."""
    model = httpx.get(f"{stack.api}/v1/models", headers=stack.auth, timeout=30).json()["data"][0]
    before = rows(stack)
    began = time.monotonic()
    refused: list[int] = []
    ids = asyncio.run(_burst(stack, count, model["id"], refused))
    took = time.monotonic() - began
    assert len(set(ids)) == count, f"{len(set(ids))} distinct ids"
    assert rows(stack) == before + count, f"{rows(stack) - before} new rows for {count} requests"
    listed = ", ".join(f"'{i}'" for i in ids)
    query = (
        "SELECT status, count(*), count(DISTINCT owner) FROM prediction "
        f"WHERE id IN ({listed}) GROUP BY status"
    )
    ((status, succeeded, owners),) = psql(stack, query)
    assert status == "succeeded" and int(succeeded) == count, (status, succeeded)
    return (
        f"{count} rows, all succeeded, written by {owners} workers, in {took:.0f} s "
        f"({len(refused)} retries after 429)"
    )
