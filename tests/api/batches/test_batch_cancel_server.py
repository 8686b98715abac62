"""A batch cancelled on the real api (synthetic engine), on SQLite and PostgreSQL: the running
lines stop at once (their predictions end canceled: the engine's requests are stopped as for a
client that leaves), the lines not begun end cancelled, and what finished is kept."""

from __future__ import annotations

import io
import time
from collections.abc import Callable

import httpx
from tritonbox_testing.api_process import RunningApi
from tritonbox_testing.batch_server import CHAT, chat, jsonl, lines_of, rows, sdk, wait_ended


def in_flight(api: RunningApi) -> float:
    for found in httpx.get(f"{api.url}/metrics", timeout=10).text.splitlines():
        if found.startswith("tritonbox_requests_in_flight "):
            return float(found.split()[1])
    raise AssertionError("no tritonbox_requests_in_flight on /metrics")


def test_a_cancel_stops_the_running_lines_and_keeps_the_rest(
    start_api: Callable[..., RunningApi], database_url: str
) -> None:
    api = start_api(batch_concurrent_requests="2", database_url=database_url)
    client = sdk(api)
    lines = [chat("quick", 2)] + [chat(f"long{i}", 400) for i in range(4)]  # 8 s each
    uploaded = client.files.create(file=("in.jsonl", io.BytesIO(jsonl(lines))), purpose="batch")
    batch = client.batches.create(input_file_id=uploaded.id, endpoint=CHAT, completion_window="24h")
    deadline = time.monotonic() + 60
    query = "SELECT status FROM prediction"
    while sorted(r["status"] for r in rows(database_url, query)) != [
        "processing",
        "processing",
        "succeeded",
    ]:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    began = time.monotonic()
    assert client.batches.cancel(batch.id).status == "cancelling"
    while in_flight(api) > 0:  # the running lines' predictions end (their engine requests stop)
        assert time.monotonic() - began < 3, "the running lines kept generating"
        time.sleep(0.05)
    done = wait_ended(client, batch.id)
    assert done.status == "cancelled" and done.cancelled_at
    good = lines_of(client, done.output_file_id)
    bad = lines_of(client, done.error_file_id)
    assert [x["custom_id"] for x in good] == ["quick"]
    assert sorted(x["custom_id"] for x in bad) == [f"long{i}" for i in range(4)]
    stopped = [x for x in bad if x["response"] is not None]
    assert len(stopped) == 2 and all(x["response"]["status_code"] == 499 for x in stopped)
    assert all(x["error"]["code"] == "batch_cancelled" for x in bad)
    statuses = sorted(r["status"] for r in rows(database_url, query))
    assert statuses == ["canceled", "canceled", "succeeded"]
