"""Prompts prefilled together give what each gives alone: the same next-token logits and the
same keys and values, bit for bit; and the engine uses a shared prefill for a burst of requests."""

from __future__ import annotations

from typing import Any

import torch
from transformers import DynamicCache
from tritonbox_testing.engine_observer import recorded_engine
from tritonbox_testing.reference import greedy_ids

from tritonbox_triton.engine import prefill
from tritonbox_triton.engine.kv_batch import Layers, prefilled_layers
from tritonbox_triton.engine.params import SamplingParams
from tritonbox_triton.engine.scheduler import EngineRequest

EOS = 2


def _alone(model: Any, prompt: list[int]) -> tuple[torch.Tensor, Layers]:
    cache = DynamicCache(config=model.config)
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([prompt]), past_key_values=cache).logits[0, -1]
    return logits, prefilled_layers(cache)


def test_prompts_together_equal_each_alone(model: Any) -> None:
    """The padding after a shorter prompt changes nothing of it. oneDNN sums a product of more
    than 32 rows in another order (prefill.py), so the values agree to bfloat16's rounding, not
    bit for bit; a leak of the padding would move them by far more."""
    generator = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 49_000, (n,), generator=generator).tolist() for n in (9, 39, 2, 17)]
    logits, layers = prefill.prefill_together(model, prompts)
    for prompt, row, own in zip(prompts, logits, layers, strict=True):
        expected_logits, expected_layers = _alone(model, prompt)
        assert int(row.argmax()) == int(expected_logits.argmax())
        torch.testing.assert_close(row.float(), expected_logits.float(), rtol=0.05, atol=0.5)
        for (keys, values), (expected_keys, expected_values) in zip(
            own, expected_layers, strict=True
        ):
            assert keys.shape == expected_keys.shape
            torch.testing.assert_close(keys.float(), expected_keys.float(), rtol=0.1, atol=1.0)
            torch.testing.assert_close(values.float(), expected_values.float(), rtol=0.1, atol=1.0)


def test_groups_keep_order_and_the_token_budget() -> None:
    prompts = [[0] * n for n in (10, 10, 30, 5, 100, 1)]
    runs = prefill.groups(prompts, budget=64)
    assert [i for run in runs for i in run] == list(range(6))
    for run in runs:
        if len(run) > 1:
            assert len(run) * max(len(prompts[i]) for i in run) <= 64
    assert runs[0] == [0, 1, 2] or runs[0] == [0, 1]


def test_groups_leave_apart_prompts_that_would_pad_each_other() -> None:
    """Beside streams a prompt joins a run only where its padding costs less than a pass of its
    own (batch_prefill.py gives ChunkBudget.padding_worth)."""
    prompts = [[0] * n for n in (72, 445, 132, 133, 140, 20)]
    assert prefill.groups(prompts, budget=4096) == [[0, 1, 2, 3, 4, 5]]
    runs = prefill.groups(prompts, budget=4096, most_padding=40)
    assert runs == [[0], [1], [2, 3, 4], [5]]  # 133 adds 1 padded token, 140 adds 14
    assert prefill.groups(prompts, budget=4096, most_padding=0) == [[0], [1], [2], [3], [4], [5]]


def test_who_may_share_a_prefill() -> None:
    plain = SamplingParams(max_tokens=4, end_id=EOS, pad_id=EOS)
    assert prefill.shareable(plain, has_adapter=False)
    assert not prefill.shareable(plain, has_adapter=True)
    scored = SamplingParams(max_tokens=4, end_id=EOS, pad_id=EOS, return_prompt_log_probs=True)
    assert not prefill.shareable(scored, has_adapter=False)


def test_a_burst_is_prefilled_in_one_pass_and_answers_as_generate(
    model: Any, tokenizer: Any, make_sink: Any
) -> None:
    engine, steps = recorded_engine(model, tokenizer, max_batch_size=8)
    texts = ["The capital of France is", "def add(a, b):", "Roses are red,", "1, 2, 3,"]
    runs = []
    for text in texts:
        prompt = list(tokenizer(text)["input_ids"])
        sink = make_sink()
        params = SamplingParams(max_tokens=12, end_id=EOS, pad_id=EOS, temperature=0.0)
        engine.submit(EngineRequest(prompt, params, sink, [], []))
        runs.append((prompt, sink))
    while engine.run_once():
        pass
    assert steps.iterations[0].context == len(texts), "the four prompts should share the first pass"
    for prompt, sink in runs:
        assert sink.error is None
        assert sink.tokens == greedy_ids(model, prompt, 12, EOS)
