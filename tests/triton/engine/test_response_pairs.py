"""From `pairs_from` running sequences on (timings.py), tokens leave in pairs; first and last
at once."""

from __future__ import annotations

from typing import Any

from tritonbox_testing.engine_observer import recorded_engine

from tritonbox_triton.engine.params import SamplingParams
from tritonbox_triton.engine.scheduler import EngineFinish, EngineRequest
from tritonbox_triton.engine.timings import DEFAULT_TIMINGS

EOS = 2
PAIRS_FROM = DEFAULT_TIMINGS.pairs_from


def _chunks(model: Any, tokenizer: Any, make_sink: Any, rows: int, **asked: Any) -> list[Any]:
    """`rows` requests of 6 tokens run together; each sink with the token counts it was sent."""
    engine, _ = recorded_engine(model, tokenizer, max_batch_size=rows)
    params = SamplingParams(max_tokens=6, min_tokens=6, end_id=EOS, pad_id=EOS, temperature=0.0,
                            **asked)  # fmt: skip
    prompt = list(tokenizer("The capital of France is")["input_ids"])
    sinks = [make_sink() for _ in range(rows)]
    for sink in sinks:
        engine.submit(EngineRequest(prompt, params, sink, [], []))
    while engine.run_once():  # not started: this thread runs the iterations
        pass
    return sinks


def test_a_full_batch_sends_pairs_between_its_first_and_last_token(
    model: Any, tokenizer: Any, make_sink: Any
) -> None:
    paired = _chunks(model, tokenizer, make_sink, PAIRS_FROM)
    alone = _chunks(model, tokenizer, make_sink, PAIRS_FROM - 1)
    assert all(sink.sizes == [1, 2, 2, 1] for sink in paired), [s.sizes for s in paired]
    assert all(sink.sizes == [1] * 6 for sink in alone), [s.sizes for s in alone]
    assert all(sink.finish == EngineFinish.LENGTH for sink in paired)
    assert paired[0].tokens == alone[0].tokens and len(paired[0].logprobs) == 6


def test_tokens_asked_with_their_top_log_probs_leave_one_by_one(
    model: Any, tokenizer: Any, make_sink: Any
) -> None:
    sinks = _chunks(model, tokenizer, make_sink, PAIRS_FROM, num_top_logprobs=2)
    assert all(sink.sizes == [1] * 6 for sink in sinks)
