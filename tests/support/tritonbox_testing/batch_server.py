"""The Batch API through the `openai` SDK against a running api process (tests/api/batches):
lines, waiting for a batch's end, reading its files and the database's rows."""

from __future__ import annotations

import json
import time
from typing import Any, Final

import openai
from sqlalchemy import create_engine, text
from tritonbox_testing.api_process import RunningApi

MODEL = "SmolLM2-135M-Instruct"  # the session's default model (the synthetic engine's name)
CHAT: Final = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"


def sdk(api: RunningApi) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{api.url}/v1", api_key="unused", max_retries=0)


def chat(custom_id: str, max_tokens: int = 4, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": MODEL,
        "messages": [{"role": "user", "content": f"Say {custom_id}."}],
    }
    body |= {"max_tokens": max_tokens, **extra}
    return {"custom_id": custom_id, "method": "POST", "url": CHAT, "body": body}


def jsonl(lines: list[Any]) -> bytes:
    return "".join(json.dumps(each) + "\n" for each in lines).encode()


def wait_ended(client: openai.OpenAI, batch_id: str, timeout_s: float = 120) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        batch = client.batches.retrieve(batch_id)
        if batch.status in ("completed", "failed", "expired", "cancelled"):
            return batch
        time.sleep(0.2)
    raise AssertionError(f"batch {batch_id} did not end: {batch}")


def lines_of(client: openai.OpenAI, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    return [json.loads(x) for x in client.files.content(file_id).text.splitlines()]


def rows(url: str, query: str) -> list[dict[str, Any]]:
    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            return [dict(row._mapping) for row in connection.execute(text(query))]
    finally:
        engine.dispose()
