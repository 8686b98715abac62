"""Replicate-style predictions against the real api, Triton and SQLite file."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import httpx
from httpx_sse import connect_sse

PROMPT = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
GREEDY = {"prompt": PROMPT, "max_tokens": 24, "temperature": 0}


def create(api: httpx.Client, **input: Any) -> dict[str, Any]:
    response = api.post("/v1/predictions", json={"input": input})
    assert response.status_code == 201, response.text
    body: dict[str, Any] = response.json()
    return body


def stream_events(api: httpx.Client, **input: Any) -> list[tuple[str, str]]:
    with connect_sse(
        api, "POST", "/v1/predictions", json={"input": input, "stream": True}
    ) as source:
        assert source.response.headers["x-prediction-id"]
        return [(event.event, event.data) for event in source.iter_sse()]


def test_a_prediction_is_answered_and_logged(api: httpx.Client) -> None:
    prediction = create(api, **GREEDY)
    assert prediction["status"] == "succeeded"
    assert "Paris" in prediction["output"]
    assert prediction["finish_reason"] in ("stop", "length")
    assert prediction["source"] == "api"
    assert prediction["input"] == GREEDY  # as sent
    applied = prediction["applied"]
    assert applied["top_p"] == 0.95 and applied["max_tokens"] == 24
    assert isinstance(applied["seed"], int)  # a seed is always recorded
    metrics = prediction["metrics"]
    assert metrics["prompt_tokens"] > 5
    assert 0 < metrics["completion_tokens"] <= 24
    assert 0 < metrics["time_to_first_token_s"] <= metrics["total_time_s"]
    assert metrics["tokens_per_second"] > 0
    assert len(prediction["id"]) >= 22  # ≥ 128 random bits, URL-safe
    stored = api.get(f"/v1/predictions/{prediction['id']}").json()
    assert stored["output"] == prediction["output"]
    assert stored["status"] == "succeeded"
    assert stored["urls"]["web"].endswith(f"/p/{prediction['id']}")


def test_streamed_text_equals_the_whole_output(api: httpx.Client) -> None:
    whole = create(api, **GREEDY)
    events = stream_events(api, **GREEDY)
    kinds = [kind for kind, _ in events]
    assert kinds[-1] == "done" and "error" not in kinds
    assert kinds.count("output") >= 2  # really streamed
    streamed = "".join(data for kind, data in events if kind == "output")
    assert streamed == whole["output"]
    done = json.loads(events[-1][1])
    assert done["output"] == streamed and done["status"] == "succeeded"


def test_unicode_streams_exactly(api: httpx.Client) -> None:
    prompt = (
        "<|im_start|>user\nRepeat exactly: 你好世界😀👍🏽 café naïve<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    params = {"prompt": prompt, "max_tokens": 40, "temperature": 0}
    whole = create(api, **params)["output"]
    streamed = "".join(d for k, d in stream_events(api, **params) if k == "output")
    assert streamed == whole
    assert "\ufffd" not in whole


def test_stop_words_are_cut_and_end_the_generation(api: httpx.Client) -> None:
    free = create(api, **GREEDY)["output"]
    assert "Paris" in free
    prediction = create(api, **GREEDY, stop_words_list=["Paris"])
    assert "Paris" not in prediction["output"]
    assert free.startswith(prediction["output"])
    assert prediction["finish_reason"] == "stop_word"
    streamed = stream_events(api, **GREEDY, stop_words_list=["Paris"])
    text = "".join(d for k, d in streamed if k == "output")
    assert text == prediction["output"]


def test_bad_words_never_appear(api: httpx.Client) -> None:
    prediction = create(api, **GREEDY, bad_words_list=["Paris"])
    assert prediction["status"] == "succeeded"
    assert "Paris" not in prediction["output"]


def test_cancel_keeps_the_partial_output(api: httpx.Client, api_server: Any) -> None:
    ids: list[str] = []
    texts: list[str] = []

    def consume() -> None:
        with (
            httpx.Client(base_url=api_server.url, timeout=60) as client,
            connect_sse(
                client,
                "POST",
                "/v1/predictions",
                json={
                    "input": {
                        "prompt": "Tell me a long story.",
                        "max_tokens": 400,
                        "min_tokens": 400,
                    },
                    "stream": True,
                },
            ) as source,
        ):
            ids.append(source.response.headers["x-prediction-id"])
            for event in source.iter_sse():
                texts.append(event.event)

    reader = threading.Thread(target=consume)
    reader.start()
    deadline = time.monotonic() + 60
    while texts.count("output") < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    started = time.monotonic()
    canceled = api.post(f"/v1/predictions/{ids[0]}/cancel").json()
    cancel_s = time.monotonic() - started
    reader.join(30)
    assert canceled["status"] == "canceled"
    assert canceled["finish_reason"] == "canceled"
    assert canceled["output"]  # the partial output is kept
    assert canceled["metrics"]["completion_tokens"] < 400
    assert texts[-1] == "done"
    assert cancel_s < 10


def test_list_pages_newest_first(api: httpx.Client) -> None:
    made = [create(api, prompt=f"Count to {n}.", max_tokens=2)["id"] for n in range(3)]
    page = api.get("/v1/predictions", params={"limit": 2}).json()
    assert [p["id"] for p in page["results"]] == made[::-1][:2]
    following = httpx.get(page["next"]).json()
    assert following["results"][0]["id"] == made[0]
    only_api = api.get("/v1/predictions", params={"source": "api", "limit": 100}).json()
    assert all(p["source"] == "api" for p in only_api["results"])


def test_permalink_page(api: httpx.Client) -> None:
    prediction = create(api, prompt="Say <b>hi</b> & bye", max_tokens=4)
    page = api.get(f"/p/{prediction['id']}")
    assert page.status_code == 200
    assert "text/html" in page.headers["content-type"]
    assert "Say &lt;b&gt;hi&lt;/b&gt; &amp; bye" in page.text
    assert "<b>hi</b>" not in page.text
    assert f"?p={prediction['id']}" in page.text
    assert api.get("/p/unknown-id").status_code == 404


def test_unknown_prediction_is_404(api: httpx.Client) -> None:
    response = api.get("/v1/predictions/nope")
    assert response.status_code == 404
    assert "nope" in response.json()["error"]["message"]
