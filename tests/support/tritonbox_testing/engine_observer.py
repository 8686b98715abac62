"""An engine observer for in-process engine tests: what each iteration reported, and where it
ran (the thread's name and its torch thread count)."""

from __future__ import annotations

import threading
from typing import Any, NamedTuple

import torch

from tritonbox_triton.engine.params import EngineLimits
from tritonbox_triton.engine.scheduler import InflightBatcher
from tritonbox_triton.engine.stats import IterationStats
from tritonbox_triton.engine.timings import DEFAULT_TIMINGS, EngineTimings
from tritonbox_triton.engine.words import text_decoder


class IterationRecorder:
    def __init__(self) -> None:
        self.iterations: list[IterationStats] = []
        self.ran_on: set[tuple[str, int]] = set()

    def on_iteration(self, stats: IterationStats) -> None:
        self.iterations.append(stats)
        self.ran_on.add((threading.current_thread().name, torch.get_num_threads()))

    def on_tokens(self, count: int) -> None:
        pass

    def on_finished(self, outcome: str) -> None:
        pass


class RecordedEngine(NamedTuple):
    engine: InflightBatcher
    steps: IterationRecorder


def recorded_engine(
    model: Any, tokenizer: Any, *, max_batch_size: int, timings: EngineTimings = DEFAULT_TIMINGS
) -> RecordedEngine:
    """An engine over `model` (256 prompt tokens, 64 new ones, 10,000 cached) whose iterations
    are recorded; not started. `timings`: its waits (timings.py; the served ones)."""
    steps = IterationRecorder()
    engine = InflightBatcher(
        model, text_decoder(tokenizer), EngineLimits(256, 64, 10_000),
        max_batch_size=max_batch_size, observer=steps, timings=timings,
    )  # fmt: skip
    return RecordedEngine(engine, steps)
