"""An idle engine waits a moment for the rest of a burst only while requests come in bursts."""

from __future__ import annotations

import time
from typing import Any

import pytest
import torch
from tritonbox_testing.engine_observer import recorded_engine

from tritonbox_triton.engine.admission import BurstWindow, first_pass
from tritonbox_triton.engine.params import SamplingParams
from tritonbox_triton.engine.scheduler import EngineRequest
from tritonbox_triton.engine.timings import DEFAULT_TIMINGS, EngineTimings
from tritonbox_triton.engine.waiting import WaitingQueue

EOS = 2
SPLIT_FROM = DEFAULT_TIMINGS.split_from


def _slow_motion(pace: float) -> EngineTimings:
    """The served window slowed tenfold, and by `pace` more: the engine tests' own timing (a
    late sleep, a step of a loaded machine) must not decide which requests share a prefill,
    only the window's logic."""
    return EngineTimings(window_s=0.4 * pace, memory_s=30.0 * pace, quiet_s=0.08 * pace,
                         wave_quiet_s=0.2 * pace, wave_window_s=0.8 * pace,
                         wave_return_s=1.0 * pace)  # fmt: skip


@pytest.fixture(scope="module")
def pace(model: Any, tokenizer: Any) -> float:
    """How many times longer than the 50 ms the slow-motion timings allow for it this machine
    takes to prefill a wave's first pass (five prompts, as twins): the timings and the gaps
    between arrivals grow as much. Float32 on 2 AVX2 cores took ~0.5 s, longer than the 100 ms
    between a wave's arrivals, and the wave tests failed there on timing alone."""
    ids = torch.tensor([tokenizer("The capital of France is")["input_ids"]] * 10)
    with torch.inference_mode():
        model(ids)
        started = time.perf_counter()
        model(ids)
    return max(1.0, (time.perf_counter() - started) / 0.05)


def _window(**timings: Any) -> BurstWindow:
    """A burst window with these timings, the others the served ones."""
    return BurstWindow(EngineTimings(**timings))


def _submitted(
    engine: Any,
    prompt: list[int],
    params: SamplingParams,
    make_sink: Any,
    *,
    count: int,
    gap_s: float,
) -> list[Any]:
    """`count` requests submitted `gap_s` apart; their sinks."""
    sinks = []
    for _ in range(count):
        sinks.append(make_sink())
        engine.submit(EngineRequest(prompt, params, sinks[-1], [], []))
        time.sleep(gap_s)
    return sinks


def _served(sinks: list[Any]) -> None:
    for sink in sinks:
        assert sink.done.wait(60)


def _wave_back(
    model: Any,
    tokenizer: Any,
    make_sink: Any,
    *,
    count: int,
    gap_s: float,
    batch: int,
    pace: float,
) -> tuple[list[int], int]:
    """`count` requests that end together and come back at once (showing that waves come
    back), then `count` back `gap_s` × `pace` apart, on an engine of `batch` rows in slow
    motion: every prefill pass's size, and where the last returning wave's passes begin.

    Passes, not iterations: an idle engine also prefills in the same iteration whatever came
    during its first pass (scheduler.py), so on a slow machine (float32 on 2 AVX2 cores) a
    first pass of five and the three that arrived meanwhile were one iteration's eight."""
    timings = _slow_motion(pace)
    engine, steps = recorded_engine(model, tokenizer, max_batch_size=batch, timings=timings)

    def passes() -> list[int]:
        return [admitted for stats in list(steps.iterations) for admitted in stats.admissions]

    params = SamplingParams(max_tokens=3, min_tokens=3, end_id=EOS, pad_id=EOS, temperature=0.0)
    prompt = list(tokenizer("The capital of France is")["input_ids"])
    engine.start()
    try:
        for _ in range(2):
            _served(_submitted(engine, prompt, params, make_sink, count=count, gap_s=0.0))
        before = len(passes())
        _served(_submitted(engine, prompt, params, make_sink, count=count, gap_s=gap_s * pace))
    finally:
        engine.stop()
    return passes(), before


def _waves_came_back(window: BurstWindow, at: float) -> None:
    """A wave of two ended at `at` and came back (too far apart to be a burst): waves are now
    expected."""
    window.ended(2, at, idle=True)
    window.arrived(at + 0.01)
    window.arrived(at + 0.06)


def test_requests_one_at_a_time_never_wait() -> None:
    window = _window(window_s=0.02, memory_s=30.0)
    for now in (10.0, 11.0, 12.5):
        window.arrived(now)
        assert window.wait_until(now, now) is None


def test_after_a_burst_an_idle_engine_waits_until_the_window_closes() -> None:
    window = _window(window_s=0.02, memory_s=30.0, quiet_s=1.0)
    window.arrived(10.0)
    window.arrived(10.005)  # a burst
    window.arrived(20.0)
    assert window.wait_until(20.0, 20.001) == 20.02
    assert window.wait_until(45.0, 45.0) is None  # the burst is too long ago


