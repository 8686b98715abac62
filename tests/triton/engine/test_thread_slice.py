"""The engine's thread and the OpenMP workers it starts run on a long scheduler slice, and no other
thread does (thread_slice.py says why)."""

from __future__ import annotations

import os
import re
import threading
from typing import Any

import pytest

from tritonbox_triton.engine.params import EngineLimits, SamplingParams
from tritonbox_triton.engine.scheduler import EngineRequest, InflightBatcher
from tritonbox_triton.engine.thread_slice import ENGINE_SLICE_NS, current_slice_ns, request_slice
from tritonbox_triton.engine.words import text_decoder


def _in_a_thread(work: Any) -> Any:
    result: list[Any] = []
    thread = threading.Thread(target=lambda: result.append(work()))
    thread.start()
    thread.join()
    return result[0]


@pytest.fixture(scope="module")
def slices_per_task() -> None:
    release = tuple(int(part) for part in re.findall(r"\d+", os.uname().release)[:2])
    if release < (6, 12):
        pytest.skip(f"Linux {os.uname().release} has no scheduler slice per task (6.12 on)")


def _threads_on_the_slice() -> set[int]:
    found = set()
    for entry in os.listdir("/proc/self/task"):
        try:
            if current_slice_ns(int(entry)) == ENGINE_SLICE_NS:
                found.add(int(entry))
        except OSError:  # ended meanwhile
            continue
    return found


def test_a_thread_gets_the_slice_it_asks_for_and_the_threads_it_starts_inherit_it(
    slices_per_task: None,
) -> None:
    def ask_then_start_one() -> tuple[str, int, int]:
        said = request_slice()
        child = _in_a_thread(current_slice_ns)
        return said, current_slice_ns(), child

    said, own, child = _in_a_thread(ask_then_start_one)
    assert said == f"a {ENGINE_SLICE_NS / 1e6:g} ms scheduler slice"
    assert own == child == ENGINE_SLICE_NS
    assert current_slice_ns() != ENGINE_SLICE_NS  # the caller's own is untouched


def test_the_engine_thread_and_its_openmp_workers_run_on_the_slice(
    slices_per_task: None, model: Any, tokenizer: Any, make_sink: Any
) -> None:
    before = _threads_on_the_slice()
    engine = InflightBatcher(
        model, text_decoder(tokenizer), EngineLimits(64, 8, 1_000), max_batch_size=2, threads=2
    )
    engine.start()
    try:
        assert engine.describe().endswith(f"on a {ENGINE_SLICE_NS / 1e6:g} ms scheduler slice")
        sink = make_sink()
        params = SamplingParams(max_tokens=3, end_id=-1, pad_id=2, temperature=0.0)
        engine.submit(EngineRequest(list(tokenizer("Hello")["input_ids"]), params, sink, [], []))
        assert sink.done.wait(60)
        assert engine._thread is not None
        engine_thread = engine._thread.native_id
        new = _threads_on_the_slice() - before
    finally:
        engine.stop()
    # The engine's thread and the worker of its team of two (torch's OpenMP, started at the
    # first parallel region of the engine's thread); the calling thread keeps its own.
    assert engine_thread in new
    assert len(new) >= 2, new
    assert threading.get_native_id() not in new
