"""An idle engine gives the memory its work freed back to the system (engine/heap.py), once."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from tritonbox_triton.engine import heap, scheduler
from tritonbox_triton.engine.params import EngineLimits, SamplingParams
from tritonbox_triton.engine.scheduler import EngineRequest, InflightBatcher
from tritonbox_triton.engine.timings import EngineTimings
from tritonbox_triton.engine.words import text_decoder

MIB = 2**20
PROMPT_TOKENS = 1000  # 1,500 took 200 s in float32 on 2 AVX2 cores, 1,000 92 s


def _resident() -> int:
    status = Path("/proc/self/status").read_text().splitlines()
    return int(next(line for line in status if line.startswith("VmRSS:")).split()[1]) * 1024


def _long_prompts(tokenizer: Any, count: int, length: int) -> list[list[int]]:
    words = list(tokenizer("The quick brown fox jumps over the lazy dog. " * 200)["input_ids"])
    return [words[start : start + length] for start in range(count)]  # each its own prompt


@pytest.mark.skipif(heap.MALLOC_TRIM is None, reason="not glibc: no malloc_trim")
def test_an_idle_engine_returns_what_a_burst_of_long_prompts_freed(
    model: Any, tokenizer: Any, make_sink: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    timings = EngineTimings(idle_trim_s=3.0)
    engine = InflightBatcher(
        model,
        text_decoder(tokenizer),
        EngineLimits(2048, 8, 100_000),
        max_batch_size=4,
        timings=timings,
    )
    engine.start()
    try:
        sinks = [make_sink() for _ in range(4)]
        params = SamplingParams(max_tokens=4, end_id=-1, pad_id=2, temperature=0.0)
        for prompt, sink in zip(_long_prompts(tokenizer, 4, PROMPT_TOKENS), sinks, strict=True):
            engine.submit(EngineRequest(prompt, params, sink, [], []))
        # A float32 engine on two AVX2 cores (the model's forward, twins) takes ~90 s.
        assert all(sink.done.wait(600) for sink in sinks)
        time.sleep(1.0)  # the engine has let go of the burst's buffers, and not trimmed yet
        held = _resident()
        time.sleep(timings.idle_trim_s)
        after = _resident()
    finally:
        engine.stop()
    assert all(len(sink.tokens) == 4 for sink in sinks)
    # Their prefill's activations and KV buffers, freed when they ended, were still held
    # (1,500-token prompts in bfloat16 without the trim: 1130 MiB before and after, with it
    # 1191 → 949 MiB; 1,000-token prompts in float32 with it: 2180 → 1367 MiB).
    assert held - after > 64 * MIB, (held / MIB, after / MIB)


def test_the_engine_trims_once_per_idle_spell(
    model: Any, tokenizer: Any, make_sink: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    trims: list[float] = []

    def count() -> bool:
        trims.append(time.monotonic())
        return True

    monkeypatch.setattr(scheduler, "release_free_memory", count)
    engine = InflightBatcher(
        model,
        text_decoder(tokenizer),
        EngineLimits(64, 8, 1_000),
        max_batch_size=2,
        timings=EngineTimings(idle_trim_s=0.2),
    )
    engine.start()
    try:
        params = SamplingParams(max_tokens=2, end_id=-1, pad_id=2, temperature=0.0)
        prompt = list(tokenizer("Hello")["input_ids"])
        for _ in range(2):
            sink = make_sink()
            engine.submit(EngineRequest(prompt, params, sink, [], []))
            assert sink.done.wait(60)
            time.sleep(1.0)  # five idle periods' length: still one trim
            assert len(trims) == 1
            trims.clear()
    finally:
        engine.stop()
