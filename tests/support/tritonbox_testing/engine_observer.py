"""An engine observer for in-process engine tests: what each iteration reported, and where it
ran (the thread's name and its torch thread count)."""

from __future__ import annotations

import threading

import torch

from tritonbox_triton.engine.stats import IterationStats


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