def test_a_quiet_gap_ends_the_wait_before_the_window_closes() -> None:
    window = _window(window_s=0.04, memory_s=30.0, quiet_s=0.008)
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
    window = _window(window_s=0.02, memory_s=30.0)
    window.arrived(10.0)
    window.arrived(10.005)
    window.arrived(12.0)
    assert window.wait_until(12.0, 12.0) is not None
    window.alone()
    window.arrived(13.0)
    assert window.wait_until(13.0, 13.0) is None


def test_a_wave_that_ended_together_is_expected_back_whole() -> None:
    window = _window(window_s=0.04, memory_s=30.0, quiet_s=0.008, wave_quiet_s=0.02,
                         wave_window_s=0.08, wave_return_s=0.1)  # fmt: skip
    _waves_came_back(window, 5.0)
    window.ended(2, 10.0, idle=False)
    window.ended(1, 10.03, idle=True)  # three ended within the window: a wave of three
    window.arrived(10.09)  # its first back, within the wave's return
    # The longer quiet gap while the rest of the wave is due, within the wave's window.
    assert window.wait_until(10.09, 10.091, waiting=1) == pytest.approx(10.11)
    window.arrived(10.105)
    assert window.wait_until(10.09, 10.106, waiting=2) == pytest.approx(10.125)
    window.arrived(10.12)
    assert window.wait_until(10.09, 10.121, waiting=3) is None  # all back: at once


def test_a_late_wave_waits_no_longer_than_its_window() -> None:
    window = _window(window_s=0.04, memory_s=30.0, quiet_s=0.008, wave_quiet_s=0.02,
                         wave_window_s=0.08, wave_return_s=0.1)  # fmt: skip
    _waves_came_back(window, 5.0)
    window.ended(4, 10.0, idle=True)
    window.arrived(10.05)
    for at in (10.065, 10.08, 10.095, 10.11, 10.125):  # one more every 15 ms: never all four
        window.arrived(at)
    assert window.wait_until(10.05, 10.126, waiting=3) == pytest.approx(10.13)  # 10.05 + 0.08


def test_only_a_wave_that_ended_just_before_is_expected() -> None:
    window = _window(window_s=0.04, memory_s=30.0, quiet_s=0.008, wave_return_s=0.1)
    _waves_came_back(window, 5.0)
    window.ended(1, 10.0, idle=False)
    window.ended(1, 10.05, idle=True)  # apart by more than the window: no wave
    window.arrived(10.051)
    assert window.wait_until(10.051, 10.051, waiting=1) is None
    window.ended(4, 20.0, idle=True)
    window.arrived(20.2)  # long after the wave ended: not its clients coming back
    assert window.wait_until(20.2, 20.2, waiting=1) is None


def test_a_lone_request_after_a_wave_that_never_came_back_does_not_wait() -> None:
    """Open-loop traffic empties the batch with two ending together as often as a closed loop
    does, and no wave follows: a request arriving alone then starts at once."""
    window = _window(window_s=0.04, memory_s=30.0, quiet_s=0.008, wave_quiet_s=0.02,
                         wave_window_s=0.08, wave_return_s=0.1)  # fmt: skip
    window.ended(3, 10.0, idle=True)
    window.arrived(10.03)
    assert window.wait_until(10.03, 10.03, waiting=1) is None
    window.arrived(10.05)  # a second one back within the return window: waves come back
    window.ended(3, 20.0, idle=True)
    window.arrived(20.03)
    assert window.wait_until(20.03, 20.031, waiting=1) == pytest.approx(20.05)
    window.alone()  # it found no company: lone requests again
    window.ended(3, 30.0, idle=True)
    window.arrived(30.03)
    assert window.wait_until(30.03, 30.03, waiting=1) is None


def test_the_queue_hands_a_lone_request_after_a_wave_over_at_once() -> None:
    """The waiting queue on the real clock with the served timings: a request arriving alone
    after two ended together is taken within 10 ms, where it waited 40 ms for a wave."""
    queue = WaitingQueue(DEFAULT_TIMINGS, max_size=0, batch=8)
    params = SamplingParams(max_tokens=3, end_id=EOS, pad_id=EOS)
    for _ in range(2):  # two requests far apart: no burst
        queue.put(EngineRequest([5, 6], params, None, [], []))  # type: ignore[arg-type]
        assert queue.pop_fitting(0, 1000, must_fit=False) is not None
        time.sleep(DEFAULT_TIMINGS.window_s + 0.02)
    queue.ended(2, idle=True)
    time.sleep(0.02)
    queue.put(EngineRequest([5, 6], params, None, [], []))  # type: ignore[arg-type]
    started = time.monotonic()
    assert queue.first_pass(busy=False) == 1
    assert time.monotonic() - started < 0.010


