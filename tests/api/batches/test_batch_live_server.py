"""Live traffic first on the real api (synthetic engine), on SQLite and PostgreSQL: a live
request admitted beside running lines stops them at once (BATCH_REQUESTS_BESIDE_LIVE defaults
to 0; their predictions end canceled, the engine's requests stopped as for a client that
leaves), and they run again once live traffic is gone: each line ends once, in the output."""

from __future__ import annotations

import io
import time
from collections.abc import Callable

import httpx
from tritonbox_testing.api_process import RunningApi
from tritonbox_testing.batch_server import CHAT, MODEL, chat, jsonl, lines_of, rows, sdk, wait_ended

QUERY = "SELECT status, custom_id FROM prediction"


def statuses(url: str) -> list[tuple[str, str]]:
    """(status, custom_id) of every prediction, sorted; a live one's custom_id is ''."""
    return sorted((r["status"], r["custom_id"] or "") for r in rows(url, QUERY))


def test_a_live_request_stops_the_running_lines_and_they_run_again(
    start_api: Callable[..., RunningApi], database_url: str
) -> None:
    api = start_api(batch_concurrent_requests="3", database_url=database_url)
    client = sdk(api)
    lines = [chat(f"long{i}", 100) for i in range(3)]  # 2 s each at 20 ms a token
    uploaded = client.files.create(file=("in.jsonl", io.BytesIO(jsonl(lines))), purpose="batch")
    batch = client.batches.create(input_file_id=uploaded.id, endpoint=CHAT, completion_window="24h")
    deadline = time.monotonic() + 60
    while [s for s, _ in statuses(database_url)] != ["processing"] * 3:
        assert time.monotonic() < deadline, statuses(database_url)
        time.sleep(0.05)
    body = {
        "model": MODEL, "max_tokens": 100, "stream": True,
        "messages": [{"role": "user", "content": "Hello"}],
    }  # fmt: skip
    with httpx.stream("POST", f"{api.url}/v1/chat/completions", json=body, timeout=60) as live:
        assert live.status_code == 200
        chunks = live.iter_lines()
        next(chunk for chunk in chunks if chunk.startswith("data: "))
        began = time.monotonic()
        # While the live request runs: the three lines stopped (canceled), none started again.
        while statuses(database_url) != [("canceled", f"long{i}") for i in range(3)] + [
            ("processing", "")
        ]:
            assert time.monotonic() - began < 3, statuses(database_url)
            time.sleep(0.05)
        held = statuses(database_url)
        for _ in range(5):
            time.sleep(0.1)
            assert statuses(database_url) == held
        for _ in chunks:
            pass
    done = wait_ended(client, batch.id)
    assert done.status == "completed", done
    assert done.request_counts is not None and done.request_counts.completed == 3
    output = lines_of(client, done.output_file_id)
    assert sorted(x["custom_id"] for x in output) == ["long0", "long1", "long2"]
    assert all(x["response"]["status_code"] == 200 for x in output)
    assert statuses(database_url) == sorted(
        [("canceled", f"long{i}") for i in range(3)]
        + [("succeeded", f"long{i}") for i in range(3)]
        + [("succeeded", "")]
    )
