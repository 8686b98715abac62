"""A prompt longer than MAX_INPUT_LEN is tokenized once, not again to count it: tokenizing a
200,000-character prompt takes tens of milliseconds of a core on the api's machine, which
tests/abuse saw taken from the engine beside it when such prompts came again and again."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from tritonbox_api.protocol.errors import ApiError
from tritonbox_api.service.engine_context import EngineContext
from tritonbox_api.service.prompts import prompt_ids
from tritonbox_api.triton_gateway import EngineInfo
from tritonbox_common.end_ids import default_token_ids
from tritonbox_common.tokenization import load_tokenizer
from tritonbox_triton.prepare_model import prepare_default_model

REPO = Path(__file__).resolve().parents[3]


def test_a_too_long_prompt_is_tokenized_once_and_its_count_named() -> None:
    model_dir = REPO / ".cache" / "models" / "SmolLM2-135M-Instruct"
    prepare_default_model(model_dir)
    tokenizer = load_tokenizer(model_dir)
    info = EngineInfo(tokenizer_dir=model_dir, max_input_len=64, max_output_len=32)
    context = EngineContext(
        info=info, tokenizer=tokenizer, model_name="m",
        token_ids=default_token_ids(tokenizer, model_dir),
    )  # fmt: skip
    calls: list[int] = []
    encode = tokenizer.encode

    def counted(text: str, **options: Any) -> Any:
        calls.append(len(text))
        return encode(text, **options)

    tokenizer.encode = counted  # this test's own tokenizer
    prompt = "word " * 5000
    with pytest.raises(ApiError) as refused:
        asyncio.run(prompt_ids(context, prompt))
    tokens = len(encode(prompt))
    assert refused.value.param == "prompt"
    assert refused.value.message == (
        f"prompt: {tokens} tokens is longer than the engine's max input of 64 tokens "
        "(MAX_INPUT_LEN)"
    )
    assert calls == [len(prompt)]
