"""Live traffic first, in-process (the fake engine, conftest.py), in the order the engine sees
things: lines reach it spread out, never together; the stops of the lines a live request makes
room for are sent all at once, each once, and the live request once they are through; and lines
claimed while a live request was being admitted never reach the engine beside it (they go back
to pending and run after it)."""

from __future__ import annotations

import asyncio
import itertools
import statistics
import threading
import time
from collections.abc import AsyncGenerator, Callable
from typing import Any

import pytest
from tritonbox_testing.batches import by_id, client, ended, line, output, prediction_rows, submit

from tritonbox_api.db import batch_claims
from tritonbox_api.service import batch_pace, batch_room
from tritonbox_common.client import Chunk, GenerationRequest

LIVE = {"model": "fake-model", "prompt": "Hi", "max_tokens": 60, "stream": True}


def watch(engine: Any) -> list[tuple[str, str]]:
    """What reaches `engine`, in order: ("start", id) as a request's stream opens, ("stop", id)
    as a stop arrives, ("stopped", id) once it has answered."""
    seen: list[tuple[str, str]] = []
    stream, stop = engine.stream, engine.stop_request

    async def streamed(request: GenerationRequest) -> AsyncGenerator[Chunk, None]:
        seen.append(("start", request.request_id))
        async for chunk in stream(request):
            yield chunk

    async def stopped(request_id: str, *, timeout_s: float) -> bool:
        seen.append(("stop", request_id))
        done = bool(await stop(request_id, timeout_s=timeout_s))
        seen.append(("stopped", request_id))
        return done

    engine.stream, engine.stop_request = streamed, stopped
    return seen


