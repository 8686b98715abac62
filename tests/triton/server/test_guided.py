"""Guided decoding through the real tritonserver (cpu flavour) with TensorRT-LLM's tensors, sent
to the ensemble as NVIDIA's clients send them: guided rows follow their guide, a bad guide fails
its own request alone, and an unguided row beside them is the model's own greedy answer."""

from __future__ import annotations

import asyncio
import json
import re
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
GREEDY: dict[str, float | int | bool] = {"top_k": 1}
SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 20}, "year": {"type": "integer"}},
    "required": ["city", "year"],
    "additionalProperties": False,
}


def chat(tokenizer: PreTrainedTokenizerBase, text: str) -> str:
    messages = [{"role": "user", "content": text}]
    return str(tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))


def generate_all(url: str, *requests: GenerationRequest) -> list[Generation | BaseException]:
    async def every() -> list[Generation | BaseException]:
        client = TritonLLMClient(url)
        try:
            return await asyncio.gather(
                *(client.generate(r) for r in requests), return_exceptions=True
            )
        finally:
            await client.close()

    return asyncio.run(every())


def test_guided_rows_and_a_bad_guide_in_one_batch(
    triton_server: Any, tokenizer: PreTrainedTokenizerBase
) -> None:
    question = chat(tokenizer, "Where and when were the first modern Olympics? As JSON.")
    plain = GenerationRequest(chat(tokenizer, "Name a colour."), 16, sampling=GREEDY)
    results = generate_all(
        triton_server.grpc_url,
        GenerationRequest(question, 60, sampling=GREEDY, guide=("json_schema", json.dumps(SCHEMA))),
        GenerationRequest(question, 8, sampling=GREEDY, guide=("regex", "[0-9]{4}")),
        GenerationRequest(question, 8, sampling=GREEDY, guide=("regex", "([0-9]")),
        GenerationRequest(question, 8, sampling=GREEDY, guide=("xml", None)),
        plain,
    )
    schema, year, bad_regex, bad_type, free = results
    assert isinstance(bad_regex, TritonRequestError)
    assert "guided_decoding_guide: invalid regex" in str(bad_regex)
    assert isinstance(bad_type, TritonRequestError)
    assert "guided_decoding_guide_type: must be one of json" in str(bad_type)
    assert isinstance(schema, Generation) and isinstance(year, Generation)
    value = json.loads(schema.text)
    assert set(value) == {"city", "year"} and isinstance(value["year"], int)
    assert re.fullmatch(r"[0-9]{4}", year.text)
    (alone,) = generate_all(triton_server.grpc_url, plain)
    assert isinstance(free, Generation) and isinstance(alone, Generation)
    assert free.ids == alone.ids
