"""How a prefill's requests join the decode batch: first tokens out before their keys are
copied in, those that arrive during a prefill prefilled before the next step, and a large wave
waiting at once prefilled in two passes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from tritonbox_testing.engine_observer import recorded_engine

from tritonbox_triton.engine.params import SamplingParams
from tritonbox_triton.engine.scheduler import EngineRequest

EOS = 2


def _engine(
    model: Any, tokenizer: Any, rows: int = 4
) -> tuple[Any, Any, Callable[[Any], EngineRequest]]:
    """An engine of `rows` rows, not started; its recorded iterations; a request of three
    tokens for a sink."""
    engine, steps = recorded_engine(model, tokenizer, max_batch_size=rows)
    params = SamplingParams(max_tokens=3, min_tokens=3, end_id=EOS, pad_id=EOS, temperature=0.0)
    prompt = list(tokenizer("The capital of France is")["input_ids"])
    return engine, steps, lambda sink: EngineRequest(prompt, params, sink, [], [])


def _passes(engine: Any, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The sizes of the engine's shared prefill passes, as they are run."""
    sizes: list[int] = []
    prefill = engine._batch.prefill_shared

    def recorded(requests: Any, copies: int = 1) -> None:
        sizes.append(len(requests))
        prefill(requests, copies)

    monkeypatch.setattr(engine._batch, "prefill_shared", recorded)
    return sizes


def test_a_prefills_first_tokens_all_leave_before_its_keys_are_copied(
    model: Any, tokenizer: Any, make_sink: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine, _, request = _engine(model, tokenizer)
    sinks = [make_sink() for _ in range(3)]
    copies = engine._batch.kv.add_prefilled
    sent_when_copied: list[list[int]] = []

    def add_prefilled(*sequences: Any) -> None:
        sent_when_copied.append([len(sink.tokens) for sink in sinks])
        copies(*sequences)

    monkeypatch.setattr(engine._batch.kv, "add_prefilled", add_prefilled)
    for sink in sinks:
        engine.submit(request(sink))
    engine.run_once()  # not started: this thread runs one iteration, the prefill and a step
    assert sent_when_copied == [[1, 1, 1]]
    assert [len(sink.tokens) for sink in sinks] == [2, 2, 2]


def test_requests_that_came_during_a_prefill_take_theirs_before_the_step(
    model: Any, tokenizer: Any, make_sink: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """They join the running ones' step rather than waiting a step of their own."""
    engine, steps, request = _engine(model, tokenizer)
    first, later = make_sink(), make_sink()
    prefill = engine._batch.prefill_shared

    def arriving_meanwhile(requests: Any, copies: int = 1) -> None:
        if later.calls == 0 and not any(r.sink is later for r in requests):
            engine.submit(request(later))
        prefill(requests, copies)

    monkeypatch.setattr(engine._batch, "prefill_shared", arriving_meanwhile)
    engine.submit(request(first))
    engine.run_once()
    assert (len(first.tokens), len(later.tokens)) == (2, 2)  # their first and one step's
    assert steps.iterations[0].context == 2 and steps.iterations[0].generation == 2


@pytest.mark.parametrize(("waiting", "rows", "passes"), [(8, 8, [5, 3]), (16, 16, [9, 7]),
                                                        (8, 16, [5, 3]), (7, 7, [7])])  # fmt: skip
def test_a_large_wave_waiting_at_once_is_prefilled_in_two_passes_before_the_step(
    model: Any,
    tokenizer: Any,
    make_sink: Any,
    monkeypatch: pytest.MonkeyPatch,
    waiting: int,
    rows: int,
    passes: list[int],
) -> None:
    """One more than half first (admission.py), the rest right after it, of a burst smaller
    than the engine's batch too (its wait is over: it is all there); a group under SPLIT_FROM
    is prefilled whole."""
    engine, steps, request = _engine(model, tokenizer, rows)
    sizes = _passes(engine, monkeypatch)
    sinks = [make_sink() for _ in range(waiting)]
    for sink in sinks:
        engine.submit(request(sink))
    engine.run_once()
    assert sizes == passes
    assert all(sink.tokens for sink in sinks)  # every first token is out
    # and one step for all (its tokens held from 8 rows on: pairs, scheduler.py)
    assert (steps.iterations[0].context, steps.iterations[0].generation) == (waiting, waiting)


def test_a_large_rest_is_split_again_before_the_step(
    model: Any, tokenizer: Any, make_sink: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A wave larger than the one expected (8 came back last time, 16 now): its first pass is
    the expected wave's, and the 11 left are split as a wave of their own, all before the step."""
    engine, steps, request = _engine(model, tokenizer, 16)
    monkeypatch.setattr(engine._queue.bursts, "first_pass_size", lambda *_: 5)  # first_pass(8)
    sizes = _passes(engine, monkeypatch)
    for sink in [make_sink() for _ in range(16)]:
        engine.submit(request(sink))
    engine.run_once()
    assert sizes == [5, 6, 5]
    assert (steps.iterations[0].context, steps.iterations[0].generation) == (16, 16)
