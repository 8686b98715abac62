"""What sampling costs the cpu engine over greedy decoding: a batch of 8 forced to N tokens,
greedy and sampled (temperature 0.7, top-p 0.95) in turns, in this process (no server)."""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import AutoTokenizer

from tritonbox_triton.engine.attention import load_model
from tritonbox_triton.engine.dtype import engine_dtype
from tritonbox_triton.engine.params import EngineLimits, SamplingParams
from tritonbox_triton.engine.scheduler import EngineRequest, InflightBatcher
from tritonbox_triton.engine.words import text_decoder

MODES: dict[str, dict[str, Any]] = {
    "greedy": {"temperature": 0.0},
    "sampled": {"temperature": 0.7, "top_p": 0.95, "top_k": 0},
}


class _Done:
    def __init__(self) -> None:
        self.event = threading.Event()

    def is_cancelled(self) -> bool:
        return False

    def on_tokens(
        self, tokens: list[int], logprobs: list[float], finish: Any, top: Sequence[Any] = ()
    ) -> None:
        if finish is not None:
            self.event.set()

    def on_prompt(self, scores: Any) -> None:
        pass

    def on_error(self, message: str) -> None:
        raise RuntimeError(message)

    def on_cancelled(self) -> None:
        self.event.set()


def sampled_over_greedy(
    model_dir: Path, prompt: str, tokens: int, repeats: int
) -> tuple[float, dict[str, list[float]]]:
    """The median sampled batch's time over the median greedy one's, and every batch's time."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    # As the served engine runs: torch's threads on the engine's thread only (scheduler.py's
    # InflightBatcher.start says why), this one computing with one.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    engine = InflightBatcher(
        load_model(model_dir, engine_dtype("auto")), text_decoder(tokenizer),
        EngineLimits(512, 512, 100_000), max_batch_size=8, threads=threads,
    )  # fmt: skip
    engine.start()
    ids = list(tokenizer(prompt)["input_ids"])
    times: dict[str, list[float]] = {mode: [] for mode in MODES}
    try:
        for repeat in range(repeats + 1):  # the first turn warms up
            for mode, settings in MODES.items():
                sinks = [_Done() for _ in range(8)]
                started = time.perf_counter()
                for seed, sink in enumerate(sinks):
                    params = SamplingParams(
                        max_tokens=tokens,
                        min_tokens=tokens,
                        end_id=-1,
                        pad_id=0,
                        seed=seed,
                        **settings,
                    )
                    engine.submit(EngineRequest(ids, params, sink, [], []))
                for sink in sinks:
                    sink.event.wait()
                if repeat:
                    times[mode].append(time.perf_counter() - started)
    finally:
        engine.stop()
        torch.set_num_threads(threads)
    ratio = statistics.median(times["sampled"]) / statistics.median(times["greedy"])
    return ratio, times
