"""The GPU smoke test's checks: requests to the api of a running GPU stack (scripts/gpu_smoke).

Each check sends real requests through the whole appliance (api -> Triton ensemble -> the
TensorRT-LLM engine) and raises SmokeFailure with what it saw. The request bodies are built here
once; the dry run validates them against the api's own request models, so a changed api contract
fails CI rather than the first GPU run.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx

PROMPT = "The capital of France is"
CHAT = [{"role": "user", "content": "Name three colours, one word each."}]
# Long enough that a cancelled request is surely still running when the cancel arrives.
LONG_PROMPT = "Write a long story about a lighthouse keeper and the sea."


class SmokeFailure(AssertionError):
    """A check failed; the message says what was expected and what came back."""


def completion(model: str, **extra: Any) -> dict[str, Any]:
    """A greedy /v1/completions body (temperature 0 = greedy in TritonBox)."""
    return {"model": model, "prompt": PROMPT, "max_tokens": 32, "temperature": 0.0} | extra


def chat(model: str) -> dict[str, Any]:
    return {"model": model, "messages": CHAT, "max_tokens": 64, "temperature": 0.0}


def long_prediction(max_tokens: int) -> dict[str, Any]:
    return {
        "input": {"prompt": LONG_PROMPT, "max_tokens": max_tokens, "temperature": 0.0},
        "stream": True,
    }


@dataclass
class Api:
    client: httpx.Client

    def model(self) -> str:
        models = self.client.get("/v1/models").raise_for_status().json()
        return str(models["data"][0]["id"])

    def complete(self, body: dict[str, Any]) -> dict[str, Any]:
        answer: dict[str, Any] = (
            self.client.post("/v1/completions", json=body).raise_for_status().json()
        )
        return answer

    def events(self, path: str, body: dict[str, Any]) -> Iterator[tuple[str, str]]:
        """(event, data) of a server-sent-event answer, until the server ends it."""
        with self.client.stream("POST", path, json=body) as response:
            response.raise_for_status()
            yield "headers", json.dumps(dict(response.headers))
            event = "message"
            for line in response.iter_lines():
                if line.startswith("event:"):
                    event = line.removeprefix("event:").strip()
                elif line.startswith("data:"):
                    yield event, line.removeprefix("data:").strip()
                    event = "message"


def expect(condition: bool, message: str) -> None:
    if not condition:
        raise SmokeFailure(message)


def check_greedy(api: Api, model: str, reference: str | None) -> str:
    """Two greedy answers are the same text; with a reference (transformers on the same
    checkpoint, fp32 on CPU), the engine's fp16 answer starts the same way."""
    first = api.complete(completion(model))
    second = api.complete(completion(model))
    text = first["choices"][0]["text"]
    expect(bool(text.strip()), f"greedy answer is empty: {first}")
    expect(text == second["choices"][0]["text"], f"greedy differs: {text!r} / {second}")
    if reference is not None:
        # fp16 vs fp32 may part ways late in an answer, not in its first words.
        same = text.split()[:3] == reference.split()[:3]
        expect(same, f"GPU {text!r} does not start like reference {reference!r}")
    return str(text)


def check_streaming(api: Api, model: str, greedy: str) -> int:
    """The streamed chunks of the same greedy request add up to the same text."""
    chunks: list[str] = []
    done = False
    for event, data in api.events("/v1/completions", completion(model, stream=True)):
        if event == "headers":
            continue
        if data == "[DONE]":
            done = True
            break
        chunks.append(json.loads(data)["choices"][0]["text"])
    expect(done, "the stream did not end with [DONE]")
    expect(len([c for c in chunks if c]) >= 2, f"expected several chunks, got {chunks}")
    expect("".join(chunks) == greedy, f"streamed {''.join(chunks)!r} != greedy {greedy!r}")
    return len(chunks)


def stop_word(greedy: str) -> str:
    """A word of the greedy answer after its first one: the answer must end before it."""
    words = greedy.split()
    expect(len(words) >= 3, f"greedy answer too short for a stop word: {greedy!r}")
    return words[2]


def check_stop_words(api: Api, model: str, greedy: str) -> str:
    word = stop_word(greedy)
    answer = api.complete(completion(model, stop=[word]))
    choice = answer["choices"][0]
    expected = greedy[: greedy.index(word)]
    expect(choice["text"] == expected, f"stop {word!r}: {choice['text']!r} != {expected!r}")
    expect(choice["finish_reason"] == "stop", f"stop {word!r}: finish_reason {choice}")
    return word


def check_chat_ends_its_turn(api: Api, model: str) -> str:
    """A chat answer ends on the model's end of turn, not at max_tokens."""
    answer = api.client.post("/v1/chat/completions", json=chat(model)).raise_for_status().json()
    choice = answer["choices"][0]
    expect(bool(choice["message"]["content"].strip()), f"empty chat answer: {answer}")
    expect(choice["finish_reason"] == "stop", f"chat ran to {choice['finish_reason']}: {answer}")
    return str(choice["message"]["content"])


def check_cancellation(api: Api, max_tokens: int, timeout_s: float = 30.0) -> int:
    """A streamed prediction cancelled after its first output ends as canceled, early."""
    prediction_id = ""
    outputs = 0
    for event, data in api.events("/v1/predictions", long_prediction(max_tokens)):
        if event == "headers":
            prediction_id = json.loads(data).get("x-prediction-id", "")
            expect(bool(prediction_id), "no X-Prediction-Id header")
        elif event == "output":
            outputs += 1
            if outputs == 1:
                api.client.post(f"/v1/predictions/{prediction_id}/cancel").raise_for_status()
        elif event == "done":
            break
    deadline = time.monotonic() + timeout_s
    while True:
        final = api.client.get(f"/v1/predictions/{prediction_id}").raise_for_status().json()
        if final["status"] not in ("starting", "processing") or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    expect(final["status"] == "canceled", f"cancelled prediction ended as {final['status']}")
    tokens = int(final["metrics"].get("completion_tokens") or 0)
    expect(tokens < max_tokens, f"ran to the end: {final}")
    return tokens


CHECKS: dict[str, Callable[..., object]] = {
    "greedy": check_greedy,
    "streaming": check_streaming,
    "stop words": check_stop_words,
    "chat end of turn": check_chat_ends_its_turn,
    "cancellation": check_cancellation,
}


def request_bodies(model: str, max_tokens: int) -> dict[str, tuple[str, dict[str, Any]]]:
    """Every body the checks send, by the api model that must accept it (for the dry run)."""
    return {
        "greedy": ("CompletionRequest", completion(model)),
        "streaming": ("CompletionRequest", completion(model, stream=True)),
        "stop words": ("CompletionRequest", completion(model, stop=["Paris"])),
        "chat end of turn": ("ChatCompletionRequest", chat(model)),
        "cancellation": ("PredictionCreate", long_prediction(max_tokens)),
    }