def test_lines_reach_the_engine_spread_out_not_together(
    make_stack: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch that may fill the engine at once starts its lines an engine step apart
    (batch_pace.py; FIRST_STEP_S until a line has told its time per token), so the engine never
    gets them as a burst to prefill together; before, all six reached it within milliseconds."""
    monkeypatch.setattr(batch_pace, "FIRST_STEP_S", 0.05)
    monkeypatch.setattr(batch_pace, "LINES_PER_STEP", 1)

    async def main() -> None:
        async with make_stack(batch_concurrent_requests=6) as stack, client(stack) as api:
            engine, starts = stack.engine, []
            stream = engine.stream

            async def timed(request: GenerationRequest) -> AsyncGenerator[Chunk, None]:
                starts.append(time.monotonic())
                async for chunk in stream(request):
                    yield chunk

            engine.stream = timed
            # 100 tokens at 10 ms: none ends (and tells its time per token) before all started.
            batch = await submit(api, [line(f"p{i}", 100) for i in range(6)])
            done = await ended(api, batch["id"])
            assert done["request_counts"] == {"total": 6, "completed": 6, "failed": 0}
            gaps = [later - before for before, later in itertools.pairwise(starts)]
            assert len(starts) == 6, starts
            # A step apart: 0.25 s from the first to the last (the route's own time varies).
            assert starts[-1] - starts[0] >= 0.2 and statistics.median(gaps) >= 0.04, gaps

    asyncio.run(main())


def test_the_lines_stops_go_out_before_the_live_request_each_once(
    make_stack: Callable[..., Any], database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(batch_room, "LIVE_QUIET_S", 0.2)

    async def main() -> None:
        async with make_stack(batch_concurrent_requests=4) as stack, client(stack) as api:
            engine = stack.engine
            seen = watch(engine)
            batch = await submit(api, [line(f"s{i}", 200) for i in range(4)])
            async with asyncio.timeout(30):
                while len(engine.active) < 4:
                    await asyncio.sleep(0.01)
            lines = [request_id for kind, request_id in seen if kind == "start"]
            seen.clear()
            engine.stop_delay_s = 0.05  # a stop's round trip
            stream = stack.call("POST", "/v1/completions", LIVE)
            await stream.wait_chunks(1)
            # BATCH_REQUESTS_BESIDE_LIVE = 0: every line stopped, all at once, and the live
            # request sent once the stops are through.
            assert sorted(seen[:4]) == sorted(("stop", request_id) for request_id in lines)
            assert sorted(seen[4:8]) == sorted(("stopped", request_id) for request_id in lines)
            assert seen[8][0] == "start" and seen[8][1] not in lines, seen
            await stream.finish()
            assert stream.status == 200
            done = await ended(api, batch["id"])
            assert done["request_counts"] == {"total": 4, "completed": 4, "failed": 0}
            # Each stopped line's request was stopped once: its producer sent no second stop.
            assert sorted(engine.stops) == sorted(lines)
            rows = [r for r in prediction_rows(database_url) if r["batch_id"] == batch["id"]]
            assert sorted(r["status"] for r in rows) == ["canceled"] * 4 + ["succeeded"] * 4

    asyncio.run(main())


def test_slow_stops_hold_the_live_request_back_for_a_moment_only(
    make_stack: Callable[..., Any], database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stops that take long (something ahead of the engine holds them) delay the live request
    by producer.STOPS_AHEAD_S, not by as long as they take."""
    monkeypatch.setattr(batch_room, "LIVE_QUIET_S", 0.2)

    async def main() -> None:
        async with make_stack(batch_concurrent_requests=2) as stack, client(stack) as api:
            engine = stack.engine
            seen = watch(engine)
            batch = await submit(api, [line(f"w{i}", 200) for i in range(2)])
            async with asyncio.timeout(30):
                while len(engine.active) < 2:
                    await asyncio.sleep(0.01)
            seen.clear()
            engine.stop_delay_s = 3.0
            stream = stack.call("POST", "/v1/completions", LIVE)
            await stream.wait_chunks(1, timeout_s=2.0)
            kinds = [kind for kind, _ in seen]
            assert kinds[:3] == ["stop", "stop", "start"] and "stopped" not in kinds, seen
            await stream.finish()
            done = await ended(api, batch["id"])
            assert done["request_counts"] == {"total": 2, "completed": 2, "failed": 0}

    asyncio.run(main())


def test_lines_claimed_as_a_live_request_comes_wait_until_it_is_done(
    make_stack: Callable[..., Any], database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The runner's claim is written while a live request is admitted (the limit drops to 0):
    the claimed lines go back to pending instead of reaching the engine behind it."""
    monkeypatch.setattr(batch_room, "LIVE_QUIET_S", 0.2)
    claim, claiming, go_on = batch_claims.claim, threading.Event(), threading.Event()

    def held_claim(*args: Any, **kwargs: Any) -> Any:
        claiming.set()
        assert go_on.wait(30)
        return claim(*args, **kwargs)

    monkeypatch.setattr(batch_claims, "claim", held_claim)

    async def main() -> None:
        async with make_stack(batch_concurrent_requests=4) as stack, client(stack) as api:
            engine = stack.engine
            seen = watch(engine)
            batch = await submit(api, [line(f"c{i}", 5) for i in range(6)])
            assert await asyncio.to_thread(claiming.wait, 30)
            stream = stack.call("POST", "/v1/completions", LIVE)
            await stream.wait_chunks(1)
            go_on.set()  # the claim returns its lines once the live request runs
            while not stream.complete.is_set():
                assert [kind for kind, _ in seen] == ["start"], seen  # the live request only
                await asyncio.sleep(0.01)
            await stream.finish()
            done = await ended(api, batch["id"])
            assert done["request_counts"] == {"total": 6, "completed": 6, "failed": 0}
            every = by_id(await output(api, done["output_file_id"]))
            assert sorted(map(str, every)) == [f"c{i}" for i in range(6)]
            rows = [r for r in prediction_rows(database_url) if r["batch_id"] == batch["id"]]
            assert sorted(r["status"] for r in rows) == ["succeeded"] * 6  # none began twice

    asyncio.run(main())
