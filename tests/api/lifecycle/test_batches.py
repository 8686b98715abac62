"""Batch API in-process, in front of the fake engine whose work can be watched (conftest.py), on
SQLite and PostgreSQL: lines end exactly once through restarts, a cancel stops the engine's
requests as a client leaving does and keeps what finished, the completion window expires what
is left, and a line's refusal is its own error with the route's body."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from tritonbox_testing.batches import (
    CHAT,
    by_id,
    client,
    ended,
    jsonl,
    line,
    output,
    prediction_rows,
    submit,
)

from tritonbox_api import metrics


def count(outcome: str) -> float:
    return float(metrics.BATCH_LINES.labels(outcome)._value.get())


def test_lines_run_once_and_refusals_are_their_own_errors(
    make_stack: Callable[..., Any], database_url: str
) -> None:
    async def main() -> None:
        async with make_stack() as stack, client(stack) as api:
            before = count("completed"), count("failed")
            lines: list[Any] = [line(f"ok-{i}") for i in range(6)]
            lines += [line("plain", url="/v1/completions"), line("too-many", n=99)]
            lines += ["{not json", line("lost", url="/v1/embeddings")]
            batch = await submit(api, lines)
            assert batch["status"] == "validating" and batch["request_counts"]["total"] == 10
            done = await ended(api, batch["id"])
            assert done["status"] == "completed", done
            assert done["request_counts"] == {"total": 10, "completed": 7, "failed": 3}
            good = await output(api, done["output_file_id"])
            bad = await output(api, done["error_file_id"])
            every = by_id(good, bad)
            assert sorted(every, key=str) == sorted(
                [f"ok-{i}" for i in range(6)] + ["plain", "too-many", None, "lost"], key=str
            )
            assert all(len(found) == 1 for found in every.values())
            first = every["ok-0"][0]
            assert first["response"]["status_code"] == 200 and first["error"] is None
            assert first["response"]["body"]["object"] == "chat.completion"
            refused = every["too-many"][0]["response"]
            assert refused["status_code"] == 400 and refused["body"]["error"]["param"] == "n"
            assert every[None][0]["response"]["status_code"] == 400
            assert every["lost"][0]["response"]["status_code"] == 404
            # Each line answered is a prediction with its batch and custom_id.
            rows = {r["custom_id"]: r for r in prediction_rows(database_url)}
            for each in good:
                row = rows[each["custom_id"]]
                assert row["id"] == each["response"]["request_id"]
                assert row["batch_id"] == batch["id"] and row["status"] == "succeeded"
            assert count("completed") - before[0] == 7 and count("failed") - before[1] == 3
            # A duplicate custom_id refuses the batch.
            upload = await api.post(
                "/v1/files",
                files={"file": ("d.jsonl", jsonl([line("a"), line("b"), line("a")]))},
                data={"purpose": "batch"},
            )
            twice = await api.post(
                "/v1/batches", json={"input_file_id": upload.json()["id"], "endpoint": CHAT}
            )
            assert twice.status_code == 400, twice.text
            assert "'a' is on lines 1 and 3" in twice.json()["error"]["message"]

    asyncio.run(main())


def test_cancel_stops_the_engine_and_keeps_what_finished(
    make_stack: Callable[..., Any], database_url: str
) -> None:
    async def main() -> None:
        async with make_stack(batch_concurrent_requests=2) as stack, client(stack) as api:
            lines = [line("quick", max_tokens=2)] + [line(f"long-{i}", 400) for i in range(5)]
            batch = await submit(api, lines)
            async with asyncio.timeout(20):  # the quick one done, two long ones generating
                while len(stack.engine.active) < 2 or not any(
                    r["status"] == "succeeded" for r in prediction_rows(database_url)
                ):
                    await asyncio.sleep(0.01)
            cancelled = await api.post(f"/v1/batches/{batch['id']}/cancel")
            assert cancelled.json()["status"] == "cancelling", cancelled.text
            await stack.engine.idle_within(1.0)
            done = await ended(api, batch["id"])
            assert done["status"] == "cancelled" and done["request_counts"]["total"] == 6
            every = by_id(
                await output(api, done["output_file_id"]), await output(api, done["error_file_id"])
            )
            assert sorted(map(str, every)) == sorted(["quick"] + [f"long-{i}" for i in range(5)])
            assert all(len(found) == 1 for found in every.values())
            assert every["quick"][0]["response"]["status_code"] == 200
            stopped = [
                x[0]
                for x in every.values()
                if x[0]["response"] and x[0]["response"]["status_code"] == 499
            ]
            assert len(stopped) == 2
            assert all(x["error"]["code"] == "batch_cancelled" for x in stopped)
            rows = {r["id"]: r for r in prediction_rows(database_url)}
            assert all(rows[x["response"]["request_id"]]["status"] == "canceled" for x in stopped)
            assert sum(x[0]["response"] is None for x in every.values()) == 3
            assert stack.services.predictions.running_ids == []

    asyncio.run(main())


def test_the_completion_window_expires_what_is_left(make_stack: Callable[..., Any]) -> None:
    async def main() -> None:
        async with make_stack(batch_concurrent_requests=1) as stack, client(stack) as api:
            lines = [line("first", max_tokens=2)] + [line(f"slow-{i}", 400) for i in range(3)]
            batch = await submit(api, lines, window="2s")
            done = await ended(api, batch["id"], timeout_s=30)
            assert done["status"] == "expired" and done["expired_at"], done
            await stack.engine.idle_within(1.0)
            every = by_id(
                await output(api, done["output_file_id"]), await output(api, done["error_file_id"])
            )
            assert every["first"][0]["response"]["status_code"] == 200
            for i in range(3):
                (slow,) = every[f"slow-{i}"]
                assert slow["error"]["code"] == "batch_expired", slow
            assert done["request_counts"] == {"total": 4, "completed": 1, "failed": 3}

    asyncio.run(main())


def test_a_restart_resumes_and_every_line_ends_once(
    make_stack: Callable[..., Any], database_url: str
) -> None:
    async def main() -> None:
        async with make_stack(batch_concurrent_requests=2) as stack, client(stack) as api:
            batch = await submit(api, [line(f"l-{i}", 30) for i in range(8)])
            async with asyncio.timeout(20):  # stopped with lines done and lines running
                while (
                    len([r for r in prediction_rows(database_url) if r["status"] == "succeeded"])
                    < 2
                ):
                    await asyncio.sleep(0.02)
        async with make_stack(batch_concurrent_requests=2) as stack, client(stack) as api:
            done = await ended(api, batch["id"])
            assert done["status"] == "completed", done
            assert done["request_counts"] == {"total": 8, "completed": 8, "failed": 0}
            every = by_id(await output(api, done["output_file_id"]))
            assert sorted(map(str, every)) == [f"l-{i}" for i in range(8)]
            assert all(len(found) == 1 for found in every.values())
            rows = prediction_rows(database_url)
            # The lines stopped by the shutdown were saved canceled and run again.
            assert {r["status"] for r in rows} <= {"succeeded", "canceled"}
            answered = {x[0]["response"]["request_id"] for x in every.values()}
            assert {r["id"] for r in rows if r["status"] == "succeeded"} == answered

    asyncio.run(main())
