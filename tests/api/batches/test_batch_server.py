"""The Batch API on the real api process in front of the real tritonserver (its synthetic
engine: the ensemble's tensors, tokens at a fixed pace, no model's CPU): the `openai` SDK's own
flow, unmodified; the size limits' 413s; an api killed mid-batch and started again, every line
ending exactly once; and two api processes on one PostgreSQL database sharing a batch's lines."""

from __future__ import annotations

import io
import signal
import time
from collections.abc import Callable

import httpx
import openai
import pytest
from tritonbox_testing.api_process import RunningApi
from tritonbox_testing.batch_server import (
    CHAT,
    COMPLETIONS,
    MODEL,
    chat,
    jsonl,
    lines_of,
    rows,
    sdk,
    wait_ended,
)
from tritonbox_testing.postgres import RunningPostgres

from tritonbox_api.service.batch_pace import LINES_PER_STEP
from tritonbox_api.service.batch_room import LIVE_QUIET_S


def test_the_openai_sdk_runs_a_batch(
    start_api: Callable[..., RunningApi], database_url: str
) -> None:
    api = start_api(database_url=database_url)
    client = sdk(api)
    lines = [chat(f"c{i}", seed=i, temperature=0.5) for i in range(5)]
    lines.append(
        {
            "custom_id": "t",
            "method": "POST",
            "url": COMPLETIONS,
            "body": {"model": MODEL, "prompt": "Once", "max_tokens": 3, "n": 2},
        }
    )
    lines.append(chat("bad", temperature=9))  # the route refuses it: that line's 400
    uploaded = client.files.create(file=("in.jsonl", io.BytesIO(jsonl(lines))), purpose="batch")
    assert uploaded.purpose == "batch" and uploaded.bytes == len(jsonl(lines))
    assert client.files.retrieve(uploaded.id).filename == "in.jsonl"
    batch = client.batches.create(
        input_file_id=uploaded.id,
        endpoint=CHAT,
        completion_window="24h",
        metadata={"job": "nightly"},
    )
    assert batch.status == "validating" and batch.metadata == {"job": "nightly"}
    done = wait_ended(client, batch.id)
    assert done.status == "completed", done
    assert done.request_counts is not None
    assert (done.request_counts.total, done.request_counts.completed) == (7, 6)
    assert done.request_counts.failed == 1
    assert done.in_progress_at and done.completed_at and done.expires_at
    good = lines_of(client, done.output_file_id)
    bad = lines_of(client, done.error_file_id)
    assert sorted(x["custom_id"] for x in good) == ["c0", "c1", "c2", "c3", "c4", "t"]
    (refused,) = bad
    assert refused["custom_id"] == "bad" and refused["response"]["status_code"] == 400
    assert refused["response"]["body"]["error"]["param"] == "temperature"
    completion = next(x for x in good if x["custom_id"] == "t")["response"]["body"]
    assert completion["object"] == "text_completion" and len(completion["choices"]) == 2
    # Each answer's request_id is its prediction, with its permalink.
    first = good[0]["response"]
    prediction = httpx.get(f"{api.url}/v1/predictions/{first['request_id']}").json()
    assert prediction["status"] == "succeeded"
    assert httpx.get(f"{api.url}/p/{first['request_id']}").status_code == 200
    assert [b.id for b in client.batches.list().data] == [batch.id]
    listed = {f.id: f.purpose for f in client.files.list().data}
    assert listed[uploaded.id] == "batch" and listed[done.output_file_id] == "batch_output"
    assert client.files.delete(uploaded.id).deleted
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(uploaded.id)
    metrics = httpx.get(f"{api.url}/metrics").text
    assert 'tritonbox_batch_lines_total{outcome="completed"} 6.0' in metrics
    assert "tritonbox_batch_lines_waiting 0.0" in metrics
    limits = httpx.get(f"{api.url}/v1/limits").json()
    assert limits["max_batch_lines"] == 50_000 and limits["max_batch_file_bytes"] > 0


