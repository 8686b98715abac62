"""The written-out decode step gives the eager forward's logits bit for bit, at every batch size
the engine runs, and the engine that uses it still answers as transformers' `generate()` does."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch
from transformers import DynamicCache
from tritonbox_testing.hardware import needs_bf16
from tritonbox_testing.reference import greedy_ids
from tritonbox_testing.step_check import step_equals_forward

from tritonbox_triton.engine import family, linear_kernel
from tritonbox_triton.engine.decode_step import DecodeStep, unsupported
from tritonbox_triton.engine.fused_ops import load as load_fused_ops
from tritonbox_triton.engine.kv_batch import BatchedKVCache, prefilled_layers
from tritonbox_triton.engine.params import EngineLimits, SamplingParams
from tritonbox_triton.engine.scheduler import EngineRequest, InflightBatcher
from tritonbox_triton.engine.words import text_decoder

EOS = 2


@pytest.fixture(scope="module", params=[pytest.param("fused", marks=needs_bf16), "pytorch"])
def step(model: Any, request: pytest.FixtureRequest) -> DecodeStep:
    """The step with its elementwise stages fused (fused_ops.py), as the engine runs it where a
    compiler is found, and as PyTorch's operations, as it runs elsewhere."""
    if request.param == "fused":
        fused = load_fused_ops()
        assert fused is not None, "no fused ops on this machine: fused_ops.py's log says why"
        built = DecodeStep(model, fused)
        assert built.fused is fused
        return built
    return DecodeStep(model)


def _prefilled_batch(model: Any, lengths: list[int]) -> BatchedKVCache:
    generator = torch.Generator().manual_seed(sum(lengths))
    groups = model.config.num_attention_heads // model.config.num_key_value_heads
    batch = BatchedKVCache(query_groups=groups)
    for length in lengths:
        cache = DynamicCache(config=model.config)
        ids = torch.randint(0, 49_000, (1, length), generator=generator)
        with torch.inference_mode():
            model(input_ids=ids, past_key_values=cache, use_cache=True)
        batch.add_sequence(cache)
    return batch


@pytest.mark.parametrize(
    "lengths", [[11], [7, 19, 4], [5, 9, 13, 3, 8, 21], [4 + i for i in range(16)]]
)
def test_step_logits_equal_the_eager_forwards(
    model: Any, step: DecodeStep, lengths: list[int]
) -> None:
    """Padded rows, a lone row's twin, and batches past the buffers' first row capacity."""
    batch = _prefilled_batch(model, lengths)
    generator = torch.Generator().manual_seed(7)
    for _ in range(3):
        step_equals_forward(
            model, step, batch, lambda rows: torch.randint(0, 49_000, (rows,), generator=generator)
        )


def test_the_engine_decodes_with_it_and_answers_as_generate(
    model: Any, tokenizer: Any, make_sink: Any
) -> None:
    engine = InflightBatcher(
        model, text_decoder(tokenizer), EngineLimits(256, 64, 10_000), max_batch_size=4
    )
    assert engine._fast_step is not None
    prompts = ["The capital of France is", "def fibonacci(n):", "Once upon a time, a robot"]
    requests = []
    for text in prompts:
        prompt = list(tokenizer(text)["input_ids"])
        sink = make_sink()
        params = SamplingParams(max_tokens=24, end_id=EOS, pad_id=EOS, temperature=0.0)
        requests.append((prompt, sink))
        engine.submit(EngineRequest(prompt=prompt, params=params, sink=sink, stop_words=[],
                                    bad_words=[]))  # fmt: skip
    while engine.run_once():
        pass
    for prompt, sink in requests:
        assert sink.error is None
        assert sink.tokens == greedy_ids(model, prompt, 24, EOS)


def test_models_it_does_not_write_out_say_why(model: Any) -> None:
    assert unsupported(model) is None
    config = model.config
    original = config.model_type
    try:
        config.model_type = "gpt2"
        assert "gpt2" in (unsupported(model) or "")
    finally:
        config.model_type = original


def test_a_lone_chat_prompt_answers_as_generate(model: Any, tokenizer: Any, make_sink: Any) -> None:
    """34 tokens: alone, its products round otherwise than in generate()'s twin rows (oneDNN
    sums more than 32 rows by their count), so the engine prefills a lone prompt as twins."""
    engine = InflightBatcher(
        model, text_decoder(tokenizer), EngineLimits(256, 64, 10_000), max_batch_size=4
    )
    chat = [{"role": "user", "content": "Name a fruit."}]
    text = tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    prompt = list(tokenizer(text)["input_ids"])
    assert len(prompt) > 32
    sink = make_sink()
    params = SamplingParams(max_tokens=24, end_id=EOS, pad_id=EOS, temperature=0.0)
    engine.submit(EngineRequest(prompt, params, sink, [], []))
    while engine.run_once():
        pass
    assert sink.tokens == greedy_ids(model, prompt, 24, EOS)


