"""/v1/completions' four prompt forms through the official `openai` SDK against the live api on
the cpu engine (OpenAI's and vLLM's): a string, a list of strings, a list of token ids, a list of
lists of them. Token ids reach the engine as sent; each prompt of a list is its own `n` choices,
indexed prompt-major; the count is bounded."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest
from transformers import AutoTokenizer

from tritonbox_api.protocol.openai import MAX_PROMPT_CHOICES
from tritonbox_triton.prepare_model import prepare_default_model
from tritonbox_triton.settings import DEFAULT_MODEL_NAME

PROMPTS = ["The capital of France is", "One, two, three,"]


@pytest.fixture(scope="module")
def tokenizer(triton_server: Any) -> Any:
    folder = prepare_default_model(triton_server.settings.cache_dir / "models" / DEFAULT_MODEL_NAME)
    return AutoTokenizer.from_pretrained(folder)


def greedy(client: openai.OpenAI, model: str, prompt: Any, **extra: Any) -> Any:
    return client.completions.create(
        model=model, prompt=prompt, max_tokens=6, temperature=0, **extra
    )


def test_a_token_id_prompt_answers_as_its_text(
    client: openai.OpenAI, model: str, tokenizer: Any, api: httpx.Client
) -> None:
    ids = tokenizer.encode(PROMPTS[0])
    by_text, by_ids = greedy(client, model, PROMPTS[0]), greedy(client, model, ids)
    assert by_ids.choices[0].text == by_text.choices[0].text
    assert by_ids.usage is not None and by_ids.usage.prompt_tokens == len(ids)
    raw = client.completions.with_raw_response.create(
        model=model, prompt=ids, max_tokens=1, temperature=0
    )
    row = api.get(f"/v1/predictions/{raw.headers['x-prediction-id']}").json()
    assert row["input"]["prompt"] == ids and row["applied"]["engine_prompt"] == PROMPTS[0]


def test_echo_scores_the_ids_as_sent(client: openai.OpenAI, model: str, tokenizer: Any) -> None:
    """Ids that tokenising their text would not give (" Paris" as " Par" + "is") are scored as
    they are: an evaluation harness scores the tokens it chose."""
    pieces = ("The capital of France is", " Par", "is")
    ids = [i for piece in pieces for i in tokenizer.encode(piece, add_special_tokens=False)]
    assert tokenizer.encode(tokenizer.decode(ids)) != ids  # the premise
    answer = client.completions.create(
        model=model, prompt=ids, max_tokens=0, echo=True, logprobs=1, temperature=0
    )
    logprobs = answer.choices[0].logprobs
    assert logprobs is not None and logprobs.tokens is not None
    assert logprobs.tokens == [tokenizer.decode([i]) for i in ids]
    assert answer.choices[0].text == tokenizer.decode(ids)
    assert answer.usage is not None and answer.usage.prompt_tokens == len(ids)


def test_a_list_of_prompts_gives_each_its_n_choices_prompt_major(
    client: openai.OpenAI, model: str, tokenizer: Any
) -> None:
    alone = [greedy(client, model, prompt).choices[0].text for prompt in PROMPTS]
    for form in (PROMPTS, [tokenizer.encode(prompt) for prompt in PROMPTS]):
        answer = greedy(client, model, form, n=2, logprobs=1)
        assert [choice.index for choice in answer.choices] == [0, 1, 2, 3]
        assert [choice.text for choice in answer.choices] == [alone[0]] * 2 + [alone[1]] * 2
        for choice in answer.choices:  # each choice its own log-probs
            assert choice.logprobs is not None and choice.logprobs.tokens is not None
            assert "".join(choice.logprobs.tokens).startswith(choice.text)
        counts = [len(tokenizer.encode(prompt)) for prompt in PROMPTS]
        assert answer.usage is not None and answer.usage.prompt_tokens == sum(counts)
    streamed = client.completions.create(
        model=model, prompt=PROMPTS, max_tokens=6, temperature=0, stream=True
    )
    texts = ["", ""]
    for chunk in streamed:
        for choice in chunk.choices:
            texts[choice.index] += choice.text
    assert texts == alone


def test_sampled_choices_of_each_prompt_are_seeded_as_alone(
    client: openai.OpenAI, model: str
) -> None:
    sampled: dict[str, Any] = dict(max_tokens=8, temperature=1.0, seed=7)
    both = client.completions.create(model=model, prompt=PROMPTS, n=2, **sampled)
    for index, prompt in enumerate(PROMPTS):
        alone = client.completions.create(model=model, prompt=prompt, n=2, **sampled)
        mine = both.choices[2 * index : 2 * index + 2]
        assert [c.text for c in mine] == [c.text for c in alone.choices]


def test_prompts_out_of_bounds_are_refused(
    client: openai.OpenAI, model: str, tokenizer: Any
) -> None:
    vocabulary = len(tokenizer)
    for prompt, param in (([[1, 2], [3, vocabulary]], "prompt[1]"), ([vocabulary], "prompt")):
        with pytest.raises(openai.BadRequestError) as raised:
            greedy(client, model, prompt)
        assert raised.value.body["param"] == param  # type: ignore[index]
        assert f"0 to {vocabulary - 1}" in raised.value.body["message"]  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as raised:
        greedy(client, model, ["a"] * (MAX_PROMPT_CHOICES // 2 + 1), n=2)
    assert raised.value.body["param"] == "prompt"  # type: ignore[index]
    assert str(MAX_PROMPT_CHOICES) in raised.value.body["message"]  # type: ignore[index]
    with pytest.raises(openai.BadRequestError):
        greedy(client, model, [])
