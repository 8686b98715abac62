"""Token log-probs through the official `openai` SDK against the live api on the cpu engine:
equal to transformers' log-softmax of the same checkpoint, in OpenAI's shapes, streamed too."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest
import torch
from transformers import AutoTokenizer
from tritonbox_testing.reference import engine_model, greedy_generate

from tritonbox_common.tokenization import encode_prompt
from tritonbox_triton.prepare_model import prepare_default_model
from tritonbox_triton.settings import DEFAULT_MODEL_NAME

MESSAGES: Any = [{"role": "user", "content": "What is the capital of France?"}]
TOKENS = 12
TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def checkpoint(triton_server: Any) -> tuple[Any, Any]:
    """The checkpoint the engine serves (the prepared default model), loaded by transformers."""
    folder = prepare_default_model(triton_server.settings.cache_dir / "models" / DEFAULT_MODEL_NAME)
    return engine_model(folder), AutoTokenizer.from_pretrained(folder)


def reference(checkpoint: tuple[Any, Any], prompt: str) -> tuple[list[int], torch.Tensor]:
    """Greedy ids from transformers and the log-softmax of the logits at each of them."""
    hf_model, tokenizer = checkpoint
    return greedy_generate(hf_model, encode_prompt(tokenizer, prompt, 4096), TOKENS)


def engine_prompt(api: httpx.Client, prediction_id: str) -> str:
    return str(api.get(f"/v1/predictions/{prediction_id}").json()["applied"]["engine_prompt"])


def test_chat_logprobs_equal_transformers(
    client: openai.OpenAI, model: str, api: httpx.Client, checkpoint: tuple[Any, Any]
) -> None:
    raw = client.chat.completions.with_raw_response.create(
        model=model, messages=MESSAGES, max_tokens=TOKENS, temperature=0,
        logprobs=True, top_logprobs=5,
    )  # fmt: skip
    answer = raw.parse()
    content = answer.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content is not None and len(content) == answer.usage.completion_tokens > 3  # type: ignore[union-attr]
    generated, logsoftmax = reference(
        checkpoint, engine_prompt(api, raw.headers["x-prediction-id"])
    )
    tokenizer = checkpoint[1]
    for position, (entry, token) in enumerate(zip(content, generated[: len(content)], strict=True)):
        assert entry.token == tokenizer.decode([token])
        assert entry.bytes == list(entry.token.encode())
        assert abs(entry.logprob - float(logsoftmax[position, token])) < TOLERANCE
        tops = [top.logprob for top in entry.top_logprobs]
        assert len(tops) == 5 and tops == sorted(tops, reverse=True)
        best = torch.topk(logsoftmax[position], 5)
        assert max(abs(a - float(b)) for a, b in zip(tops, best.values, strict=True)) < TOLERANCE
        # Greedy: the chosen token is the most likely one.
        assert entry.top_logprobs[0].token == entry.token
        assert entry.top_logprobs[0].logprob == entry.logprob
    # An answer the model ended itself has the end token's entry last; its text is not shown.
    ended = answer.choices[0].finish_reason == "stop"
    shown = content[:-1] if ended else content
    assert not ended or content[-1].token == tokenizer.eos_token  # <|im_end|>, its end id
    assert "".join(entry.token for entry in shown) == answer.choices[0].message.content


def test_streamed_logprobs_equal_the_whole_answers(client: openai.OpenAI, model: str) -> None:
    whole = client.chat.completions.create(
        model=model, messages=MESSAGES, max_tokens=TOKENS, temperature=0, logprobs=True,
        top_logprobs=2,
    )  # fmt: skip
    streamed = client.chat.completions.create(
        model=model, messages=MESSAGES, max_tokens=TOKENS, temperature=0, logprobs=True,
        top_logprobs=2, stream=True,
    )  # fmt: skip
    entries = [
        entry
        for chunk in streamed
        for choice in chunk.choices
        for entry in (choice.logprobs.content or [] if choice.logprobs else [])
    ]
    assert [e.model_dump() for e in entries] == [
        e.model_dump()
        for e in whole.choices[0].logprobs.content  # type: ignore[union-attr]
    ]


def test_completion_logprobs_shape(client: openai.OpenAI, model: str) -> None:
    prompt = "The capital of France is"
    answer = client.completions.create(
        model=model, prompt=prompt, max_tokens=6, temperature=0, logprobs=3
    )
    logprobs = answer.choices[0].logprobs
    assert logprobs is not None and logprobs.tokens and logprobs.token_logprobs
    assert len(logprobs.tokens) == len(logprobs.token_logprobs) == 6
    assert "".join(logprobs.tokens) == answer.choices[0].text
    assert logprobs.text_offset == [
        sum(len(t) for t in logprobs.tokens[:i]) for i in range(len(logprobs.tokens))
    ]
    for token, value, top in zip(
        logprobs.tokens, logprobs.token_logprobs, logprobs.top_logprobs or [], strict=True
    ):
        assert 3 <= len(top) <= 4 and top[token] == value == max(top.values())
    streamed = client.completions.create(
        model=model, prompt=prompt, max_tokens=6, temperature=0, logprobs=3, stream=True
    )
    tokens: list[str] = []
    offsets: list[int] = []
    for chunk in streamed:
        for choice in chunk.choices:
            if choice.logprobs is not None:
                tokens += choice.logprobs.tokens or []
                offsets += choice.logprobs.text_offset or []
    assert tokens == logprobs.tokens and offsets == logprobs.text_offset


def test_logprobs_refusals_name_the_field(client: openai.OpenAI, model: str) -> None:
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=2, top_logprobs=3)
    assert raised.value.body["param"] == "top_logprobs"  # type: ignore[index]
    with pytest.raises(openai.APIStatusError) as too_many:
        client.chat.completions.create(
            model=model, messages=MESSAGES, max_tokens=2, logprobs=True, top_logprobs=21
        )
    assert too_many.value.body["param"] == "top_logprobs"  # type: ignore[index]
    with pytest.raises(openai.APIStatusError) as too_many:
        client.completions.create(model=model, prompt="Hi", max_tokens=2, logprobs=6)
    assert too_many.value.body["param"] == "logprobs"  # type: ignore[index]
    # max_tokens 0 scores the prompt with echo only (vLLM: "max_tokens must be at least 1").
    with pytest.raises(openai.BadRequestError) as zero:
        client.completions.create(model=model, prompt="Hi", max_tokens=0)
    assert zero.value.body["param"] == "max_tokens"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as chat_echo:  # chat has no echo
        client.chat.completions.create(
            model=model, messages=MESSAGES, max_tokens=2, extra_body={"echo": True}
        )
    assert chat_echo.value.body["param"] == "echo"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as short:  # its limit, named as it was sent
        client.chat.completions.create(
            model=model, messages=MESSAGES, max_completion_tokens=2, extra_body={"min_tokens": 3}
        )
    assert short.value.body["param"] == "min_tokens"  # type: ignore[index]
    assert "at most max_completion_tokens (2)" in short.value.message
