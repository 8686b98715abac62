"""EngineContextLoader.warm_up: the tokenizer is loaded from the process's start, once Triton
answers, not by the first request (a fake gateway: no server needed)."""

from __future__ import annotations

import asyncio
import gc
from pathlib import Path
from typing import Any

import pytest

from tritonbox_api.service import engine_context
from tritonbox_api.service.engine_context import EngineContextLoader
from tritonbox_api.triton_gateway import EngineInfo, TritonUnavailableError
from tritonbox_triton.prepare_model import prepare_default_model

REPO = Path(__file__).resolve().parents[3]


class StartingTriton:
    """Unavailable for its first `refusals` questions, then answers with the default model."""

    def __init__(self, refusals: int, model_dir: Path) -> None:
        self.refusals = refusals
        self.asked = 0
        self.model_dir = model_dir

    async def engine_info(self) -> EngineInfo:
        self.asked += 1
        if self.asked <= self.refusals:
            raise TritonUnavailableError("Triton is unavailable: connection refused")
        return EngineInfo(tokenizer_dir=self.model_dir, max_input_len=64, max_output_len=32)


@pytest.fixture(scope="module")
def model_dir() -> Path:
    folder = REPO / ".cache" / "models" / "SmolLM2-135M-Instruct"
    prepare_default_model(folder)
    return folder


def test_warm_up_retries_until_triton_answers(
    model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(engine_context, "WARM_UP_RETRY_S", (0.01, 0.02))
    triton = StartingTriton(refusals=3, model_dir=model_dir)
    gateway: Any = triton
    loader = EngineContextLoader(gateway, model_name=None)
    assert loader.loaded is None

    gc.unfreeze()
    asyncio.run(asyncio.wait_for(loader.warm_up(), timeout=60))
    frozen = gc.get_freeze_count()  # the loaded heap is out of the collector's scans
    gc.unfreeze()
    assert frozen > 0

    assert triton.asked == 4  # three refusals, then loaded; nothing asked after that
    context = loader.loaded
    assert context is not None and context.model_name == model_dir.name
    assert context.tokenizer.decode(context.tokenizer.encode("Paris")) == "Paris"


def test_warm_up_stops_when_cancelled(model_dir: Path) -> None:
    triton = StartingTriton(refusals=10**6, model_dir=model_dir)
    gateway: Any = triton

    async def scenario() -> None:
        task = asyncio.create_task(EngineContextLoader(gateway, model_name=None).warm_up())
        await asyncio.sleep(0.2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(scenario())
    assert triton.asked >= 1
