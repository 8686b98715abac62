"""A prediction's life in-process: whatever ends it, and in whatever order, the engine's request
stops (within a second, by its own active-request count), the row ends once in a final state,
and the concurrency slot and the in-flight gauge come back.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from tritonbox_api import metrics
from tritonbox_api.db import pages
from tritonbox_api.db.models import Source
from tritonbox_api.service.options import GenerationOptions
from tritonbox_api.service.prepare import prepare
from tritonbox_common.client import TritonRequestError

PROMPT = "The capital of France is"
LONG = {"prompt": PROMPT, "max_tokens": 400}
ROUTES: dict[str, dict[str, Any]] = {
    "/predict": LONG,
    "/v1/predictions": {"input": LONG, "stream": True},
    "/v1/completions": {"model": "fake-model", **LONG, "stream": True},
    "/v1/chat/completions": {
        "model": "fake-model",
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": 400,
        "stream": True,
    },
}


def in_flight() -> float:
    return float(metrics.IN_FLIGHT._value.get())


def run(
    make_stack: Callable[..., Any], scenario: Callable[[Any], Awaitable[None]], **kw: Any
) -> None:
    async def main() -> None:
        async with make_stack(**kw) as stack:
            before = in_flight()
            await scenario(stack)
            assert stack.services.predictions.running_ids == []
            assert in_flight() == before
            assert not stack.engine.active

    asyncio.run(main())


async def rows(stack: Any) -> list[Any]:
    found, _ = await stack.services.database.read(
        lambda session: pages.list_predictions(session=session, limit=100)
    )
    return list(found)


async def settled(stack: Any) -> None:
    async with asyncio.timeout(10):
        while stack.services.predictions.running_ids:
            await asyncio.sleep(0.005)


@pytest.mark.parametrize("path", list(ROUTES))
def test_a_client_leaving_mid_stream_stops_the_engine_within_a_second(
    make_stack: Callable[..., Any], path: str
) -> None:
    async def scenario(stack: Any) -> None:
        exchange = stack.call("POST", path, ROUTES[path])
        await exchange.wait_chunks(2)
        assert exchange.status in (200, 201) and stack.engine.active
        exchange.disconnect.set()
        await stack.engine.idle_within(1.0)
        await exchange.finish()
        await settled(stack)
        (row,) = await rows(stack)
        assert row.status.value == "canceled" and 0 < row.completion_tokens < 400
        assert stack.engine.stops == [stack.engine.started[0].request_id]

    run(make_stack, scenario)


@pytest.mark.parametrize("path", list(ROUTES))
def test_a_client_leaving_before_the_first_token_stops_the_engine(
    make_stack: Callable[..., Any], path: str
) -> None:
    async def scenario(stack: Any) -> None:
        stack.engine.queued_s = 30.0  # waits in the engine's queue: no token, no response yet
        exchange = stack.call("POST", path, ROUTES[path])
        async with asyncio.timeout(5):
            while not stack.engine.active:
                await asyncio.sleep(0.005)
        assert exchange.status is None
        exchange.disconnect.set()
        await stack.engine.idle_within(1.0)
        await exchange.finish()
        await settled(stack)
        (row,) = await rows(stack)
        assert row.status.value == "canceled" and row.completion_tokens == 0

    run(make_stack, scenario)


def test_a_non_streaming_client_leaving_stops_the_engine(make_stack: Callable[..., Any]) -> None:
    async def scenario(stack: Any) -> None:
        exchange = stack.call("POST", "/v1/predictions", {"input": LONG})
        await asyncio.sleep(0.2)
        exchange.disconnect.set()
        await stack.engine.idle_within(1.0)
        await exchange.finish()
        await settled(stack)
        (row,) = await rows(stack)
        assert row.status.value == "canceled"

    run(make_stack, scenario)


def test_cancel_while_queued(make_stack: Callable[..., Any]) -> None:
    async def scenario(stack: Any) -> None:
        stack.engine.queued_s = 30.0
        waiting = stack.call("POST", "/v1/predictions", {"input": LONG})
        async with asyncio.timeout(5):
            while not stack.engine.active:
                await asyncio.sleep(0.005)
        (prediction_id,) = stack.services.predictions.running_ids
        cancel = await stack.call("POST", f"/v1/predictions/{prediction_id}/cancel").finish()
        assert cancel.status == 200 and cancel.json()["status"] == "canceled"
        assert not stack.engine.active  # stopped before the cancel answered
        created = await waiting.finish()
        assert created.status == 201 and created.json()["status"] == "canceled"

    run(make_stack, scenario)


def test_cancels_from_everywhere_at_once_end_it_once(make_stack: Callable[..., Any]) -> None:
    async def scenario(stack: Any) -> None:
        exchange = stack.call("POST", "/v1/predictions", ROUTES["/v1/predictions"])
        await exchange.wait_chunks(2)
        (prediction_id,) = stack.services.predictions.running_ids
        service = stack.services.predictions
        cancels = [stack.call("POST", f"/v1/predictions/{prediction_id}/cancel") for _ in "ab"]
        results = await asyncio.gather(service.cancel(prediction_id), service.cancel_all())
        exchange.disconnect.set()
        for cancel in cancels:
            assert (await cancel.finish()).json()["status"] == "canceled"
        assert results[0] is True
        assert await service.cancel(prediction_id) is False  # ended: nothing to cancel
        await exchange.finish()
        assert len(stack.engine.stops) == 1
        (row,) = await rows(stack)
        assert row.status.value == "canceled"

    run(make_stack, scenario)


def test_cancel_during_the_final_write_still_releases_everything(
    make_stack: Callable[..., Any],
) -> None:
    async def scenario(stack: Any) -> None:
        writes = stack.services.predictions._recorder.writes  # the row's completion goes there
        writing, release = asyncio.Event(), asyncio.Event()
        real_complete = writes.complete

        async def slow_complete(**ending: Any) -> Any:
            writing.set()
            await release.wait()
            return await real_complete(**ending)

        writes.complete = slow_complete
        body = {"input": {"prompt": PROMPT, "max_tokens": 3}}
        exchange = stack.call("POST", "/v1/predictions", body)
        await asyncio.wait_for(writing.wait(), 10)
        (prediction_id,) = stack.services.predictions.running_ids
        running = stack.services.predictions.running(prediction_id)
        assert running is not None
        cancel = asyncio.create_task(stack.services.predictions.cancel(prediction_id))
        await asyncio.sleep(0.01)
        assert running.producer is not None
        for _ in range(3):  # the old code lost its slot to the second of these
            running.cancel("late")
            running.producer.cancel()
            cancel.cancel()
            await asyncio.sleep(0.01)
        release.set()
        assert (await exchange.finish()).json()["status"] == "succeeded"
        await settled(stack)
        (row,) = await rows(stack)
        assert row.status.value == "succeeded" and row.completion_tokens == 3

    run(make_stack, scenario)


def test_slots_do_not_leak(make_stack: Callable[..., Any]) -> None:
    async def scenario(stack: Any) -> None:
        service = stack.services.predictions
        for _ in range(10):
            exchange = stack.call("POST", "/predict", LONG)
            await exchange.wait_chunks(1)
            (prediction_id,) = service.running_ids
            await asyncio.gather(service.cancel(prediction_id), service.cancel(prediction_id))
            exchange.disconnect.set()
            await exchange.finish()
        streams = [stack.call("POST", "/predict", LONG) for _ in range(2)]
        for stream in streams:
            await stream.wait_chunks(1)
        refused = await stack.call("POST", "/predict", LONG).finish()
        assert refused.status == 429
        for stream in streams:
            stream.disconnect.set()
            await stream.finish()
        await settled(stack)

    run(make_stack, scenario, max_concurrent_requests=2)


def test_shutdown_cancels_and_stops_everything(
    make_stack: Callable[..., Any], database_url: str
) -> None:
    async def main() -> None:
        async with make_stack() as stack:
            engine = stack.engine
            exchanges = [stack.call("POST", "/predict", LONG) for _ in range(3)]
            for exchange in exchanges:
                await exchange.wait_chunks(1)
        assert not engine.active and len(engine.stops) == 3
        for exchange in exchanges:
            exchange.disconnect.set()
            await exchange.finish()

    asyncio.run(main())
    # Read after the app is gone: what it left in the database (SQLite or PostgreSQL).
    engine = create_engine(database_url)
    with engine.connect() as connection:
        statuses = [s for (s,) in connection.execute(text("SELECT status FROM prediction"))]
    engine.dispose()
    assert statuses == ["canceled"] * 3


@pytest.mark.parametrize(
    ("stop", "output", "reason", "matched"),
    [
        (["\nParis"], None, "length", None),  # the text never holds "\nParis": nothing is cut
        (["Paris\n"], None, "length", None),
        ([".\n\n"], " Paris", "stop_word", ".\n\n"),
        (["Paris"], " ", "stop_word", "Paris"),
        (["zebra", ".\n\n", "Paris"], " ", "stop_word", "Paris"),  # the first in the text
    ],
)
def test_stop_words_cut_exactly_and_stop_the_engine(
    make_stack: Callable[..., Any],
    stop: list[str],
    output: str | None,
    reason: str,
    matched: str | None,
) -> None:
    async def scenario(stack: Any) -> None:
        engine = stack.engine
        count = len(engine.ids)
        body = {"prompt": PROMPT, "max_tokens": count, "stream": False, "stop_words_list": stop}
        answer = (await stack.call("POST", "/predict", body).finish()).json()
        assert answer["output"] == (output if output is not None else engine_text(stack, count))
        assert answer["finish_reason"] == reason
        assert answer["stop_word"] == matched  # which one: the output alone cannot say
        assert engine.started[0].stop_words == ()  # the api's exact text decides, alone
        assert engine.stops == ([] if reason == "length" else [engine.started[0].request_id])

    run(make_stack, scenario)


def engine_text(stack: Any, count: int) -> str:
    tokenizer = stack.services.engine_context.loaded.tokenizer
    return str(tokenizer.decode(stack.engine.ids[:count]))


def test_a_chunked_body_over_the_limit_gets_413_naming_it(
    make_stack: Callable[..., Any],
) -> None:
    async def scenario(stack: Any) -> None:
        body = {"prompt": "x" * 5000, "max_tokens": 2}
        refused = await stack.call("POST", "/predict", body, chunked=True).finish()
        assert refused.status == 413
        assert "MAX_BODY_BYTES" in refused.json()["error"]["message"]
        small = {"prompt": PROMPT, "max_tokens": 2, "stream": False}
        accepted = await stack.call("POST", "/predict", small, chunked=True).finish()
        assert accepted.status == 200 and accepted.json()["status"] == "succeeded"

    run(make_stack, scenario, max_body_bytes=4096)


def test_permalink_snippets_carry_the_api_key(make_stack: Callable[..., Any]) -> None:
    async def scenario(stack: Any) -> None:
        auth = {"Authorization": "Bearer s3cret"}
        body = {"input": {"prompt": PROMPT, "max_tokens": 2}}
        created = await stack.call("POST", "/v1/predictions", body, headers=auth).finish()
        page = await stack.call("GET", f"/p/{created.json()['id']}", headers=auth).finish()
        assert page.status == 200
        text = page.body.decode()
        assert "Bearer $API_KEY" in text and "os.environ" in text
        assert "s3cret" not in text

    run(make_stack, scenario, api_key="s3cret")


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_openai_default_max_tokens_fits_a_small_engine(
    make_stack: Callable[..., Any], path: str
) -> None:
    async def scenario(stack: Any) -> None:
        body = {k: v for k, v in ROUTES[path].items() if k not in ("max_tokens", "stream")}
        answer = await stack.call("POST", path, body).finish()
        assert answer.status == 200, answer.body
        assert answer.json()["usage"]["completion_tokens"] == 16
        too_many = await stack.call("POST", path, {**body, "max_tokens": 17}).finish()
        # OpenAI routes answer a bad value with 400 and OpenAI's error body, as vLLM does.
        assert too_many.status == 400 and "MAX_OUTPUT_LEN" in too_many.body.decode()
        assert too_many.json()["error"]["param"] == "max_tokens"

    run(make_stack, scenario, max_output_len=16)


def test_prepare_sends_no_stop_words_to_the_engine(make_stack: Callable[..., Any]) -> None:
    async def scenario(stack: Any) -> None:
        from tritonbox_api.protocol.generation import GenerationInput

        context = await stack.services.engine_context.get()
        params = GenerationInput(prompt=PROMPT, stop_words_list=["\n\n", " x "])
        options = GenerationOptions(params, source=Source.API, stream=True)
        prepared = await prepare(options, context, max_beam_width=1)
        assert prepared.request.stop_words == ()
        assert prepared.stop_words == ("\n\n", " x ")
        assert prepared.applied["stop_words_list"] == ["\n\n", " x "]

    run(make_stack, scenario)


def test_a_full_engine_queue_is_a_429_to_retry(make_stack: Callable[..., Any]) -> None:
    async def scenario(stack: Any) -> None:
        stack.engine.refuse = "Maximum queue size of 4 has been reached, please try again later"
        refused = await stack.call("POST", "/predict", LONG).finish()
        assert refused.status == 429 and refused.headers["retry-after"] == "1"
        (row,) = await rows(stack)
        assert row.id == refused.headers["x-prediction-id"] and row.status.value == "failed"
        stack.engine.refuse = None
        again = await stack.call("POST", "/predict", {**LONG, "max_tokens": 2}).finish()
        assert again.status == 200

    run(make_stack, scenario)


CHOICES = {"model": "fake-model", "prompt": PROMPT, "max_tokens": 400, "seed": 7, "n": 3,
           "stream": True}  # fmt: skip


def test_a_client_leaving_stops_every_choice(make_stack: Callable[..., Any]) -> None:
    """OpenAI's `n`: one engine request per choice, seeded seed + index; all stopped."""

    async def scenario(stack: Any) -> None:
        exchange = stack.call("POST", "/v1/completions", CHOICES)
        await exchange.wait_chunks(6)
        assert len(stack.engine.active) == 3
        assert [r.sampling["seed"] for r in stack.engine.started] == [7, 8, 9]
        exchange.disconnect.set()
        await stack.engine.idle_within(1.0)
        await exchange.finish()
        await settled(stack)
        (row,) = await rows(stack)
        assert row.status.value == "canceled"
        assert sorted(stack.engine.stops) == sorted(r.request_id for r in stack.engine.started)
        assert [c["index"] for c in row.choices] == [0, 1, 2]
        assert all(c["finish_reason"] == "canceled" for c in row.choices)
        assert row.completion_tokens == sum(c["completion_tokens"] for c in row.choices)

    run(make_stack, scenario)


def test_a_failing_choice_fails_the_prediction_and_stops_the_others(
    make_stack: Callable[..., Any],
) -> None:
    async def scenario(stack: Any) -> None:
        engine = stack.engine
        original = engine.stream

        async def stream(request: Any) -> AsyncIterator[Any]:
            count = 0
            async for chunk in original(request):
                yield chunk
                count += 1
                if request.sampling["seed"] == 8 and count == 3:  # choice 1 breaks
                    engine.active.discard(request.request_id)
                    raise TritonRequestError("choice 1 broke")

        engine.stream = stream
        exchange = stack.call("POST", "/v1/completions", {**CHOICES, "stream": False})
        await exchange.finish()
        assert exchange.status == 502 and "choice 1 broke" in exchange.body.decode()
        await engine.idle_within(1.0)
        await settled(stack)
        (row,) = await rows(stack)
        assert row.status.value == "failed" and len(row.choices) == 3
        failed = next(r.request_id for r in engine.started if r.sampling["seed"] == 8)
        assert failed not in engine.stops  # its error response was its last
        assert len(engine.stops) == 2

    run(make_stack, scenario)
