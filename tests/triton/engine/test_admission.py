"""An idle engine waits a moment for the rest of a burst only while requests come in bursts."""

from __future__ import annotations

import time
from typing import Any

import pytest
from tritonbox_testing.engine_observer import recorded_engine

from tritonbox_triton.engine.admission import BurstWindow
from tritonbox_triton.engine.params import SamplingParams
from tritonbox_triton.engine.scheduler import EngineRequest

EOS = 2


def test_requests_one_at_a_time_never_wait() -> None:
    window = BurstWindow(window_s=0.02, memory_s=30.0)
    for now in (10.0, 11.0, 12.5):
        window.arrived(now)
        assert window.wait_until(now, now) is None


def test_after_a_burst_an_idle_engine_waits_until_the_window_closes() -> None:
    window = BurstWindow(window_s=0.02, memory_s=30.0, quiet_s=1.0)
    window.arrived(10.0)
    window.arrived(10.005)  # a burst
    window.arrived(20.0)
    assert window.wait_until(20.0, 20.001) == 20.02
    assert window.wait_until(45.0, 45.0) is None  # the burst is too long ago


def test_a_quiet_gap_ends_the_wait_before_the_window_closes() -> None:
    window = BurstWindow(window_s=0.04, memory_s=30.0, quiet_s=0.008)
    window.arrived(10.0)
    window.arrived(10.002)  # a burst
    window.arrived(20.0)
    window.arrived(20.003)
    assert window.wait_until(20.0, 20.004) == pytest.approx(20.011)  # the last one's quiet gap
    window.arrived(20.01)
    window.arrived(20.017)
    window.arrived(20.024)
    window.arrived(20.035)
    assert window.wait_until(20.0, 20.036) == 20.04  # still arriving: the window's end


def test_a_request_that_found_no_company_ends_the_waiting() -> None:
    window = BurstWindow(window_s=0.02, memory_s=30.0)
    window.arrived(10.0)
    window.arrived(10.005)
    window.arrived(12.0)
    assert window.wait_until(12.0, 12.0) is not None
    window.alone()
    window.arrived(13.0)
    assert window.wait_until(13.0, 13.0) is None


def test_a_burst_that_trickles_in_shares_one_prefill(
    model: Any, tokenizer: Any, make_sink: Any
) -> None:
    engine, steps = recorded_engine(model, tokenizer, max_batch_size=4)
    params = SamplingParams(max_tokens=3, end_id=EOS, pad_id=EOS, temperature=0.0)
    prompt = list(tokenizer("The capital of France is")["input_ids"])
    engine.start()
    try:
        for _ in range(2):  # two bursts of two requests 5 ms apart: the first shows bursts come
            sinks = []
            for _ in range(2):
                sinks.append(make_sink())
                engine.submit(EngineRequest(prompt, params, sinks[-1], [], []))
                time.sleep(0.005)
            for sink in sinks:
                assert sink.done.wait(60)
    finally:
        engine.stop()
    prefills = [stats.context for stats in steps.iterations if stats.context]
    assert prefills[-1] == 2, f"the second burst was prefilled as {prefills}"
