"""The form's values <-> the api's `input`, and restoring a saved prediction."""

from __future__ import annotations

import re

import pytest

from tritonbox_common import parameters as p
from tritonbox_playground.api_client import EngineLimits, PlaygroundError, PredictionView
from tritonbox_playground.form import (
    CHAT_MODE,
    FIELDS,
    PROMPT_MODE,
    defaults,
    from_prediction,
    generation_input,
    hint,
    missing_prompt,
    plain_error,
    prompt_hint,
    text_from_words,
    words_from_text,
)


def test_the_form_starts_from_the_apis_defaults_and_hints() -> None:
    values = defaults()
    assert set(values) == set(FIELDS)
    for parameter in (p.MAX_TOKENS, p.TEMPERATURE, p.TOP_P, p.TOP_K, p.REPETITION_PENALTY):
        assert values[parameter.name] == parameter.default
    assert hint(p.TEMPERATURE) == f"{p.TEMPERATURE.hint} From 0 to 2."


ENGINE = EngineLimits(
    max_input_tokens=1024, max_output_tokens=512, max_words=32, max_word_chars=256
)


@pytest.mark.parametrize("limits", [None, ENGINE])
def test_every_limit_on_the_page_is_a_number_a_person_can_act_on(
    limits: EngineLimits | None,
) -> None:
    shown = [parameter for parameter in p.ALL_PARAMETERS if parameter.name in FIELDS]
    assert len(shown) == len(FIELDS) - 4  # all but mode, system prompt, prompt and adapter
    for parameter in shown:
        text = hint(parameter, limits=limits)
        assert "≤" not in text and "≥" not in text, text
        assert not re.search(r"[A-Z]{3,}_[A-Z]{3,}", text), text  # no setting's name
        assert not re.search(r"\d{6,}", text.replace(",", "")), text  # no 19-digit bound
    assert hint(p.MAX_TOKENS, limits=ENGINE).endswith("From 1 to 512 on this engine.")
    assert "From 0 to Max tokens." in hint(p.MIN_TOKENS, limits=limits)
    assert "e.g. 42" in hint(p.SEED)
    assert "Up to 32 words, each up to 256 characters." in hint(p.STOP_WORDS, limits=limits)
    assert prompt_hint(ENGINE) == (
        "Up to 1,024 tokens (about 768 words) on this engine, system prompt included."
    )


def test_a_bigger_engine_shows_bigger_limits() -> None:
    bigger = ENGINE.model_copy(update={"max_output_tokens": 4096, "max_input_tokens": 32768})
    assert hint(p.MAX_TOKENS, limits=bigger).endswith("From 1 to 4,096 on this engine.")
    assert "Up to 32,768 tokens" in prompt_hint(bigger)


def test_an_empty_prompt_or_message_sends_nothing_and_says_why() -> None:
    assert missing_prompt(defaults() | {"prompt": "Hi"}) is None
    assert "prompt first" in (missing_prompt(defaults() | {"prompt": "  \n"}) or "")
    chat = defaults() | {"mode": CHAT_MODE, "system_prompt": "Be brief.", "prompt": ""}
    assert "Your message" in (missing_prompt(chat) or "")


def test_the_apis_messages_use_the_pages_labels() -> None:
    message = "max_tokens: must be at most 512 (MAX_OUTPUT_LEN), got 100000"
    assert plain_error(message) == "Max tokens: must be at most 512 (MAX_OUTPUT_LEN), got 100000"
    assert plain_error("the api at x cannot be reached") == "the api at x cannot be reached"


def test_a_prompt_becomes_the_apis_input() -> None:
    values = defaults() | {
        "prompt": "The capital of France is",
        "max_tokens": 12.0,  # gradio may hand integers over as floats
        "temperature": 0,
        "seed": " 42 ",
        "stop_words_list": ".\n\n  Paris \n",
        "bad_words_list": "",
    }
    body = generation_input(values)
    assert body["prompt"] == "The capital of France is"
    assert body["max_tokens"] == 12 and isinstance(body["max_tokens"], int)
    assert body["seed"] == 42
    assert body["stop_words_list"] == [".", "Paris"]
    assert "bad_words_list" not in body and "messages" not in body


