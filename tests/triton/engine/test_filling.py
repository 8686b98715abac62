"""Chunked prefill and the prefix cache (engine/filling.py, prefix_cache.py): a prompt cut into
chunks gets the keys and logits of one pass, a long prompt fills beside running streams without
stalling them, a prompt that starts as an earlier one continues from its keys, and the answers
stay stock transformers' (float32, greedy) with both on."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM
from tritonbox_testing.families import build
from tritonbox_testing.hardware import needs_bf16

from tritonbox_triton.engine import fused_ops
from tritonbox_triton.engine.attention import load_model
from tritonbox_triton.engine.decode_step import DecodeStep
from tritonbox_triton.engine.filling import Filling
from tritonbox_triton.engine.params import EngineLimits, SamplingParams
from tritonbox_triton.engine.prefix_cache import BLOCK
from tritonbox_triton.engine.scheduler import EngineRequest, InflightBatcher
from tritonbox_triton.engine.timings import DEFAULT_TIMINGS

EOS = 2
CHUNK = 32


def _prompt(length: int, seed: int) -> list[int]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(3, 500, (length,), generator=generator).tolist()


def _stock_greedy(checkpoint: Path, prompt: list[int], tokens: int) -> list[int]:
    model = AutoModelForCausalLM.from_pretrained(
        checkpoint, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    with torch.inference_mode():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=tokens, do_sample=False,
                             min_new_tokens=tokens)  # fmt: skip
    return [int(token) for token in out[0, len(prompt) :]]


def _params(tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=tokens, min_tokens=tokens, end_id=EOS, pad_id=0)


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build("llama", tmp_path_factory.mktemp("llama"))


@pytest.mark.parametrize("family", ["llama", "qwen3", "gemma2", "gemma3_text"])
@pytest.mark.parametrize(
    "dtype",
    [
        pytest.param(torch.float32, id="float32"),
        pytest.param(torch.bfloat16, id="bfloat16", marks=needs_bf16),
    ],
)
def test_a_prompt_in_chunks_gets_the_keys_and_logits_of_one_pass(
    family: str, dtype: torch.dtype, tmp_path: Path, make_sink: Any
) -> None:
    model = load_model(build(family, tmp_path), dtype)
    step = DecodeStep(model, fused_ops.load())
    if not step.fills_exact:
        pytest.skip("bfloat16 without the compiled attention (AVX-512): prefilled whole")
    prompt = _prompt(150, seed=1)  # past the window (8), in chunks of 40, 40, 40, 30
    logits, layers = step.prefill([prompt])
    request = EngineRequest(prompt, _params(1), make_sink(), [], [])
    filling = Filling(request, step.kv_layout())
    chunks = 0
    while True:
        chunk = filling.chunk(40)
        chunked = step.extend(chunk)
        filling.advance(chunk)
        chunks += 1
        if chunk.last:
            break
    assert chunks == 4
    tolerance = 1e-4 if dtype == torch.float32 else 0.0  # bfloat16 rows of 40: the same bits
    assert (chunked[0] - logits[0]).abs().max() <= tolerance
    for (keys, values), (own_keys, own_values) in zip(filling.layers(), layers[0], strict=True):
        assert (keys - own_keys).abs().max() <= 2 * tolerance
        assert (values - own_values).abs().max() <= 2 * tolerance


def _engine(checkpoint: Path, **timings: Any) -> InflightBatcher:
    model = load_model(checkpoint, torch.float32)
    engine = InflightBatcher(
        model,
        lambda ids: " ".join(map(str, ids)),
        EngineLimits(512, 128, 8192),
        max_batch_size=4,
        timings=dataclasses.replace(DEFAULT_TIMINGS, **timings),
    )
    engine.start()
    return engine


class _Watched:
    """A sink that notes how many tokens another sink had when its first token came."""

    def __init__(self, sink: Any, others: list[Any]) -> None:
        self.sink, self.others = sink, others
        self.others_at_first: list[int] | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.sink, name)

    def on_tokens(self, tokens: list[int], *args: Any, **kwargs: Any) -> None:
        if self.others_at_first is None:
            self.others_at_first = [len(other.tokens) for other in self.others]
        self.sink.on_tokens(tokens, *args, **kwargs)


STREAMS = [_prompt(20, seed=2), _prompt(25, seed=3)]  # two streams of 120 tokens
PROMPT = _prompt(300, seed=4)  # arriving beside them, for 8 tokens


def _beside_streams(llama: Path, make_sink: Any, engine: InflightBatcher) -> list[int]:
    """PROMPT sent while STREAMS decode: how many more tokens each stream had by its first
    token. Every answer is checked against stock transformers' in float32."""
    try:
        sinks = [make_sink() for _ in STREAMS]
        for stream, sink in zip(STREAMS, sinks, strict=True):
            engine.submit(EngineRequest(stream, _params(120), sink, [], []))
        while min(len(sink.tokens) for sink in sinks) < 2:  # both decoding
            sinks[0].done.wait(0.01)
        before = [len(sink.tokens) for sink in sinks]
        watched = _Watched(make_sink(), sinks)
        engine.submit(EngineRequest(PROMPT, _params(8), watched, [], []))
        answer = watched.sink.wait(300).tokens
        answers = [sink.wait(300).tokens for sink in sinks]
    finally:
        engine.stop()
    assert answer == _stock_greedy(llama, PROMPT, 8)
    for stream, stream_answer in zip(STREAMS, answers, strict=True):
        assert stream_answer == _stock_greedy(llama, stream, 120)
    assert watched.others_at_first is not None
    return [at - had for had, at in zip(before, watched.others_at_first, strict=True)]


