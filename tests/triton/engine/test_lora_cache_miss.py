"""A cache miss (an adapter's first use: its weights converted) does not stall the rows already
decoding: the conversion runs on the request's thread, as Triton's does in model.py's _submit,
while the engine steps on; the new request joins at the next step, and the running base row gets
one token on every engine step throughout. Steps are counted, never timed."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from transformers import PreTrainedTokenizerBase
from tritonbox_testing.lora import EOS, load_base, lora_inputs, make_adapter, reference_model
from tritonbox_testing.lora import reference as peft_reference

from tritonbox_triton.engine.lora_cache import LoraCache, LoraResolver
from tritonbox_triton.engine.lora_layers import attach_lora
from tritonbox_triton.engine.params import EngineLimits, SamplingParams
from tritonbox_triton.engine.scheduler import EngineRequest, InflightBatcher
from tritonbox_triton.engine.stats import IterationStats
from tritonbox_triton.engine.words import text_decoder

BASE_TOKENS, ADAPTER_TOKENS = 48, 12
STEPS_WHILE_CONVERTING = 3


class Steps:
    """Every engine iteration, with how many tokens each watched request had after it."""

    def __init__(self, sinks: dict[str, Any]) -> None:
        self.sinks = sinks
        self.tokens: list[dict[str, int]] = []
        self._changed = threading.Condition()

    def on_iteration(self, stats: IterationStats) -> None:  # on the engine's thread
        with self._changed:
            self.tokens.append({name: len(s.tokens) for name, s in self.sinks.items()})
            self._changed.notify_all()

    def on_tokens(self, count: int) -> None:
        pass

    def on_finished(self, outcome: str) -> None:
        pass

    def wait_for(self, steps: int, timeout_s: float = 120.0) -> bool:
        """True once the engine has made `steps` iterations in all."""
        return self.wait_until(lambda tokens: len(tokens) >= steps, timeout_s)

    def wait_until(
        self, done: Callable[[list[dict[str, int]]], bool], timeout_s: float = 120.0
    ) -> bool:
        with self._changed:
            return self._changed.wait_for(lambda: done(self.tokens), timeout_s)


@pytest.fixture(scope="module")
def adapter_dir(tokenizer_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_adapter(tokenizer_dir, tmp_path_factory.mktemp("qv"), 5, r=8, lora_alpha=16,
                        target_modules=["q_proj", "v_proj"])  # fmt: skip


@pytest.fixture
def engine(
    tokenizer_dir: Path, tokenizer: PreTrainedTokenizerBase, make_sink: Any
) -> Iterator[tuple[InflightBatcher, LoraResolver, Steps]]:
    model = load_base(tokenizer_dir)
    rows, dims, layers = attach_lora(model)
    resolver = LoraResolver(LoraCache(1 << 30), dims, layers, max_rank=64)  # empty: misses
    steps = Steps({"base": make_sink(), "adapter": make_sink()})
    batcher = InflightBatcher(model, text_decoder(tokenizer), EngineLimits(256, 128, 4096),
                              max_batch_size=8, observer=steps, lora_rows=rows)  # fmt: skip
    batcher.start()
    yield batcher, resolver, steps
    batcher.stop()


def _ids(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    return list(tokenizer(text).input_ids)


def test_a_cache_miss_does_not_stall_the_running_rows(
    engine: Any,
    tokenizer: PreTrainedTokenizerBase,
    tokenizer_dir: Path,
    adapter_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    batcher, resolver, steps = engine
    base_sink, adapter_sink = steps.sinks["base"], steps.sinks["adapter"]
    base = SamplingParams(max_tokens=BASE_TOKENS, min_tokens=BASE_TOKENS, end_id=EOS, pad_id=EOS,
                          temperature=0.0)  # fmt: skip
    batcher.submit(EngineRequest(_ids(tokenizer, "Once upon a time"), base, base_sink, [], []))
    assert steps.wait_for(3)

    # The conversion is held until the engine has stepped on: were it on the engine's thread,
    # those steps could not come.
    convert = resolver._convert
    overlapped: list[bool] = []

    def held_convert(*args: Any) -> Any:
        overlapped.append(steps.wait_for(len(steps.tokens) + STEPS_WHILE_CONVERTING, 60))
        return convert(*args)

    monkeypatch.setattr(resolver, "_convert", held_convert)
    prompt = _ids(tokenizer, "The capital of France is")
    submitted: list[int] = []

    def request_thread() -> None:  # model.py's _submit: resolve (converting), then submit
        lora = resolver.resolve(lora_inputs(adapter_dir))
        params = SamplingParams(max_tokens=ADAPTER_TOKENS, end_id=EOS, pad_id=EOS,
                                temperature=0.0)  # fmt: skip
        batcher.submit(EngineRequest(prompt, params, adapter_sink, [], [], lora=lora))
        submitted.append(len(steps.tokens))  # the step in progress (or next) has this index

    thread = threading.Thread(target=request_thread)
    thread.start()
    thread.join(120)
    adapter_sink.wait()
    base_sink.wait()  # its last token is sent before that step is reported: wait for the report
    assert steps.wait_until(lambda tokens: tokens[-1]["base"] == BASE_TOKENS)
    assert overlapped == [True], "the engine stopped stepping while the weights were converted"

    # The base row: one token on every step from its first decode step to its last.
    counts = [step["base"] for step in steps.tokens]
    first = next(i for i, count in enumerate(counts) if count)
    last = counts.index(BASE_TOKENS)
    gains = [b - a for a, b in itertools.pairwise(counts[first : last + 1])]
    assert gains == [1] * (last - first), counts
    # The adapter request joined the batch at the latest at the step after the one in progress
    # when it came, while the base decoded.
    joined = next(i for i, step in enumerate(steps.tokens) if step["adapter"])
    assert joined <= submitted[0] + 1 and counts[joined] < BASE_TOKENS
    peft_model = reference_model(tokenizer_dir, {"qv": adapter_dir})
    assert adapter_sink.tokens == peft_reference(peft_model, prompt, "qv", ADAPTER_TOKENS)
