"""Seed-compatible /predict."""

from __future__ import annotations

import httpx

PROMPT = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"


def test_predict_streams_plain_text_by_default(api: httpx.Client) -> None:
    body = {"prompt": PROMPT, "max_tokens": 20, "temperature": 0, "stop_words_list": ["."]}
    with api.stream("POST", "/predict", json=body) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/plain")
        prediction_id = response.headers["x-prediction-id"]
        assert f"/p/{prediction_id}" in response.headers["link"]
        text = "".join(response.iter_text())
    assert "Paris" in text and "." not in text
    whole = api.post("/predict", json={**body, "stream": False}).json()
    assert whole["output"] == text
    assert whole["finish_reason"] == "stop_word"
    stored = api.get(f"/v1/predictions/{prediction_id}").json()
    assert stored["source"] == "predict" and stored["output"] == text


def test_predict_accepts_the_truss_fields(api: httpx.Client) -> None:
    body = {
        "prompt": "Hello",
        "max_tokens": 5,
        "beam_width": 1,
        "bad_words_list": ["World"],
        "stop_words_list": ["\n\n"],
        "repetition_penalty": 1.1,
        "stream": False,
    }
    response = api.post("/predict", json=body)
    assert response.status_code == 200, response.text
    assert response.json()["status"] == "succeeded"
