"""The synthetic engine (ENGINE=synthetic, benchmarks only) on its own real tritonserver."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from transformers import PreTrainedTokenizerBase

from tritonbox_common.client import (
    Generation,
    GenerationRequest,
    TritonLLMClient,
    TritonRequestError,
)

pytestmark = pytest.mark.server
INTERVAL_S = 0.005  # paced, so that a long request is still running when it is stopped
SENTENCE = "The quick brown fox jumps over the lazy dog"


@pytest.fixture(scope="module")
def synthetic(triton_launcher: Callable[..., Any]) -> Iterator[Any]:
    with triton_launcher(
        engine="synthetic", synthetic_token_interval_s=INTERVAL_S, max_output_len=4096
    ) as running:
        yield running


async def generate_all(url: str, *requests: GenerationRequest) -> list[Generation]:
    client = TritonLLMClient(url)
    try:
        return await asyncio.gather(*(client.generate(request) for request in requests))
    finally:
        await client.close()


def test_streams_exactly_max_tokens_of_real_text(
    synthetic: Any, tokenizer: PreTrainedTokenizerBase
) -> None:
    # An end_id that the text contains must not end the request early.
    end_id = int(tokenizer.encode(" fox")[0])
    request = GenerationRequest("Hello", max_tokens=60, sampling={"end_id": end_id})
    started = time.perf_counter()
    (result,) = asyncio.run(generate_all(synthetic.grpc_url, request))
    assert len(result.ids) == 60
    assert end_id in result.ids
    assert 60 <= result.chunks <= 61  # one response per token (+ an empty final one)
    text = tokenizer.decode(result.ids, skip_special_tokens=True)
    assert SENTENCE in text
    assert result.text == text  # postprocessing decoded every token on its own
    assert time.perf_counter() - started >= 59 * INTERVAL_S


def test_not_streamed_is_one_response_with_every_id(
    synthetic: Any, tokenizer: PreTrainedTokenizerBase
) -> None:
    request = GenerationRequest("Hello", max_tokens=40, stream=False)
    (result,) = asyncio.run(generate_all(synthetic.grpc_url, request))
    assert len(result.ids) == 40
    assert result.chunks <= 2  # the response, and the empty final one where it comes apart
    assert SENTENCE in result.text


def test_a_bad_request_is_refused_and_the_server_carries_on(synthetic: Any) -> None:
    # Validated by the engine step itself, as the cpu engine does (preprocessing passes it on).
    bad = GenerationRequest("Hi", max_tokens=5, sampling={"temperature": -1.0})
    with pytest.raises(TritonRequestError, match=r"temperature: must be >= 0\.0"):
        asyncio.run(generate_all(synthetic.grpc_url, bad))
    (result,) = asyncio.run(generate_all(synthetic.grpc_url, GenerationRequest("Hi", 3)))
    assert len(result.ids) == 3


def test_stop_cancels_a_running_request(synthetic: Any) -> None:
    # 4000 tokens take 20 s at INTERVAL_S; the stop must end the stream long before.
    async def stop_after_three() -> int:
        client = TritonLLMClient(synthetic.grpc_url)
        request = GenerationRequest("Hello", max_tokens=4000)
        received = 0
        try:
            with pytest.raises(TritonRequestError, match="cancelled"):
                async for chunk in client.stream(request):
                    received += len(chunk.ids)
                    if received == 3:
                        await client.stop(request.request_id)
        finally:
            await client.close()
        return received

    started = time.perf_counter()
    received = asyncio.run(stop_after_three())
    assert 3 <= received < 1000
    assert time.perf_counter() - started < 10


def test_64_concurrent_streams_all_complete(synthetic: Any) -> None:
    requests = [GenerationRequest(f"Request {i}", max_tokens=64) for i in range(64)]
    started = time.perf_counter()
    results = asyncio.run(generate_all(synthetic.grpc_url, *requests))
    elapsed = time.perf_counter() - started
    assert [len(result.ids) for result in results] == [64] * 64
    assert all(SENTENCE in result.text for result in results)
    # Served concurrently: one after another they would take 64 x 64 x INTERVAL_S = 20 s.
    assert elapsed < 64 * 64 * INTERVAL_S / 2, elapsed
