"""Batch lines in-process (the fake engine, conftest.py) as the live routes run them: with the
batch creator's key on each row (and no key, no batch), an adapter as `model`, and an engine
that goes away mid-batch (Triton restarting): the lines wait and run once it is back."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from tritonbox_testing.batches import (
    by_id,
    client,
    ended,
    jsonl,
    line,
    output,
    prediction_rows,
    submit,
)
from tritonbox_testing.lora import make_adapter

from tritonbox_api.service import batch_room
from tritonbox_api.triton_gateway import LoraSupport

KEYS = "alice:use:secret-a,boss:manage:secret-b"


def test_a_batch_needs_a_key_and_its_lines_carry_its_name(
    make_stack: Callable[..., Any], database_url: str
) -> None:
    async def main() -> None:
        async with make_stack(api_keys=KEYS) as stack:
            async with client(stack) as anonymous:
                refused = await anonymous.post(
                    "/v1/files",
                    files={"file": ("a.jsonl", jsonl([line("x")]))},
                    data={"purpose": "batch"},
                )
                assert refused.status_code == 401
                assert (await anonymous.get("/v1/batches")).status_code == 401
            async with client(stack, "secret-a") as alice:
                batch = await submit(alice, [line(f"a{i}") for i in range(3)])
                done = await ended(alice, batch["id"])
                assert done["status"] == "completed", done
            rows = [r for r in prediction_rows(database_url) if r["batch_id"] == batch["id"]]
            assert len(rows) == 3 and {r["api_key_name"] for r in rows} == {"alice"}

    asyncio.run(main())


def test_an_adapter_answers_as_model(
    make_stack: Callable[..., Any], database_url: str, tokenizer_dir: Path, tmp_path: Path
) -> None:
    folder = make_adapter(
        tokenizer_dir,
        tmp_path / "pirate",
        1,
        r=4,
        lora_alpha=8,
        target_modules=["q_proj", "v_proj"],
    )

    async def main() -> None:
        async with make_stack(adapter_dirs=str(tmp_path)) as stack, client(stack) as api:
            support = LoraSupport(
                max_rank=64, target_modules=("q_proj", "v_proj"), weights_datatype="FP32"
            )

            async def lora_support() -> LoraSupport:
                return support

            stack.engine.lora_support = lora_support
            added = await api.post("/v1/adapters", json={"name": "pirate", "source": str(folder)})
            assert added.status_code == 201, added.text
            lines = [line("base"), line("arr", model="pirate"), line("gone", model="nobody")]
            done = await ended(api, (await submit(api, lines))["id"])
            every = by_id(
                await output(api, done["output_file_id"]), await output(api, done["error_file_id"])
            )
            (arr,) = every["arr"]
            assert arr["response"]["status_code"] == 200 and arr["response"]["body"]["model"] == (
                "pirate"
            )
            (gone,) = every["gone"]
            assert gone["response"]["status_code"] == 404
            assert gone["response"]["body"]["error"]["param"] == "model"
            rows = {r["custom_id"]: r for r in prediction_rows(database_url)}
            assert rows["arr"]["adapter_name"] == "pirate" and rows["base"]["adapter_name"] is None

    asyncio.run(main())


def test_lines_wait_for_an_engine_that_went_away(make_stack: Callable[..., Any]) -> None:
    async def main() -> None:
        async with make_stack(batch_concurrent_requests=2) as stack, client(stack) as api:
            stack.engine.down = True
            batch = await submit(api, [line(f"w{i}") for i in range(4)])
            await asyncio.sleep(1.5)  # lines tried, refused for now (503), back to pending
            waiting = (await api.get(f"/v1/batches/{batch['id']}")).json()
            assert waiting["status"] == "in_progress" and waiting["request_counts"]["failed"] == 0
            stack.engine.down = False
            done = await ended(api, batch["id"])
            assert done["status"] == "completed"
            assert done["request_counts"] == {"total": 4, "completed": 4, "failed": 0}
            every = by_id(await output(api, done["output_file_id"]))
            assert sorted(map(str, every)) == [f"w{i}" for i in range(4)]

    asyncio.run(main())


def test_live_requests_come_first(
    make_stack: Callable[..., Any], database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A live request admitted beside lines filling BATCH_CONCURRENT_REQUESTS (4) stops all but
    BATCH_REQUESTS_BESIDE_LIVE (1) of them at once; no other line starts while
    it runs or for LIVE_QUIET_S after; then the lines fill the share again. The stopped lines
    run again: each ends once in the output, and their first runs stay saved as canceled."""
    monkeypatch.setattr(batch_room, "LIVE_QUIET_S", 0.5)

    async def main() -> None:
        settings = {"batch_concurrent_requests": 4, "batch_requests_beside_live": 1}
        async with make_stack(**settings) as stack, client(stack) as api:
            engine = stack.engine
            batch = await submit(api, [line(f"b{i}", 200) for i in range(6)])
            async with asyncio.timeout(30):
                while len(engine.active) < 4:
                    await asyncio.sleep(0.01)
            first_four = [r.request_id for r in engine.started]
            live = {"model": "fake-model", "prompt": "Hi", "max_tokens": 300, "stream": True}
            stream = stack.call("POST", "/v1/completions", live)
            await stream.wait_chunks(1)
            async with asyncio.timeout(5):  # the three newest lines stopped: 1 line + 1 live
                while len(engine.active) > 2:
                    await asyncio.sleep(0.005)
            assert len(set(engine.stops)) == 3 and set(engine.stops) < set(first_four)
            for _ in range(100):  # while it runs: never a second line
                assert len(engine.active) <= 2, engine.active
                await asyncio.sleep(0.01)
            stream.disconnect.set()
            await stream.finish()
            assert stream.status == 200
            async with asyncio.timeout(10):  # once live traffic is gone: the share again
                while len(engine.active) < 4:
                    await asyncio.sleep(0.01)
            done = await ended(api, batch["id"])
            assert done["request_counts"] == {"total": 6, "completed": 6, "failed": 0}
            every = by_id(await output(api, done["output_file_id"]))
            assert sorted(map(str, every)) == [f"b{i}" for i in range(6)]
            assert all(len(answers) == 1 for answers in every.values())
            rows = [r for r in prediction_rows(database_url) if r["batch_id"] == batch["id"]]
            canceled = sorted(r["custom_id"] for r in rows if r["status"] == "canceled")
            assert len(canceled) == 3 and len(rows) == 9, rows

    asyncio.run(main())