def test_a_chat_sends_the_system_prompt_and_earlier_messages() -> None:
    values = defaults() | {"mode": CHAT_MODE, "system_prompt": "Be brief.", "prompt": "Hi"}
    earlier = [{"role": "user", "content": "A"}, {"role": "assistant", "content": "B"}]
    assert generation_input(values, earlier)["messages"] == [
        {"role": "system", "content": "Be brief."},
        *earlier,
        {"role": "user", "content": "Hi"},
    ]
    assert generation_input(values | {"system_prompt": " "})["messages"] == [
        {"role": "user", "content": "Hi"}
    ]


def test_an_empty_seed_is_random_and_a_bad_one_is_explained() -> None:
    assert "seed" not in generation_input(defaults() | {"prompt": "x", "seed": ""})
    with pytest.raises(PlaygroundError, match="Seed: write a whole number"):
        generation_input(defaults() | {"prompt": "x", "seed": "-3"})
    with pytest.raises(PlaygroundError, match="Top-k: write a number, not 'many'"):
        generation_input(defaults() | {"prompt": "x", "top_k": "many"})


def test_words_escape_line_breaks_and_round_trip() -> None:
    words = ["\n", "a\tb", "back\\slash", "end."]
    text = text_from_words(words)
    assert text == "\\n\na\\tb\nback\\\\slash\nend."
    assert words_from_text(text) == words


def test_restoring_prefers_the_applied_parameters() -> None:
    prediction = PredictionView(
        id="x",
        status="succeeded",
        input={"prompt": "Hi", "max_tokens": 9},
        applied={
            "prompt": "Hi",
            "messages": None,
            "max_tokens": 9,
            "temperature": 0.0,
            "seed": 2**63 - 2,  # too large for a browser's number: kept as text
            "stop_words_list": ["\n"],
            "bad_words_list": [],
            "engine_prompt": "Hi",
        },
    )
    restored = from_prediction(prediction)
    assert restored.values["mode"] == PROMPT_MODE
    assert restored.values["max_tokens"] == 9 and restored.values["temperature"] == 0.0
    assert restored.values["seed"] == str(2**63 - 2)
    assert restored.values["stop_words_list"] == "\\n"
    assert generation_input(restored.values)["seed"] == 2**63 - 2


def test_restoring_falls_back_to_the_input_and_splits_a_chat() -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "A"},
        {"role": "assistant", "content": "B"},
        {"role": "user", "content": "C"},
    ]
    restored = from_prediction(
        PredictionView(id="x", status="failed", input={"messages": messages, "top_k": 3})
    )
    assert restored.values["mode"] == CHAT_MODE
    assert restored.values["system_prompt"] == "Be brief."
    assert restored.values["prompt"] == "C"
    assert restored.values["top_k"] == 3
    assert restored.values["temperature"] == p.TEMPERATURE.default
    assert restored.earlier == messages[1:3]
    assert generation_input(restored.values, restored.earlier)["messages"] == messages


def test_json_output_sends_the_json_guide_and_comes_back_on() -> None:
    values = defaults() | {"prompt": "A cat as JSON:"}
    assert values["guided_decoding"] is False
    assert "guided_decoding" not in generation_input(values)
    body = generation_input(values | {"guided_decoding": True})
    assert body["guided_decoding"] == {"guide_type": "json"}
    applied = {"prompt": "A cat as JSON:", "guided_decoding": {"guide_type": "json", "guide": None}}
    prediction = PredictionView(id="x", status="succeeded", input=body, applied=applied)
    assert from_prediction(prediction).values["guided_decoding"] is True
    regex = {"guide_type": "regex", "guide": "[0-9]+"}
    other = PredictionView(
        id="y", status="succeeded", applied={"prompt": "1", "guided_decoding": regex}
    )
    assert from_prediction(other).values["guided_decoding"] is False
