"""RunningPrediction.events(): pieces queued behind each other come as one, the end never merged."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any, cast

import pytest

from tritonbox_api.db.models import Prediction, Source, Status
from tritonbox_api.db.session import Database
from tritonbox_api.service.predictions import Ended, Event, PredictionService, RunningPrediction
from tritonbox_api.service.prepare import PreparedGeneration
from tritonbox_api.triton_gateway import TritonGateway
from tritonbox_common.client import Chunk, GenerationRequest
from tritonbox_common.tokenization import load_tokenizer
from tritonbox_triton.prepare_model import prepare_default_model
from tritonbox_triton.settings import DEFAULT_MODEL_NAME

REPO = Path(__file__).resolve().parents[3]


def _running(*queued: Event) -> RunningPrediction:
    running = RunningPrediction(id="p", prepared=cast(PreparedGeneration, None))
    for event in queued:
        running.queue.put_nowait(event)
    return running


def _ended() -> Ended:
    prediction = Prediction(id="p", source=Source.API, model="m", status=Status.SUCCEEDED)
    return Ended(prediction)


async def _collect(running: RunningPrediction) -> list[Event]:
    return [event async for event in running.events()]


def test_queued_pieces_come_as_one_and_the_end_stays_apart() -> None:
    end = _ended()
    pieces = ["Hel", "lo", ", wörld", " 🦊", "\n"]
    events = asyncio.run(_collect(_running(*pieces, end)))
    assert events == ["".join(pieces), end]


def test_pieces_that_arrive_later_are_separate_chunks() -> None:
    async def scenario() -> list[Event]:
        running = _running("a", "b")
        end = _ended()
        got: list[Event] = []
        async for event in running.events():
            got.append(event)
            if event == "ab":  # the consumer has caught up: later pieces are not held back
                running.queue.put_nowait("c")
            elif event == "c":
                running.queue.put_nowait("d")
                running.queue.put_nowait("e")
                running.queue.put_nowait(end)
        return got

    events = asyncio.run(scenario())
    assert events[:3] == ["ab", "c", "de"]
    assert isinstance(events[3], Ended) and len(events) == 4


def test_an_end_alone_ends_at_once() -> None:
    end = _ended()
    assert asyncio.run(_collect(_running(end))) == [end]


class _BurstGateway:
    """Triton's responses for `text`, one token each, all ready at once (a backlog)."""

    def __init__(self, ids: list[int]) -> None:
        self._ids = ids

    async def stream(self, request: GenerationRequest) -> AsyncGenerator[Chunk, None]:
        for token in self._ids[: request.max_tokens]:
            yield Chunk(ids=[token], final=False)
        yield Chunk(ids=[], final=True)

    async def is_ready(self) -> bool:
        return True

    async def stop_request(self, request_id: str, *, timeout_s: float) -> bool:
        return True


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return load_tokenizer(prepare_default_model(REPO / ".cache" / "models" / DEFAULT_MODEL_NAME))


@pytest.mark.parametrize("stop_words", [(), ("fox",), (" dog and", "never")])
def test_a_backlog_streams_the_exact_output_without_stop_words(
    tokenizer: Any, stop_words: tuple[str, ...]
) -> None:
    text = "The quick brown 🦊 fox jumps over the lazy dog and runs, café — done."
    ids = tokenizer.encode(text, add_special_tokens=False)
    request = GenerationRequest(prompt="p", max_tokens=len(ids), stop_words=list(stop_words))
    prepared = PreparedGeneration(
        request=request, prompt_tokens=1, applied={}, stop_words=stop_words
    )
    gateway = cast(TritonGateway, _BurstGateway(ids))
    service = PredictionService(
        gateway=gateway, database=cast(Database, None), max_concurrent=1, log_predictions=False
    )

    async def scenario() -> list[Event]:
        running = service.start(
            prepared, tokenizer=tokenizer, source=Source.API, model="m", sent={}
        )
        assert running.producer is not None
        await running.producer  # every piece is queued before the consumer reads one
        return [event async for event in running.events()]

    events = asyncio.run(scenario())
    *texts, end = events
    assert isinstance(end, Ended) and all(isinstance(t, str) for t in texts)
    assert len(texts) == 1  # the backlog came as one chunk
    output = end.prediction.output
    assert texts[0] == output
    expected = text
    for word in stop_words:
        expected = expected.split(word)[0] if word in expected else expected
    assert output == expected and not any(word in output for word in stop_words)