def test_a_burst_that_trickles_in_shares_one_prefill(
    model: Any, tokenizer: Any, make_sink: Any, pace: float
) -> None:
    timings = _slow_motion(pace)
    engine, steps = recorded_engine(model, tokenizer, max_batch_size=4, timings=timings)
    params = SamplingParams(max_tokens=3, end_id=EOS, pad_id=EOS, temperature=0.0)
    prompt = list(tokenizer("The capital of France is")["input_ids"])
    engine.start()
    try:
        for _ in range(2):  # two bursts of two requests 20 ms apart: the first shows bursts come
            _served(_submitted(engine, prompt, params, make_sink, count=2, gap_s=0.02 * pace))
    finally:
        engine.stop()
    prefills = [stats.context for stats in steps.iterations if stats.context]
    assert prefills[-1] == 2, f"the second burst was prefilled as {prefills}"


def test_a_wave_comes_back_to_one_prefill(
    model: Any, tokenizer: Any, make_sink: Any, pace: float
) -> None:
    """Clients that send their next requests as their answers end: the first comes back ahead
    of the others by more than the quiet gap, and still the wave shares one prefill."""
    # Three back 120 ms apart: past the 80 ms quiet gap, within the wave's 200 ms.
    prefills, _ = _wave_back(model, tokenizer, make_sink, count=3, gap_s=0.12, batch=4, pace=pace)
    assert prefills[-1] == 3, f"the wave came back prefilled as {prefills}"


def test_a_large_wave_starts_once_one_more_than_half_of_it_is_in() -> None:
    window = _window(window_s=0.04, memory_s=30.0, quiet_s=0.008, wave_quiet_s=0.02,
                         wave_window_s=0.08, wave_return_s=0.1)  # fmt: skip
    _waves_came_back(window, 5.0)
    window.ended(16, 10.0, idle=True)
    for index in range(9):
        window.arrived(10.01 + index * 0.002)
    assert window.wait_until(10.01, 10.026, waiting=8) == pytest.approx(10.046)
    # Nine of 16: the rest take a pass of their own.
    assert window.wait_until(10.01, 10.027, waiting=9) is None
    assert window.first_pass_size(10.01, waiting=9) == 9
    assert window.first_pass_size(10.01, waiting=16) == 9  # all in already: still nine first
    assert window.first_pass_size(10.01, waiting=20) == 11  # more than expected came
    assert window.first_pass_size(10.01, waiting=8) == 5  # fewer came: the wave shrank


def test_the_first_pass_takes_one_more_than_half() -> None:
    assert [first_pass(n) for n in (1, SPLIT_FROM - 1)] == [1, SPLIT_FROM - 1]  # whole
    assert [first_pass(n) for n in (8, 9, 16, 32)] == [5, 5, 9, 17]


def test_a_wave_smaller_than_the_split_is_waited_for_whole() -> None:
    window = _window(window_s=0.04, memory_s=30.0, quiet_s=0.008, wave_quiet_s=0.02,
                         wave_window_s=0.08, wave_return_s=0.1)  # fmt: skip
    _waves_came_back(window, 5.0)
    window.ended(SPLIT_FROM - 1, 10.0, idle=True)
    window.arrived(10.01)
    assert window.wait_until(10.01, 10.011, waiting=SPLIT_FROM - 2) is not None
    assert window.wait_until(10.01, 10.011, waiting=SPLIT_FROM - 1) is None


def test_a_burst_starts_once_one_more_than_half_a_batch_is_in() -> None:
    window = _window(window_s=0.04, memory_s=30.0, quiet_s=1.0)
    window.arrived(10.0)
    window.arrived(10.005)  # bursts come
    for index in range(8):
        window.arrived(20.0 + index * 0.001)
    assert window.wait_until(20.0, 20.008, waiting=8, batch=16) == 20.04
    assert window.wait_until(20.0, 20.008, waiting=9, batch=16) is None
    assert window.wait_until(20.0, 20.008, waiting=9, batch=0) == 20.04  # no batch: the window
    assert window.wait_until(20.0, 20.008, waiting=4, batch=4) is None  # a small batch: all of it
    # A burst's first pass: as if the batch were coming, or all of a small one.
    assert window.first_pass_size(20.0, waiting=16, batch=16) == 9
    assert window.first_pass_size(20.0, waiting=12, batch=64) == 7  # the wait is over: all in
    assert window.first_pass_size(20.0, waiting=4, batch=4) == 4


def test_a_large_wave_comes_back_to_two_prefills(
    model: Any, tokenizer: Any, make_sink: Any, pace: float
) -> None:
    """A wave of eight coming back 100 ms apart: the first five start a pass as soon as they
    are in, rather than waiting with them for the last, which joins the running batch."""
    # 100 ms apart: within the 200 ms quiet gap, all eight within the wave's 800 ms.
    every, before = _wave_back(model, tokenizer, make_sink, count=8, gap_s=0.1, batch=8, pace=pace)
    prefills = every[before:]
    assert prefills[0] == 5 and sum(prefills) == 8, f"the wave came back prefilled as {prefills}"
