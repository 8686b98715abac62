"""The ensemble on the real tritonserver with the cpu engine, over real gRPC streams."""

from __future__ import annotations

import asyncio
import contextlib
import queue
import time
import urllib.request
from collections.abc import Coroutine
from functools import partial
from typing import Any, TypeVar

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from transformers import PreTrainedModel, PreTrainedTokenizerBase
from tritonbox_testing.reference import greedy_ids

from tritonbox_common.client import (
    Generation,
    GenerationRequest,
    TritonLLMClient,
    TritonRequestError,
)

pytestmark = pytest.mark.server
T = TypeVar("T")
EOS = 2
PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Why is the sky blue?",
]


def run(coroutine: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coroutine)


def chat(tokenizer: PreTrainedTokenizerBase, text: str) -> str:
    return str(
        tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
        )
    )


def reference(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, prompt: str, max_tokens: int
) -> list[int]:
    return greedy_ids(model, tokenizer(prompt).input_ids, max_tokens, EOS)


async def generate_all(url: str, *requests: GenerationRequest) -> list[Generation | BaseException]:
    client = TritonLLMClient(url)
    try:
        return await asyncio.gather(*(client.generate(r) for r in requests), return_exceptions=True)
    finally:
        await client.close()


def generate(url: str, request: GenerationRequest) -> Generation:
    (result,) = run(generate_all(url, request))
    if isinstance(result, BaseException):
        raise result
    return result


# TensorRT-LLM backend's active-request gauge, which the cpu engine reports too.
ACTIVE = 'nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="active"'


def metric(metrics_url: str, line_prefix: str) -> float:
    with urllib.request.urlopen(metrics_url, timeout=5) as response:
        for line in response.read().decode().splitlines():
            if line.startswith(line_prefix):
                return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_greedy_output_equals_generate_token_for_token(
    triton_server: Any, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase
) -> None:
    for text in PROMPTS:
        prompt = chat(tokenizer, text)
        result = generate(
            triton_server.grpc_url, GenerationRequest(prompt, max_tokens=32, stream=False)
        )
        assert result.ids == reference(model, tokenizer, prompt, 32)
        assert result.text == tokenizer.decode(result.ids, skip_special_tokens=True)


def test_streamed_tokens_equal_the_non_streamed_result(
    triton_server: Any, tokenizer: PreTrainedTokenizerBase
) -> None:
    prompt = chat(tokenizer, PROMPTS[1])
    whole = generate(triton_server.grpc_url, GenerationRequest(prompt, max_tokens=24, stream=False))
    streamed = generate(
        triton_server.grpc_url, GenerationRequest(prompt, max_tokens=24, stream=True)
    )
    assert streamed.ids == whole.ids
    assert streamed.chunks >= len(whole.ids)  # one response per token, then the final one
    assert streamed.time_to_first_token_s is not None


def test_stop_word_ends_and_bad_word_never_appears(
    triton_server: Any, tokenizer: PreTrainedTokenizerBase
) -> None:
    prompt = chat(tokenizer, PROMPTS[0])
    stopped = generate(triton_server.grpc_url, GenerationRequest(prompt, 32, stop_words=["Paris"]))
    assert str(tokenizer.decode(stopped.ids)).endswith("Paris")
    banned = generate(
        triton_server.grpc_url, GenerationRequest(prompt, 32, bad_words=["Paris", "paris"])
    )
    assert "paris" not in str(tokenizer.decode(banned.ids)).lower()
    assert banned.ids


def test_mixed_concurrent_batch_with_a_bad_request(
    triton_server: Any, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase
) -> None:
    story = chat(tokenizer, "Tell me a story about a dragon.")
    sampled = {"temperature": 1.1, "top_k": 80, "top_p": 0.95, "seed": 42}
    results = run(
        generate_all(
            triton_server.grpc_url,
            GenerationRequest(chat(tokenizer, PROMPTS[0]), 24),
            GenerationRequest(story, 24, sampling=sampled),
            GenerationRequest(story, 24, sampling=sampled),
            GenerationRequest(story, 24, sampling={**sampled, "seed": 7}),
            GenerationRequest(story, 24, sampling={"top_p": 2.0}),
            GenerationRequest(chat(tokenizer, PROMPTS[2]), 24, sampling={"min_tokens": 20}),
            GenerationRequest(chat(tokenizer, PROMPTS[1]), 24),
        )
    )
    greedy, seeded_a, seeded_b, other_seed, bad, min_tokens, greedy_2 = results
    assert isinstance(bad, TritonRequestError) and "top_p" in str(bad) and "<= 1.0" in str(bad)
    for result in (greedy, seeded_a, seeded_b, other_seed, min_tokens, greedy_2):
        assert isinstance(result, Generation)
    assert isinstance(greedy, Generation) and isinstance(greedy_2, Generation)
    assert greedy.ids == reference(model, tokenizer, chat(tokenizer, PROMPTS[0]), 24)
    assert greedy_2.ids == reference(model, tokenizer, chat(tokenizer, PROMPTS[1]), 24)
    assert isinstance(seeded_a, Generation) and isinstance(seeded_b, Generation)
    assert isinstance(other_seed, Generation) and isinstance(min_tokens, Generation)
    assert seeded_a.ids == seeded_b.ids != other_seed.ids
    assert len(min_tokens.ids) >= 20


