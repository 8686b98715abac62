"""`echo` on /v1/completions through the official `openai` SDK against the live api on the cpu
engine, as vLLM answers it: the prompt before the completion, its tokens' log-probs first (the
first token's null), `max_tokens=0` scoring the prompt only (evaluation harnesses' loglikelihood),
streamed with the prompt in the first chunk; values equal transformers' log-softmax (1e-4)."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest
import torch
from transformers import AutoTokenizer
from tritonbox_testing.reference import engine_model

from tritonbox_common.tokenization import encode_prompt
from tritonbox_triton.prepare_model import prepare_default_model
from tritonbox_triton.settings import DEFAULT_MODEL_NAME

PROMPT = "The capital of France is Paris. The capital of Italy is"
TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def checkpoint(triton_server: Any) -> tuple[Any, Any]:
    folder = prepare_default_model(triton_server.settings.cache_dir / "models" / DEFAULT_MODEL_NAME)
    return engine_model(folder), AutoTokenizer.from_pretrained(folder)


def prompt_reference(checkpoint: tuple[Any, Any]) -> tuple[list[int], torch.Tensor]:
    """The prompt's ids and transformers' log-softmax at each position, [len - 1, vocab]."""
    hf_model, tokenizer = checkpoint
    ids = encode_prompt(tokenizer, PROMPT, 4096)
    with torch.inference_mode():
        logits = hf_model(torch.tensor([ids])).logits[0, :-1].float()
    return ids, torch.log_softmax(logits, dim=-1)


def test_echo_max_tokens_0_scores_the_prompt(
    client: openai.OpenAI, model: str, api: httpx.Client, checkpoint: tuple[Any, Any]
) -> None:
    raw = client.completions.with_raw_response.create(
        model=model, prompt=PROMPT, max_tokens=0, echo=True, logprobs=2, temperature=0
    )
    answer = raw.parse()
    choice = answer.choices[0]
    assert choice.text == PROMPT and choice.finish_reason == "length"
    ids, logsoftmax = prompt_reference(checkpoint)
    assert answer.usage is not None
    assert answer.usage.prompt_tokens == len(ids) and answer.usage.completion_tokens == 0
    logprobs = choice.logprobs
    assert logprobs is not None and logprobs.token_logprobs and logprobs.top_logprobs
    tokenizer = checkpoint[1]
    assert logprobs.tokens == [tokenizer.decode([i]) for i in ids]
    assert logprobs.token_logprobs[0] is None and logprobs.top_logprobs[0] is None
    for i, token in enumerate(ids[1:]):
        assert logprobs.token_logprobs[i + 1] == pytest.approx(
            float(logsoftmax[i, token]), abs=TOLERANCE
        )
        top = logprobs.top_logprobs[i + 1]
        best = torch.topk(logsoftmax[i], 2)
        assert top is not None and len(top) in (2, 3)  # the 2 best, and the prompt's token
        assert max(top.values()) == pytest.approx(float(best.values[0]), abs=TOLERANCE)
    offsets = [sum(len(t) for t in logprobs.tokens[:i]) for i in range(len(ids))]
    assert logprobs.text_offset == offsets
    row = api.get(f"/v1/predictions/{raw.headers['x-prediction-id']}").json()
    assert row["status"] == "succeeded" and row["output"] == PROMPT  # what was returned
    assert row["input"]["echo"] is True and row["applied"]["max_tokens"] == 0


def test_echo_with_a_completion_puts_the_prompt_first(
    client: openai.OpenAI, model: str, api: httpx.Client, checkpoint: tuple[Any, Any]
) -> None:
    plain = client.completions.create(
        model=model, prompt=PROMPT, max_tokens=5, temperature=0, logprobs=1
    )
    raw = client.completions.with_raw_response.create(
        model=model, prompt=PROMPT, max_tokens=5, temperature=0, logprobs=1, echo=True
    )
    echoed = raw.parse()
    text, generated = echoed.choices[0].text, plain.choices[0].text
    assert text == PROMPT + generated
    ids, logsoftmax = prompt_reference(checkpoint)
    logprobs, alone = echoed.choices[0].logprobs, plain.choices[0].logprobs
    assert logprobs is not None and alone is not None and logprobs.token_logprobs
    # The same tokens; their values within float32 noise (the prefill's logits of every
    # position are one matrix product, of the last position alone another).
    assert logprobs.token_logprobs[len(ids) :] == pytest.approx(alone.token_logprobs, abs=1e-5)
    assert logprobs.tokens is not None and logprobs.tokens[len(ids) :] == alone.tokens
    assert logprobs.token_logprobs[0] is None
    assert logprobs.token_logprobs[1] == pytest.approx(float(logsoftmax[0, ids[1]]), abs=TOLERANCE)
    row = api.get(f"/v1/predictions/{raw.headers['x-prediction-id']}").json()
    assert row["output"] == text
    # Without logprobs: the text only, nothing asked of the engine's prefill.
    bare = client.completions.create(model=model, prompt=PROMPT, max_tokens=5, temperature=0,
                                     echo=True)  # fmt: skip
    assert bare.choices[0].text == text and bare.choices[0].logprobs is None


def test_streamed_echo_sends_the_prompt_in_the_first_chunk(
    client: openai.OpenAI, model: str
) -> None:
    whole = client.completions.create(
        model=model, prompt=PROMPT, max_tokens=4, temperature=0, logprobs=1, echo=True
    )
    chunks = list(
        client.completions.create(
            model=model, prompt=PROMPT, max_tokens=4, temperature=0, logprobs=1, echo=True,
            stream=True,
        )
    )  # fmt: skip
    texts = [c.choices[0].text for c in chunks if c.choices]
    assert texts[0].startswith(PROMPT) and "".join(texts) == whole.choices[0].text
    values: list[float | None] = []
    for chunk in chunks:
        if chunk.choices and chunk.choices[0].logprobs is not None:
            values += chunk.choices[0].logprobs.token_logprobs or []
    assert whole.choices[0].logprobs is not None
    assert values == whole.choices[0].logprobs.token_logprobs
    prompt_only = list(
        client.completions.create(model=model, prompt=PROMPT, max_tokens=0, echo=True, stream=True)
    )
    assert "".join(c.choices[0].text for c in prompt_only if c.choices) == PROMPT
