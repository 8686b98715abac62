"""MAX_CONCURRENT_REQUESTS counts engine requests: a prediction of `n` choices takes `n` slots,
and one that does not fit gets 429 with Retry-After, saying how many it needs."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any, cast

import pytest

from tritonbox_api.db.models import Source
from tritonbox_api.db.session import Database
from tritonbox_api.protocol.errors import ApiError
from tritonbox_api.service.predictions import PredictionService
from tritonbox_api.service.prepare import PreparedGeneration
from tritonbox_api.triton_gateway import TritonGateway
from tritonbox_common.client import Chunk, GenerationRequest
from tritonbox_common.tokenization import load_tokenizer
from tritonbox_triton.prepare_model import prepare_default_model
from tritonbox_triton.settings import DEFAULT_MODEL_NAME

REPO = Path(__file__).resolve().parents[3]


class _HeldGateway:
    """Every engine request waits until `release` is set, then ends with no token."""

    def __init__(self) -> None:
        self.release = asyncio.Event()

    async def stream(self, request: GenerationRequest) -> AsyncGenerator[Chunk, None]:
        await self.release.wait()
        yield Chunk(ids=[], final=True)

    async def is_ready(self) -> bool:
        return True

    async def stop_request(self, request_id: str, *, timeout_s: float) -> bool:
        return True


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return load_tokenizer(prepare_default_model(REPO / ".cache" / "models" / DEFAULT_MODEL_NAME))


def test_n_choices_take_n_slots(tokenizer: Any) -> None:
    prepared = PreparedGeneration(
        request=GenerationRequest(prompt="p", max_tokens=1),
        prompt_tokens=1,
        applied={},
        stop_words=(),
    )

    async def scenario() -> None:
        gateway = _HeldGateway()
        service = PredictionService(
            gateway=cast(TritonGateway, gateway), database=cast(Database, None),
            max_concurrent=4, log_predictions=False,
        )  # fmt: skip

        def start(n: int) -> Any:
            return service.start(prepared, tokenizer=tokenizer, source=Source.API, model="m",
                                 sent={}, extra=[prepared] * (n - 1))  # fmt: skip

        three = start(3)  # 3 of 4 slots
        with pytest.raises(ApiError) as refused:
            start(2)
        assert refused.value.status_code == 429 and refused.value.headers["Retry-After"] == "1"
        assert "1 free, this request needs 2" in refused.value.message
        one = start(1)  # the last slot
        with pytest.raises(ApiError):
            start(1)
        gateway.release.set()
        await asyncio.gather(three.wait(), one.wait())
        alone = start(8)  # alone, more choices than slots: runs, else it never could
        with pytest.raises(ApiError):
            start(1)
        await alone.wait()
        start(4)  # every slot given back

    asyncio.run(scenario())
