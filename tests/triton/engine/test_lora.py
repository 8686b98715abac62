"""Many LoRA adapters in one in-flight batch, against transformers + peft `generate()`.

Adapters are made at test time with peft on the real default model (random, nonzero A and B)
and reach the engine the way Triton hands them over: TensorRT-LLM's lora_weights/lora_config.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerBase
from tritonbox_testing.lora import (
    ALL,
    EOS,
    load_base,
    lora_inputs,
    make_adapter,
    reference_model,
)
from tritonbox_testing.lora import reference as peft_reference
from tritonbox_testing.reference import chat_ids

from tritonbox_common.errors import RequestError
from tritonbox_triton.engine.lora_cache import LoraCache, LoraResolver
from tritonbox_triton.engine.lora_layers import EngineAdapter, attach_lora
from tritonbox_triton.engine.params import EngineLimits, SamplingParams
from tritonbox_triton.engine.scheduler import EngineRequest, InflightBatcher
from tritonbox_triton.engine.stats import IterationStats
from tritonbox_triton.engine.words import text_decoder

MAX_TOKENS = 20
ADAPTERS: dict[str, dict[str, Any]] = {
    "qv": {"r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj"]},
    "all": {"r": 4, "lora_alpha": 8, "target_modules": ALL, "use_rslora": True},
}
PROMPTS = ["Name a fruit.", "What is two plus two?", "Say hello.", "Describe the moon."]


@pytest.fixture(scope="module")
def adapter_dirs(tokenizer_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return {
        name: make_adapter(tokenizer_dir, tmp_path_factory.mktemp(name), seed, **options)
        for seed, (name, options) in enumerate(ADAPTERS.items())
    }


@pytest.fixture(scope="module")
def peft_model(tokenizer_dir: Path, adapter_dirs: dict[str, Path]) -> Any:
    return reference_model(tokenizer_dir, adapter_dirs)


def reference(peft_model: Any, prompt: list[int], adapter: str | None) -> list[int]:
    return peft_reference(peft_model, prompt, adapter, MAX_TOKENS)


class MaxActive:
    def __init__(self) -> None:
        self.max_active = 0

    def on_iteration(self, stats: IterationStats) -> None:
        self.max_active = max(self.max_active, stats.active)

    def on_tokens(self, count: int) -> None:
        pass

    def on_finished(self, outcome: str) -> None:
        pass


@pytest.fixture(scope="module")
def lora_engine(
    tokenizer_dir: Path, tokenizer: PreTrainedTokenizerBase
) -> Iterator[tuple[InflightBatcher, LoraResolver, MaxActive]]:
    model = load_base(tokenizer_dir)
    rows, dims, layers = attach_lora(model)
    resolver = LoraResolver(LoraCache(1 << 30), dims, layers, max_rank=64)
    observer = MaxActive()
    batcher = InflightBatcher(
        model,
        text_decoder(tokenizer),
        EngineLimits(256, 128, 4096),
        max_batch_size=8,
        observer=observer,
        lora_rows=rows,
    )
    batcher.start()
    yield batcher, resolver, observer
    batcher.stop()


def submit(
    engine: InflightBatcher, sink: Any, prompt: list[int], lora: EngineAdapter | None
) -> Any:
    params = SamplingParams(max_tokens=MAX_TOKENS, end_id=EOS, pad_id=EOS, temperature=0.0)
    engine.submit(EngineRequest(prompt, params, sink, [], [], lora=lora))
    return sink


def test_each_adapter_alone_matches_peft_generate(
    lora_engine: Any,
    peft_model: Any,
    adapter_dirs: dict[str, Path],
    tokenizer: PreTrainedTokenizerBase,
    make_sink: Any,
) -> None:
    engine, resolver, _ = lora_engine
    prompt = chat_ids(tokenizer, PROMPTS[0])
    base = reference(peft_model, prompt, None)
    for name, folder in adapter_dirs.items():
        adapter = resolver.resolve(lora_inputs(folder))
        expected = reference(peft_model, prompt, name)
        assert expected != base, f"adapter {name} should change the greedy answer"
        assert submit(engine, make_sink(), prompt, adapter).wait().tokens == expected


def test_mixed_batch_every_row_equals_its_solo_run(
    lora_engine: Any,
    peft_model: Any,
    adapter_dirs: dict[str, Path],
    tokenizer: PreTrainedTokenizerBase,
    make_sink: Any,
) -> None:
    engine, resolver, observer = lora_engine
    qv = resolver.resolve(lora_inputs(adapter_dirs["qv"]))
    every = resolver.resolve(lora_inputs(adapter_dirs["all"]))
    # base, two different adapters, the same adapter twice (id only: from the cache), base.
    qv_again = resolver.resolve(lora_inputs(adapter_dirs["qv"], with_weights=False))
    assert qv_again is qv
    plan = [(None, 0), ("qv", 1), ("all", 2), ("qv", 3), (None, 1)]
    objects = {None: None, "qv": qv, "all": every}
    prompts = [chat_ids(tokenizer, PROMPTS[i]) for _, i in plan]
    observer.max_active = 0
    sinks = [
        submit(engine, make_sink(), prompt, objects[name])
        for (name, _), prompt in zip(plan, prompts, strict=True)
    ]
    results = [sink.wait().tokens for sink in sinks]
    assert observer.max_active >= 4, "the requests should have decoded in one batch"
    for (name, _), prompt, tokens in zip(plan, prompts, results, strict=True):
        assert tokens == reference(peft_model, prompt, name), name


def test_evicted_adapter_needs_its_weights_again_but_running_rows_keep_theirs(
    lora_engine: Any,
    peft_model: Any,
    adapter_dirs: dict[str, Path],
    tokenizer: PreTrainedTokenizerBase,
    make_sink: Any,
) -> None:
    engine, resolver, _ = lora_engine
    qv_inputs = lora_inputs(adapter_dirs["qv"])
    all_inputs = lora_inputs(adapter_dirs["all"])
    sizes = [resolver.resolve(inputs).nbytes for inputs in (qv_inputs, all_inputs)]
    small = LoraResolver(
        LoraCache(max(sizes) + 1), resolver.dims, resolver.num_layers, max_rank=64
    )  # holds one
    qv = small.resolve(qv_inputs)
    prompt = chat_ids(tokenizer, PROMPTS[2])
    sink = submit(engine, make_sink(), prompt, qv)
    time.sleep(0.3)  # running now
    small.resolve(all_inputs)  # evicts qv
    tid = int(qv_inputs["lora_task_id"][0, 0])
    assert tid not in small.cache
    with pytest.raises(RequestError) as error:
        small.resolve(lora_inputs(adapter_dirs["qv"], with_weights=False))
    message = f"LoRA task {tid} not found in cache. Please send LoRA weights with request"
    assert str(error.value) == message
    assert sink.wait().tokens == reference(peft_model, prompt, "qv")
    assert small.resolve(qv_inputs) is not qv  # resent weights are converted again


def test_refuses_rank_over_max_and_unknown_modules_and_disabled_lora(
    lora_engine: Any, adapter_dirs: dict[str, Path]
) -> None:
    _, resolver, _ = lora_engine
    dims = resolver.dims
    low = LoraResolver(LoraCache(1 << 30), dims, resolver.num_layers, max_rank=4)
    with pytest.raises(RequestError, match=r"Invalid low_rank \(8\).*\(4\)"):
        low.resolve(lora_inputs(adapter_dirs["qv"]))
    assert low.resolve(lora_inputs(adapter_dirs["all"])) is not None  # rank 4 is fine
    attention = {name: dims[name] for name in ("q_proj", "k_proj", "v_proj", "o_proj")}
    narrow = LoraResolver(LoraCache(1 << 30), attention, resolver.num_layers, max_rank=64)
    with pytest.raises(RequestError, match=r"lora module mlp_\w+ not enabled for this model"):
        narrow.resolve(lora_inputs(adapter_dirs["all"]))
    off = LoraResolver(LoraCache(1 << 30), dims, resolver.num_layers, max_rank=0)
    with pytest.raises(RequestError, match="disabled"):
        off.resolve(lora_inputs(adapter_dirs["qv"]))
    assert off.resolve({}) is None
    weights_only = lora_inputs(adapter_dirs["qv"])
    del weights_only["lora_task_id"]
    with pytest.raises(RequestError, match="lora_task_id must be set"):
        resolver.resolve(weights_only)


def test_base_rows_are_bit_identical_and_adapter_rows_match_their_solo_pass() -> None:
    torch.manual_seed(0)
    config = LlamaConfig(
        hidden_size=32,
        intermediate_size=48,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_hidden_layers=2,
        vocab_size=64,
    )
    model = LlamaForCausalLM(config).eval()
    rows, dims, layers = attach_lora(model)

    def adapter(seed: int, rank: int, modules: list[str]) -> EngineAdapter:
        generator = torch.Generator().manual_seed(seed)
        weights = {
            (layer, m): (
                torch.randn(rank, dims[m][0], generator=generator),
                torch.randn(dims[m][1], rank, generator=generator) * 0.1,
            )
            for layer in range(layers)
            for m in modules
        }
        return EngineAdapter(seed, weights, rank, 0)

    x, y = adapter(1, 2, ["q_proj", "down_proj"]), adapter(2, 5, ALL)
    ids = torch.randint(0, 64, (4, 6))
    plan = [None, x, None, y]
    with torch.inference_mode():
        rows.use([None] * 4)
        base = model(input_ids=ids).logits
        rows.use(plan)
        mixed = model(input_ids=ids).logits
        for i, lora in enumerate(plan):
            rows.use([lora])
            solo = model(input_ids=ids[i : i + 1]).logits[0]
            torch.testing.assert_close(mixed[i], solo, rtol=1e-5, atol=1e-5)
    assert torch.equal(mixed[0], base[0]) and torch.equal(mixed[2], base[2])
    assert not torch.allclose(mixed[1], base[1]) and not torch.allclose(mixed[3], base[3])
