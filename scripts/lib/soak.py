"""Fault soak: a few minutes of mixed good and bad traffic against a running native stack, then
a check that nothing leaked.

Start the stack first (`scripts/up --without playground --env-file FILE`), then run
`scripts/soak --env-file FILE`. Workers (2 x MAX_CONCURRENT_REQUESTS by default) loop over:
normal and streamed requests on the four generating routes, clients that drop a stream after a
chunk or before its first byte, POST cancels, bodies over MAX_BODY_BYTES (declared and chunked)
and malformed requests. At the end, once the api has had a moment to settle, every row started
during the soak must be final and every prediction id seen must have its row; the api's
in-flight gauge and the engine's active and waiting requests (TensorRT-LLM's gauge) must be 0;
no response may be a 5xx; and the api must still answer a prediction. Exit status 1 otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import create_engine, select
from sqlmodel import col

from tritonbox_api.db.models import Prediction
from tritonbox_api.db.url import settings_url
from tritonbox_api.settings import ApiSettings
from tritonbox_triton.settings import TritonSettings

PROMPTS = ["Tell me a story about a dragon.", "List three colors.", "Why is the sky blue?"]
KINDS = {  # kind -> weight
    "normal": 3, "streamed": 3, "dropped": 3, "dropped_early": 2, "cancelled": 2,
    "over_limit": 1, "chunked_over_limit": 1, "malformed": 2,
}  # fmt: skip
FINAL = {"succeeded", "failed", "canceled"}


@dataclass
class Tally:
    statuses: Counter[str] = field(default_factory=Counter)  # "kind status"
    ids: set[str] = field(default_factory=set)
    server_errors: list[str] = field(default_factory=list)
    retry_after: float = 0.0  # set by a 429, honoured (with jitter) by the worker that got it

    def note(self, kind: str, response: httpx.Response) -> None:
        self.statuses[f"{kind} {response.status_code}"] += 1
        if response.status_code == 429:  # a polite client: a busy loop only starves the engine
            self.retry_after = float(response.headers.get("retry-after", "1"))
        if prediction_id := response.headers.get("x-prediction-id"):
            self.ids.add(prediction_id)
        if response.status_code >= 500:
            self.server_errors.append(f"{kind}: {response.status_code}")


def generation(rng: random.Random, model: str, stream: bool) -> tuple[str, dict[str, Any]]:
    prompt, tokens = rng.choice(PROMPTS), rng.randint(4, 48)
    path = rng.choice(["/predict", "/v1/predictions", "/v1/completions", "/v1/chat/completions"])
    if path == "/predict":
        return path, {"prompt": prompt, "max_tokens": tokens, "stream": stream}
    if path == "/v1/predictions":
        return path, {"input": {"prompt": prompt, "max_tokens": tokens}, "stream": stream}
    body: dict[str, Any] = {"model": model, "max_tokens": tokens, "stream": stream}
    if path == "/v1/completions":
        return path, {**body, "prompt": prompt}
    return path, {**body, "messages": [{"role": "user", "content": prompt}]}


async def one(client: httpx.AsyncClient, kind: str, rng: random.Random, ctx: Any) -> None:
    tally, model, limit = ctx.tally, ctx.model, ctx.max_body_bytes
    if kind in ("normal", "streamed", "dropped", "dropped_early"):
        path, body = generation(rng, model, stream=kind != "normal")
        if kind == "dropped_early":  # gone before the first byte (often before the first token)
            try:
                async with asyncio.timeout(rng.uniform(0.01, 0.3)):
                    await client.post(path, json=body)
            except TimeoutError:
                tally.statuses["dropped_early gone"] += 1
            return
        async with client.stream("POST", path, json=body) as response:
            tally.note(kind, response)
            async for _ in response.aiter_raw():
                if kind == "dropped" and rng.random() < 0.5:
                    break  # leaving with the stream open: the connection is closed
    elif kind == "cancelled":
        body = {"input": {"prompt": rng.choice(PROMPTS), "max_tokens": 48}, "stream": True}
        async with client.stream("POST", "/v1/predictions", json=body) as response:
            tally.note(kind, response)
            if prediction_id := response.headers.get("x-prediction-id"):
                await asyncio.sleep(rng.uniform(0.0, 0.5))
                tally.note("cancel", await client.post(f"/v1/predictions/{prediction_id}/cancel"))
            async for _ in response.aiter_raw():
                pass
    elif kind == "over_limit":
        tally.note(kind, await client.post("/predict", json={"prompt": "x" * (limit + 1)}))
    elif kind == "chunked_over_limit":

        async def pieces() -> Any:  # no Content-Length: httpx sends it chunked
            yield b'{"prompt": "'
            for _ in range(limit // 65536 + 1):
                yield b"y" * 65536
            yield b'"}'

        tally.note(kind, await client.post("/predict", content=pieces()))
    else:
        bad = rng.choice([b"{not json", b'{"prompt": 3}', b'{"prompt": "a", "max_tokens": -1}',
                          b'{"model": "nope", "prompt": "a"}'])  # fmt: skip
        path = "/v1/completions" if b"model" in bad else "/predict"
        headers = {"content-type": "application/json"}
        tally.note(kind, await client.post(path, content=bad, headers=headers))


async def worker(ctx: Any, seed: int, deadline: float) -> None:
    rng = random.Random(seed)
    kinds, weights = list(KINDS), list(KINDS.values())
    async with httpx.AsyncClient(base_url=ctx.api_url, timeout=120, headers=ctx.headers) as client:
        while time.monotonic() < deadline:
            kind = rng.choices(kinds, weights)[0]
            tally = Tally()  # this request's, merged below
            try:
                await one(client, kind, rng, argparse.Namespace(**{**vars(ctx), "tally": tally}))
            except httpx.HTTPError as error:
                tally.statuses[f"{kind} {type(error).__name__}"] += 1
            ctx.tally.statuses.update(tally.statuses)
            ctx.tally.ids |= tally.ids
            ctx.tally.server_errors += tally.server_errors
            await asyncio.sleep(tally.retry_after * rng.uniform(0.5, 1.5) + rng.uniform(0, 0.1))


def gauge(text: str, name: str, **labels: str) -> float:
    for line in text.splitlines():
        if line.startswith(name) and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    raise LookupError(f"{name} {labels} is not exported")


def checks(ctx: Any, since: datetime) -> dict[str, Any]:
    api = httpx.get(f"{ctx.api_url}/metrics", timeout=10).text
    engine = httpx.get(ctx.metrics_url, timeout=10).text
    # The api's own database, SQLite or PostgreSQL (DATABASE_URL), read with its own models.
    database = create_engine(ctx.database)
    try:
        with database.connect() as connection:
            query = select(col(Prediction.id), col(Prediction.status)).where(
                col(Prediction.started_at) >= since
            )
            rows = {row_id: str(status) for row_id, status in connection.execute(query)}
    finally:
        database.dispose()
    answer = httpx.post(f"{ctx.api_url}/predict", headers=ctx.headers, timeout=60,
                        json={"prompt": "Hi", "max_tokens": 4, "stream": False})  # fmt: skip
    return {
        "rows": len(rows),
        "rows_by_status": dict(Counter(rows.values())),
        "rows_not_final": sorted(i for i, s in rows.items() if s not in FINAL),
        "ids_without_row": sorted(ctx.tally.ids - rows.keys()),
        "api_in_flight": gauge(api, "tritonbox_requests_in_flight"),
        "engine_active": gauge(engine, "nv_trt_llm_request_metrics", request_type="active"),
        "engine_waiting": gauge(engine, "nv_trt_llm_request_metrics", request_type="waiting"),
        "api_answers": answer.status_code == 200 and answer.json()["status"] == "succeeded",
    }


def passed(result: dict[str, Any], server_errors: list[str]) -> bool:
    return (
        not result["rows_not_final"] and not result["ids_without_row"] and not server_errors
        and result["api_in_flight"] == 0 and result["engine_active"] == 0
        and result["engine_waiting"] == 0 and result["api_answers"]
    )  # fmt: skip


async def soak(ctx: Any, workers: int, duration_s: float, seed: int) -> None:
    deadline = time.monotonic() + duration_s
    await asyncio.gather(*(worker(ctx, seed + n, deadline) for n in range(workers)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--env-file", type=Path, default=Path(".env"))
    parser.add_argument("--duration-s", type=float, default=180.0)
    parser.add_argument("--workers", type=int, help="default: 2 x MAX_CONCURRENT_REQUESTS")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--settle-s", type=float, default=10.0, help="wait for the gauges")
    args = parser.parse_args()
    factory: Any = ApiSettings
    api: ApiSettings = factory(_env_file=args.env_file)
    triton_factory: Any = TritonSettings
    triton: TritonSettings = triton_factory(_env_file=args.env_file)
    key = api.api_key.get_secret_value() if api.api_key else None
    ctx = argparse.Namespace(
        api_url=f"http://127.0.0.1:{api.api_port}",
        metrics_url=f"http://{triton.triton_host}:{triton.triton_metrics_port}/metrics",
        database=settings_url(api),
        headers={"Authorization": f"Bearer {key}"} if key else {},
        max_body_bytes=api.max_body_bytes,
        tally=Tally(),
    )
    ctx.model = httpx.get(f"{ctx.api_url}/v1/models", headers=ctx.headers).json()["data"][0]["id"]
    workers = args.workers or 2 * api.max_concurrent_requests
    since = datetime.now(UTC) - timedelta(seconds=1)
    started = time.monotonic()
    asyncio.run(soak(ctx, workers, args.duration_s, args.seed))
    soaked = time.monotonic() - started
    time.sleep(args.settle_s)
    result = checks(ctx, since)
    report = {
        "workers": workers,
        "api_workers": api.api_workers,
        "database": ctx.database.get_backend_name(),
        "max_concurrent_requests": api.max_concurrent_requests,
        "soak_s": round(soaked, 1),
        "requests": dict(sorted(ctx.tally.statuses.items())),
        "server_errors": ctx.tally.server_errors,
        **result,
        "passed": passed(result, ctx.tally.server_errors),
    }
    print(json.dumps(report, indent=2))
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