@pytest.mark.parametrize("threads", [1, 2])
def test_a_twin_prefill_is_the_forwards_where_exact_for_says_so(
    model: Any, step: DecodeStep, threads: int
) -> None:
    """Where the prepacked products round as the plain ones of the reference's twin rows, the
    prepacked prefill gives generate()'s prefill bit for bit, next-token logits and every
    layer's keys and values: run as twins where `exact_for` says so, once where
    `lone_exact_for` does. Where they do not, the engine takes the forward, so neither check
    may say yes where the bits differ: every answer is tried on each length, at one and at two
    threads (the kernels split their sums by threads; one try on random rows once said yes at
    150 tokens on one thread, and at 35, 97 or 107 tokens, where the bits differ)."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        _check_prefills_against_the_forward(model, DecodeStep(model, step.fused))
    finally:
        torch.set_num_threads(before)


def _check_prefills_against_the_forward(model: Any, step: DecodeStep) -> None:
    generator = torch.Generator().manual_seed(5)
    answers = {}
    for length in (1, 3, 16, 17, 34, 35, 39, 64, 97, 107, 150):
        prompt = torch.randint(0, 49_000, (length,), generator=generator).tolist()
        cache = DynamicCache(config=model.config)
        with torch.inference_mode():
            output = model(
                input_ids=torch.tensor([prompt] * 2), past_key_values=cache, logits_to_keep=1
            )
        for copies, check in ((2, step.exact_for), (1, step.lone_exact_for)):
            logits, layers = step.prefill([prompt] * copies)
            same = torch.equal(logits[:1], output.logits[:1, -1]) and all(
                torch.equal(keys, expected_keys[:1]) and torch.equal(values, expected_values[:1])
                for (keys, values), (expected_keys, expected_values) in zip(
                    layers[0], prefilled_layers(cache), strict=True
                )
            )
            answers[length, copies] = check(length)
            if answers[length, copies]:
                assert same, f"{length} tokens, {copies} copies: the check said yes, bits differ"
    # Twin rows up to 32 always agree. A lone row agrees with its twins on the AMX machine, not
    # with an AMD EPYC's AVX-512 kernels (one row rounds otherwise there): that is the machine's
    # to say, and the check above holds either way.
    assert answers[3, 2] and answers[16, 2]


def test_a_lone_prompt_takes_the_prepacked_prefill(
    model: Any, tokenizer: Any, make_sink: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = InflightBatcher(
        model, text_decoder(tokenizer), EngineLimits(256, 64, 10_000), max_batch_size=4
    )
    assert engine._fast_step is not None
    passes: list[int] = []
    prefill = engine._fast_step.prefill

    def counted(prompts: list[list[int]]) -> Any:
        passes.append(len(prompts))
        return prefill(prompts)

    monkeypatch.setattr(engine._fast_step, "prefill", counted)
    prompt = list(tokenizer("The capital of France is")["input_ids"])
    sink = make_sink()
    params = SamplingParams(max_tokens=8, end_id=EOS, pad_id=EOS, temperature=0.0)
    engine.submit(EngineRequest(prompt, params, sink, [], []))
    while engine.run_once():
        pass
    assert passes == [1 if engine._fast_step.lone_exact_for(len(prompt)) else 2]
    assert sink.tokens == greedy_ids(model, prompt, 8, EOS)


def test_rope_past_the_models_length_is_the_models_own(model: Any, step: DecodeStep) -> None:
    """The cos/sin table covers the model's trained length and grows when a longer context
    reaches past it, with the values the model's rotary embedding computes there."""
    positions = torch.tensor([3, model.config.max_position_embeddings + 5])
    cos, sin = step.rotary(positions)
    embed = model.model.embed_tokens.weight[:1]
    expected_cos, expected_sin = model.model.rotary_emb(embed, positions[None])
    assert torch.equal(cos[:, 0], expected_cos[0]) and torch.equal(sin[:, 0], expected_sin[0])


def test_bfloat16_without_native_bfloat16_takes_the_forward(
    model: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PyTorch emulates bfloat16 on such a CPU, and without the AVX2 products (linear_kernel.py)
    the step would not give the forward's bits; with them, or with native bfloat16, it does."""
    bf16 = SimpleNamespace(dtype=torch.bfloat16, config=model.config)
    monkeypatch.setattr(family, "cpu_flags", lambda: frozenset({"avx2", "avx512f"}))
    monkeypatch.setattr(linear_kernel, "current", lambda: None)
    assert "without native bfloat16" in (unsupported(bf16) or "")
    monkeypatch.setattr(linear_kernel, "current", lambda: object())
    assert unsupported(bf16) is None
    monkeypatch.setattr(linear_kernel, "current", lambda: None)
    monkeypatch.setattr(family, "cpu_flags", lambda: frozenset({"avx512f", "avx512_bf16"}))
    assert unsupported(bf16) is None