def test_the_batch_limits_answer_413_naming_them(start_api: Callable[..., RunningApi]) -> None:
    api = start_api(
        max_batch_file_bytes="2000",
        max_batch_lines="3",
        batch_concurrent_requests="6",
        batch_requests_beside_live="2",
    )
    # /v1/limits names every batch limit, as set.
    limits = httpx.get(f"{api.url}/v1/limits").json()
    assert (limits["max_batch_file_bytes"], limits["max_batch_lines"]) == (2000, 3)
    assert (limits["batch_concurrent_requests"], limits["batch_requests_beside_live"]) == (6, 2)
    assert limits["batch_live_quiet_s"] == LIVE_QUIET_S
    assert limits["batch_lines_per_step"] == LINES_PER_STEP
    assert limits["max_completion_window"] == "168h"
    client = sdk(api)
    with pytest.raises(openai.APIStatusError) as big:
        client.files.create(file=("big.jsonl", io.BytesIO(b"x" * 2001)), purpose="batch")
    assert big.value.status_code == 413 and "MAX_BATCH_FILE_BYTES" in big.value.message
    huge = b"x" * 200_000  # over the form's allowance too: refused before it is read
    with pytest.raises(openai.APIStatusError) as bigger:
        client.files.create(file=("huge.jsonl", io.BytesIO(huge)), purpose="batch")
    assert bigger.value.status_code == 413 and "MAX_BATCH_FILE_BYTES" in bigger.value.message
    with pytest.raises(openai.APIStatusError) as many:
        client.files.create(
            file=("many.jsonl", io.BytesIO(jsonl([chat(f"{i}") for i in range(4)]))),
            purpose="batch",
        )
    assert many.value.status_code == 413 and "MAX_BATCH_LINES" in many.value.message


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["killed", "stopped"])
def test_a_restarted_api_resumes_and_every_line_ends_once(
    start_api: Callable[..., RunningApi], sig: signal.Signals, database_url: str
) -> None:
    api = start_api(batch_concurrent_requests="4", database_url=database_url)
    client = sdk(api)
    count = 24
    uploaded = client.files.create(
        file=("in.jsonl", io.BytesIO(jsonl([chat(f"l{i}", 25) for i in range(count)]))),
        purpose="batch",
    )
    batch = client.batches.create(input_file_id=uploaded.id, endpoint=CHAT, completion_window="24h")
    url = database_url
    deadline = time.monotonic() + 60
    while not rows(url, "SELECT id FROM prediction WHERE status = 'succeeded'"):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    api.stop(sig)  # mid-batch: lines done, lines running, lines waiting
    api.start()
    done = wait_ended(client, batch.id)
    assert done.status == "completed", done
    every = lines_of(client, done.output_file_id) + lines_of(client, done.error_file_id)
    assert sorted(x["custom_id"] for x in every) == sorted(f"l{i}" for i in range(count))
    assert all(x["response"]["status_code"] == 200 for x in every)
    # Every answer is a prediction that succeeded; the runs the stop interrupted were saved
    # canceled (or failed, killed) and ran again.
    found = rows(url, "SELECT id, status, custom_id FROM prediction")
    succeeded = [r for r in found if r["status"] == "succeeded"]
    answers = {x["response"]["request_id"] for x in every}
    assert answers <= {r["id"] for r in succeeded}
    twice = len(succeeded) - count
    if sig is signal.SIGTERM:  # a stop records or gives back each running line: none twice
        assert twice == 0
    else:  # killed between a line's prediction ending and the line's end being written
        assert 0 <= twice <= 4, twice  # at most the lines running then (docs/batches.md)


def test_two_api_processes_share_a_batch_on_postgresql(
    start_api: Callable[..., RunningApi], postgres_server: RunningPostgres
) -> None:
    url = postgres_server.create_database()
    first = start_api(database_url=url, batch_concurrent_requests="3")
    second = start_api(database_url=url, batch_concurrent_requests="3")
    client = sdk(first)
    count = 30
    uploaded = client.files.create(
        file=("in.jsonl", io.BytesIO(jsonl([chat(f"l{i}", 10) for i in range(count)]))),
        purpose="batch",
    )
    batch = client.batches.create(input_file_id=uploaded.id, endpoint=CHAT, completion_window="24h")
    done = wait_ended(sdk(second), batch.id)
    assert done.status == "completed" and done.request_counts is not None
    assert done.request_counts.completed == count
    found = rows(url, "SELECT custom_id, owner FROM prediction WHERE batch_id IS NOT NULL")
    assert sorted(r["custom_id"] for r in found) == sorted(f"l{i}" for i in range(count))
    assert len({r["owner"] for r in found}) == 2  # both processes ran lines, none twice
