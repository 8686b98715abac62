"""The engine's limits as numbers: the bounds the api checks requests against."""

from __future__ import annotations

import httpx


def test_limits_are_the_engines_numbers(api: httpx.Client) -> None:
    limits = api.get("/v1/limits").json()
    assert limits["max_output_tokens"] == 512 and limits["max_input_tokens"] > 0
    assert limits["max_beam_width"] == 1
    assert (limits["max_words"], limits["max_word_chars"]) == (32, 256)
    assert limits["max_word_tokens"] == 32
    assert limits["model"] == api.get("/v1/models").json()["data"][0]["id"]
    # The limit shown is the one enforced: one token more is refused.
    too_long = {"prompt": "Hi", "max_tokens": limits["max_output_tokens"] + 1}
    assert api.post("/predict", json=too_long).status_code == 422


def test_the_word_token_limit_is_in_the_openapi_schema(api: httpx.Client) -> None:
    tokens = api.get("/v1/limits").json()["max_word_tokens"]
    schemas = api.get("/openapi.json").json()["components"]["schemas"]
    for model, field in [
        ("GenerationInput", "stop_words_list"),
        ("GenerationInput", "bad_words_list"),
        ("CompletionRequest", "stop"),
        ("ChatCompletionRequest", "bad_words"),
    ]:
        assert f"≤ {tokens} tokens each" in schemas[model]["properties"][field]["description"]