def test_prompt_longer_than_max_input_is_refused_and_the_server_carries_on(
    triton_server: Any, tokenizer: PreTrainedTokenizerBase
) -> None:
    limit = triton_server.settings.max_input_len
    with pytest.raises(TritonRequestError, match=str(limit)):
        generate(triton_server.grpc_url, GenerationRequest("hello " * (limit + 10), 8))
    # The engine checks too, for clients that call the tensorrt_llm step directly.
    error = stream_tensorrt_llm(triton_server.grpc_url, list(range(5, limit + 15)), 4)
    assert error is not None and f"max input length of {limit}" in error
    assert generate(triton_server.grpc_url, GenerationRequest(chat(tokenizer, PROMPTS[0]), 8)).ids


def stream_tensorrt_llm(url: str, ids: list[int], max_tokens: int) -> str | None:
    """Send input ids straight to the tensorrt_llm step; return its error message, if any."""
    responses: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    inputs = []
    for name, array in (
        ("input_ids", np.array([ids], dtype=np.int32)),
        ("input_lengths", np.array([[len(ids)]], dtype=np.int32)),
        ("request_output_len", np.array([[max_tokens]], dtype=np.int32)),
    ):
        tensor = grpcclient.InferInput(name, list(array.shape), "INT32")
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    client.start_stream(
        callback=partial(lambda q, result, error: q.put((result, error)), responses)
    )
    try:
        client.async_stream_infer("tensorrt_llm", inputs, enable_empty_final_response=True)
        while True:
            result, error = responses.get(timeout=60)
            if error is not None:
                return str(error)
            if result.get_response().parameters["triton_final_response"].bool_param:
                return None
    finally:
        client.stop_stream()
        client.close()


def test_client_cancellation_stops_generation(
    triton_server: Any, tokenizer: PreTrainedTokenizerBase
) -> None:
    metrics = triton_server.metrics_url
    # Start idle: a request orphaned by an earlier test (its client killed) may still finish.
    deadline = time.monotonic() + 120
    while metric(metrics, ACTIVE) and time.monotonic() < deadline:
        time.sleep(0.5)
    cancelled_metric = 'tritonbox_engine_finished_requests_total{outcome="cancelled"}'
    before = metric(metrics, cancelled_metric)

    async def read_three_then_leave() -> int:
        client = TritonLLMClient(triton_server.grpc_url)
        try:
            seen = 0
            request = GenerationRequest(
                chat(tokenizer, "Write a long essay about rivers."),
                500,
                sampling={"min_tokens": 500},
            )
            async with contextlib.aclosing(client.stream(request)) as chunks:
                async for chunk in chunks:
                    seen += len(chunk.ids)
                    if seen >= 3:
                        break  # closing the stream early cancels the request
            return seen
        finally:
            await client.close()

    assert run(read_three_then_leave()) == 3
    deadline = time.monotonic() + 10
    while metric(metrics, cancelled_metric) < before + 1 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert metric(metrics, cancelled_metric) == before + 1
    assert metric(metrics, ACTIVE) == 0
    # The engine publishes its counters every FULL_UPDATE_S (0.5 s, cpu_model/metrics.py)
    # and its active gauge at once: read the token count after one interval, then check that it
    # no longer moves.
    time.sleep(0.5 + 0.2)
    tokens = metric(metrics, "tritonbox_engine_generated_tokens_total")
    time.sleep(1.0)
    assert (
        metric(metrics, "tritonbox_engine_generated_tokens_total") == tokens
    )  # nothing still decoding
    assert generate(triton_server.grpc_url, GenerationRequest(chat(tokenizer, PROMPTS[0]), 8)).ids
