"""The engine computes on its own thread with its own torch thread count (InflightBatcher.start
says why the caller's thread must not keep a team of OpenMP workers of its own)."""

from __future__ import annotations

from typing import Any

import torch
from tritonbox_testing.engine_observer import IterationRecorder

from tritonbox_triton.engine.params import EngineLimits, SamplingParams
from tritonbox_triton.engine.scheduler import EngineRequest, InflightBatcher
from tritonbox_triton.engine.words import text_decoder


def test_the_engine_thread_sets_its_own_thread_count(
    model: Any, tokenizer: Any, make_sink: Any
) -> None:
    caller_threads = torch.get_num_threads()
    observer = IterationRecorder()
    engine = InflightBatcher(
        model, text_decoder(tokenizer), EngineLimits(64, 8, 1_000), max_batch_size=2,
        observer=observer, threads=1,
    )  # fmt: skip
    engine.start()
    try:
        sink = make_sink()
        params = SamplingParams(max_tokens=3, end_id=-1, pad_id=2, temperature=0.0)
        engine.submit(EngineRequest(list(tokenizer("Hello")["input_ids"]), params, sink, [], []))
        assert sink.done.wait(60)
    finally:
        engine.stop()
    assert sink.tokens and len(sink.tokens) == 3
    assert observer.ran_on == {("inflight-batcher", 1)}
    assert torch.get_num_threads() == caller_threads  # the caller's count is its own
