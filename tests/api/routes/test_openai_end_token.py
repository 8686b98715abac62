"""The end token that ends an answer keeps its log-prob entry, as vLLM's and OpenAI's answers
have it, through the official `openai` SDK against the live api on the cpu engine; its text
never reaches the answer. An evaluation harness's loglikelihood (`echo`, `max_tokens` 1,
lm-evaluation-harness drops the last entry as the generated token's) needs it: without it the
harness dropped the last prompt token's score instead."""

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

# A finished answer: the model's next token is its end of turn (<|im_end|>, log-prob about
# -0.09 in float32, 4 nats ahead of the next best).
ANSWERED = "<|im_start|>user\nName a colour.<|im_end|>\n<|im_start|>assistant\nBlue."
TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def checkpoint(triton_server: Any) -> tuple[Any, Any]:
    folder = prepare_default_model(triton_server.settings.cache_dir / "models" / DEFAULT_MODEL_NAME)
    return engine_model(folder), AutoTokenizer.from_pretrained(folder)


def next_logsoftmax(checkpoint: tuple[Any, Any], prompt: str) -> torch.Tensor:
    """transformers' log-softmax of the token after `prompt` (the checkpoint as served)."""
    hf_model, tokenizer = checkpoint
    ids = encode_prompt(tokenizer, prompt, 4096)
    with torch.inference_mode():
        logits = hf_model(torch.tensor([ids, ids])).logits[0, -1].float()
    return torch.log_softmax(logits, dim=-1)


def test_echo_max_tokens_1_has_the_end_token_entry(
    client: openai.OpenAI, model: str, api: httpx.Client, checkpoint: tuple[Any, Any]
) -> None:
    tokenizer = checkpoint[1]
    end = tokenizer.convert_ids_to_tokens(tokenizer.eos_token_id)
    raw = client.completions.with_raw_response.create(
        model=model, prompt=ANSWERED, max_tokens=1, echo=True, logprobs=1, temperature=0
    )
    answer = raw.parse()
    choice = answer.choices[0]
    assert choice.finish_reason == "stop" and choice.text == ANSWERED  # no end token in text
    logprobs = choice.logprobs
    assert logprobs is not None and logprobs.tokens and logprobs.token_logprobs
    prompt_ids = encode_prompt(tokenizer, ANSWERED, 4096)
    assert len(logprobs.tokens) == len(prompt_ids) + 1 and logprobs.tokens[-1] == end
    expected = float(next_logsoftmax(checkpoint, ANSWERED)[tokenizer.eos_token_id])
    assert logprobs.token_logprobs[-1] != 0.0
    assert logprobs.token_logprobs[-1] == pytest.approx(expected, abs=TOLERANCE)
    assert logprobs.top_logprobs and logprobs.top_logprobs[-1] == {end: logprobs.token_logprobs[-1]}
    assert logprobs.text_offset and logprobs.text_offset[-1] == len(ANSWERED)
    assert answer.usage is not None and answer.usage.completion_tokens == 1  # vLLM counts it
    row = api.get(f"/v1/predictions/{raw.headers['x-prediction-id']}").json()
    assert row["output"] == ANSWERED and row["finish_reason"] == "stop"


def test_the_end_token_entry_on_chat_and_streamed(
    client: openai.OpenAI, model: str, checkpoint: tuple[Any, Any]
) -> None:
    tokenizer = checkpoint[1]
    end = tokenizer.convert_ids_to_tokens(tokenizer.eos_token_id)
    messages: Any = [{"role": "user", "content": "Hi!"}]  # "Hello! How can I ..." (10 tokens)
    chat = dict(model=model, messages=messages, max_tokens=40, temperature=0, logprobs=True)
    whole = client.chat.completions.create(**chat)
    assert whole.choices[0].finish_reason == "stop"  # the premise: it ends by itself
    content = whole.choices[0].logprobs.content
    assert content is not None and content[-1].token == end and content[-1].logprob < 0
    text = whole.choices[0].message.content or ""
    assert end not in text and "".join(entry.token for entry in content[:-1]) == text
    assert whole.usage is not None and whole.usage.completion_tokens == len(content)
    entries = [
        entry.token
        for chunk in client.chat.completions.create(**chat, stream=True)
        for choice in chunk.choices
        if choice.logprobs is not None
        for entry in choice.logprobs.content or []
    ]
    assert entries == [entry.token for entry in content]
    # Without log-probs the text and the count are the same.
    plain = client.completions.create(model=model, prompt=ANSWERED, max_tokens=4, temperature=0)
    assert plain.choices[0].text == "" and plain.choices[0].finish_reason == "stop"
    assert plain.usage is not None and plain.usage.completion_tokens == 1
