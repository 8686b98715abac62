"""Batch lines in-process (the fake engine, conftest.py) as the live routes run them: with the
batch creator's key on each row (and no key, no batch), an adapter as `model`, and an engine
that goes away mid-batch (Triton restarting): the lines wait and run once it is back."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

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


def test_live_requests_come_first(make_stack: Callable[..., Any]) -> None:
    """BATCH_CONCURRENT_REQUESTS counts live and batch requests together: with it at 3 and two
    live requests generating, one line runs at a time; the live ones are never refused."""

    async def main() -> None:
        async with make_stack(batch_concurrent_requests=3) as stack, client(stack) as api:
            live = {"model": "fake-model", "prompt": "Hi", "max_tokens": 300, "stream": True}
            streams = [stack.call("POST", "/v1/completions", live) for _ in range(2)]
            for each in streams:
                await each.wait_chunks(1)
            batch = await submit(api, [line(f"b{i}", 20) for i in range(4)])
            async with asyncio.timeout(30):
                while len(stack.engine.active) < 3:  # a line started beside them
                    await asyncio.sleep(0.01)
                for _ in range(100):  # while both live requests run: never two lines at once
                    assert len(stack.engine.active) <= 3, stack.engine.active
                    await asyncio.sleep(0.01)
            for each in streams:
                each.disconnect.set()
                await each.finish()
                assert each.status == 200
            done = await ended(api, batch["id"])
            assert done["request_counts"] == {"total": 4, "completed": 4, "failed": 0}

    asyncio.run(main())
