"""Batch API helpers for the in-process tests (tests/api/lifecycle): lines, an httpx client on
the app itself, submitting a JSONL file as a batch, waiting for its end, reading its files."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
from sqlalchemy import create_engine, text

CHAT = "/v1/chat/completions"


def line(custom_id: str, max_tokens: int = 3, url: str = CHAT, **body: Any) -> dict[str, Any]:
    content: dict[str, Any] = {"messages": [{"role": "user", "content": f"Say {custom_id}."}]}
    if url == "/v1/completions":
        content = {"prompt": f"Say {custom_id}."}
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": url,
        "body": {"model": "fake-model", "max_tokens": max_tokens, **content, **body},
    }


def jsonl(lines: list[Any]) -> bytes:
    return "".join(
        (each if isinstance(each, str) else json.dumps(each)) + "\n" for each in lines
    ).encode()


def client(stack: Any, key: str | None = None) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=stack.app)
    headers = {"authorization": f"Bearer {key}"} if key else {}
    return httpx.AsyncClient(
        transport=transport, base_url="http://api", timeout=30, headers=headers
    )


async def submit(api: httpx.AsyncClient, lines: list[Any], window: str = "24h") -> dict[str, Any]:
    upload = await api.post(
        "/v1/files", files={"file": ("in.jsonl", jsonl(lines))}, data={"purpose": "batch"}
    )
    assert upload.status_code == 200, upload.text
    created = await api.post(
        "/v1/batches",
        json={"input_file_id": upload.json()["id"], "endpoint": CHAT, "completion_window": window},
    )
    assert created.status_code == 200, created.text
    return dict(created.json())


async def ended(api: httpx.AsyncClient, batch_id: str, timeout_s: float = 60) -> dict[str, Any]:
    async with asyncio.timeout(timeout_s):
        while True:
            batch = (await api.get(f"/v1/batches/{batch_id}")).json()
            if batch["status"] in ("completed", "failed", "expired", "cancelled"):
                return dict(batch)
            await asyncio.sleep(0.05)


async def output(api: httpx.AsyncClient, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    answer = await api.get(f"/v1/files/{file_id}/content")
    assert answer.status_code == 200
    return [json.loads(x) for x in answer.text.splitlines()]


def by_id(*files: list[dict[str, Any]]) -> dict[str | None, list[dict[str, Any]]]:
    every: dict[str | None, list[dict[str, Any]]] = {}
    for each in (x for f in files for x in f):
        every.setdefault(each["custom_id"], []).append(each)
    return every


def prediction_rows(url: str) -> list[dict[str, Any]]:
    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            query = (
                "SELECT id, status, batch_id, custom_id, api_key_name, adapter_name FROM prediction"
            )
            return [dict(row._mapping) for row in connection.execute(text(query))]
    finally:
        engine.dispose()
