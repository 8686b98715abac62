"""The engine's answers against stock transformers as users run it: `AutoModelForCausalLM` in
float32, its own attention, `generate()` one prompt at a time, nothing patched.

- CPU_DTYPE=float32: greedy output equals stock generate() token for token, with the prompts
  served together (in-flight batching, shared prefills).
- bfloat16 (the default where the CPU computes it natively): the weights and activations are
  rounded, so later tokens may part ways; the first token equals stock float32's wherever
  float32's best two are at least `CLEAR_GAP` apart, and the README's question is answered as
  the model answers it ("Paris"). Both rest on the float32 logits (engine/float_logits.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, PreTrainedTokenizerBase
from tritonbox_testing.reference import chat_ids

from tritonbox_triton.engine.attention import load_model
from tritonbox_triton.engine.params import EngineLimits, SamplingParams
from tritonbox_triton.engine.scheduler import EngineRequest, InflightBatcher
from tritonbox_triton.engine.words import text_decoder

EOS = 2
CLEAR_GAP = 0.05  # nats between float32's best two first tokens
CHAT = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "List three colors.",
    "Why is the sky blue?",
    "Who wrote Hamlet?",
    "What is 2+2?",
    "Translate 'good morning' to Spanish.",
    "Name a large mammal.",
    "What is the boiling point of water?",
    "Give me a synonym for happy.",
    "How many legs does a spider have?",
    "Tell me a fun fact.",
    "What is Python?",
    "Summarize: The cat sat on the mat.",
    "What is the capital of Germany?",
    "Explain gravity in one sentence.",
]


@pytest.fixture(scope="module")
def stock(tokenizer_dir: Path) -> Any:
    return AutoModelForCausalLM.from_pretrained(tokenizer_dir, dtype=torch.float32).eval()


def serve(
    model: Any, tokenizer: PreTrainedTokenizerBase, prompts: list[list[int]], max_tokens: int,
    make_sink: Any,
) -> list[Any]:  # fmt: skip
    """The prompts submitted together to one engine; each one's finished sink."""
    engine = InflightBatcher(
        model, text_decoder(tokenizer), EngineLimits(512, 128, 8192), max_batch_size=8
    )
    engine.start()
    try:
        sinks = [make_sink() for _ in prompts]
        for prompt, sink in zip(prompts, sinks, strict=True):
            params = SamplingParams(
                max_tokens=max_tokens, end_id=EOS, pad_id=EOS, return_log_probs=True
            )
            engine.submit(EngineRequest(prompt, params, sink, stop_words=[], bad_words=[]))
        return [sink.wait(600) for sink in sinks]
    finally:
        engine.stop()


def without_eos(tokens: list[int]) -> list[int]:
    return tokens[: tokens.index(EOS)] if EOS in tokens else tokens


@pytest.fixture(scope="module")
def float32_engine(tokenizer_dir: Path) -> Iterator[Any]:
    yield load_model(tokenizer_dir, torch.float32)


def test_float32_greedy_equals_stock_generate(
    float32_engine: Any, stock: Any, tokenizer: PreTrainedTokenizerBase, make_sink: Any
) -> None:
    prompts = [chat_ids(tokenizer, text) for text in CHAT[:4]]
    sinks = serve(float32_engine, tokenizer, prompts, 24, make_sink)
    for prompt, sink in zip(prompts, sinks, strict=True):
        with torch.inference_mode():
            output = stock.generate(torch.tensor([prompt]), max_new_tokens=24, do_sample=False)
        expected = without_eos(output[0, len(prompt) :].tolist())
        assert without_eos(sink.tokens) == expected, tokenizer.decode(prompt)


def test_first_tokens_are_stock_float32s_where_it_is_clear(
    model: Any, stock: Any, tokenizer: PreTrainedTokenizerBase, make_sink: Any
) -> None:
    prompts = [chat_ids(tokenizer, text) for text in CHAT]
    sinks = serve(model, tokenizer, prompts, 1, make_sink)
    clear = 0
    for text, prompt, sink in zip(CHAT, prompts, sinks, strict=True):
        with torch.inference_mode():
            logprobs = torch.log_softmax(stock(torch.tensor([prompt])).logits[0, -1], -1)
        best = logprobs.topk(2)
        if best.values[0] - best.values[1] < CLEAR_GAP:
            continue
        clear += 1
        assert sink.tokens[0] == int(best.indices[0]), text
        # The engine's log-prob is float32's within bfloat16 weights' reach, not rounded.
        assert abs(sink.logprobs[0] - float(best.values[0])) < 0.25, text
    assert clear >= len(CHAT) // 2  # the check compared something


def test_the_readme_question_is_answered_paris(
    model: Any, tokenizer: PreTrainedTokenizerBase, make_sink: Any
) -> None:
    (sink,) = serve(model, tokenizer, [chat_ids(tokenizer, CHAT[0])], 16, make_sink)
    assert "Paris" in tokenizer.decode(without_eos(sink.tokens))