def test_a_long_prompt_fills_in_chunks_beside_running_streams(llama: Path, make_sink: Any) -> None:
    """The running streams keep getting tokens while a long prompt comes in, one chunk a step
    (counted, not timed), and every answer is still stock transformers' in float32."""
    engine = _engine(llama, prefill_chunk_tokens=CHUNK, prefix_cache_bytes=0, whole_prefill_s=0)
    chunks = -(-len(PROMPT) // CHUNK)
    # one token a step, a chunk a step: the streams were not held for the whole prompt
    for more in _beside_streams(llama, make_sink, engine):
        assert more >= chunks - 2, (more, chunks)


def test_a_prompt_that_costs_little_is_prefilled_whole_beside_running_streams(
    llama: Path, make_sink: Any
) -> None:
    """Within whole_prefill_s (timings.py) a prompt longer than a chunk is one pass as it
    arrives: its first token comes a step or so after the streams' last, not a chunk a step,
    and every answer is still stock transformers' in float32."""
    engine = _engine(llama, prefix_cache_bytes=0)
    more = _beside_streams(llama, make_sink, engine)
    assert engine._batch.budget.seconds(0, len(PROMPT)) is not None  # decided by its cost
    assert max(more) <= 2, more  # in chunks: a step each


def test_a_prompt_that_starts_as_an_earlier_one_continues_from_its_keys(
    llama: Path, make_sink: Any
) -> None:
    shared = _prompt(3 * BLOCK + 10, seed=5)
    first, second = shared + _prompt(12, seed=6), shared + _prompt(9, seed=7)
    engine = _engine(llama)
    try:
        answers = []
        for prompt in (first, second):
            sink = make_sink()
            engine.submit(EngineRequest(prompt, _params(12), sink, [], []))
            answers.append(sink.wait(300).tokens)
        cache = engine._batch.prefixes
        assert cache.hits == 1 and cache.tokens_saved == 3 * BLOCK
        assert 0 < cache.used <= cache.capacity
    finally:
        engine.stop()
    assert answers == [_stock_greedy(llama, prompt, 12) for prompt in (first, second)]


def test_long_prompts_fill_together_beside_a_stream(llama: Path, make_sink: Any) -> None:
    """Three long prompts arriving while a stream runs fill together: the step's budget goes
    to the one with the least left first, so the shortest, sent after two long ones, is not
    held for them, and every answer is stock transformers' in float32."""
    engine = _engine(llama, prefill_chunk_tokens=CHUNK, whole_prefill_s=0)
    prompts = [_prompt(20, seed=8), _prompt(200, seed=9), _prompt(180, seed=10),
               _prompt(70, seed=11)]  # fmt: skip
    try:
        sinks = [make_sink() for _ in prompts]
        engine.submit(EngineRequest(prompts[0], _params(60), sinks[0], [], []))
        while not sinks[0].tokens:
            sinks[0].done.wait(0.01)
        watched = _Watched(sinks[3], sinks[1:3])
        # Queued together (the queue's lock is re-entrant): one arriving a few steps after the
        # others, on a loaded machine, found them prefilled already, whatever the order.
        with engine._queue.lock:
            for prompt, sink in zip(prompts[1:], [*sinks[1:3], watched], strict=True):
                engine.submit(EngineRequest(prompt, _params(6), sink, [], []))
        answers = [sink.wait(300).tokens for sink in sinks]
    finally:
        engine.stop()
    expected = [_stock_greedy(llama, p, n) for p, n in zip(prompts, (60, 6, 6, 6), strict=True)]
    assert answers == expected
    # One prompt at a time, or in arrival order, the 70-token prompt would have had its first
    # token after both long ones had theirs.
    assert watched.others_at_first == [0, 0]
