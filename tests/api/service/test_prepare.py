"""prepare(): the engine's limits, checked before anything reaches Triton (no server needed)."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tritonbox_api.db.models import Source
from tritonbox_api.protocol.errors import ApiError
from tritonbox_api.protocol.generation import GenerationInput
from tritonbox_api.protocol.openai import IDS_PLACEHOLDER
from tritonbox_api.service.engine_context import EngineContext
from tritonbox_api.service.options import GenerationOptions
from tritonbox_api.service.prepare import PreparedGeneration, prepare
from tritonbox_api.service.prompts import INLINE_TOKENIZE_MAX_CHARS, prompt_ids, prompt_inputs
from tritonbox_api.triton_gateway import EngineInfo
from tritonbox_common.client import build_inputs
from tritonbox_common.end_ids import default_token_ids
from tritonbox_common.tokenization import load_tokenizer
from tritonbox_common.word_lists import decode_word_list
from tritonbox_triton.prepare_model import prepare_default_model

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def context() -> EngineContext:
    model_dir = REPO / ".cache" / "models" / "SmolLM2-135M-Instruct"
    prepare_default_model(model_dir)
    info = EngineInfo(tokenizer_dir=model_dir, max_input_len=64, max_output_len=32)
    tokenizer = load_tokenizer(model_dir)
    ids = default_token_ids(tokenizer, model_dir)
    return EngineContext(info=info, tokenizer=tokenizer, model_name="m", token_ids=ids)


def options(params: GenerationInput, stream: bool = True, **given: Any) -> GenerationOptions:
    return GenerationOptions(params, source=Source.API, stream=stream, **given)


def run(context: EngineContext, stream: bool = True, **values: Any) -> PreparedGeneration:
    params = GenerationInput(**values)
    return asyncio.run(prepare(options(params, stream), context, max_beam_width=1))


def refused(context: EngineContext, **values: Any) -> str:
    with pytest.raises(ApiError) as raised:
        run(context, **values)
    assert raised.value.status_code == 422
    return raised.value.message


def test_applied_parameters_are_complete_and_seeded(context: EngineContext) -> None:
    prepared = run(context, prompt="Hello there", max_tokens=5)
    applied = prepared.applied
    assert applied["max_tokens"] == 5 and applied["temperature"] == 0.7
    assert isinstance(applied["seed"], int)
    assert prepared.request.sampling["seed"] == applied["seed"]
    assert prepared.prompt_tokens == len(context.tokenizer.encode("Hello there"))


def test_the_default_max_tokens_fits_a_small_engine(context: EngineContext) -> None:
    assert run(context, prompt="Hi").request.max_tokens == 32


def test_temperature_zero_is_greedy(context: EngineContext) -> None:
    assert run(context, prompt="Hi", temperature=0).request.sampling["top_k"] == 1


def test_chat_uses_the_models_template(context: EngineContext) -> None:
    prepared = run(context, messages=[{"role": "user", "content": "Hi"}])
    assert prepared.request.prompt.endswith("<|im_start|>assistant\n")
    assert prepared.applied["engine_prompt"] == prepared.request.prompt


def test_engine_limits_are_named(context: EngineContext) -> None:
    assert "MAX_INPUT_LEN" in refused(context, prompt="word " * 80)
    assert "must be at most 32 (MAX_OUTPUT_LEN), got 33" in refused(
        context, prompt="a", max_tokens=33
    )
    assert "MAX_BEAM_WIDTH" in refused(context, prompt="a", beam_width=2)
    assert refused(context, prompt="a", stop_words_list=["ok", " "]).startswith(
        "stop_words_list[1]:"
    )
    with pytest.raises(ApiError, match="streaming needs beam_width 1"):
        asyncio.run(
            prepare(options(GenerationInput(prompt="a", beam_width=2)), context, max_beam_width=4)
        )


def test_short_prompts_are_counted_inline_long_ones_in_a_thread(
    context: EngineContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    wide = EngineContext(
        info=EngineInfo(tokenizer_dir=context.info.tokenizer_dir, max_input_len=4096,
                        max_output_len=32),
        tokenizer=context.tokenizer, model_name="m", token_ids=context.token_ids,
    )  # fmt: skip
    hops: list[str] = []
    real_to_thread = asyncio.to_thread

    async def to_thread(fn: Any, *args: Any) -> Any:
        hops.append(args[1])
        return await real_to_thread(fn, *args)

    monkeypatch.setattr("tritonbox_api.service.prompts.asyncio.to_thread", to_thread)
    short = "a fox " * (INLINE_TOKENIZE_MAX_CHARS // 6)
    long = short + "and a dog " * 10
    assert len(short) <= INLINE_TOKENIZE_MAX_CHARS < len(long)
    for prompt in (short, long):
        counted = len(asyncio.run(prompt_ids(wide, prompt)))
        assert counted == len(context.tokenizer.encode(prompt))
    assert hops == [long]
    # Too long is refused the same way on either side of the threshold.
    assert "MAX_INPUT_LEN" in refused(context, prompt="word " * 80)
    assert "MAX_INPUT_LEN" in refused(context, prompt="word " * 1000)


def test_the_request_is_for_the_engine_step_with_the_prompts_ids(context: EngineContext) -> None:
    prepared = run(context, prompt="Hello there", bad_words_list=["Paris"], stop_words_list=["\n"])
    request = prepared.request
    assert request.model == "tensorrt_llm"
    assert list(request.input_ids or []) == context.tokenizer.encode("Hello there")
    assert prepared.prompt_tokens == len(request.input_ids or [])
    assert request.sampling["end_id"] == context.token_ids.end_id
    assert request.stop_words == ()  # the api's text rule decides stop words
    assert decode_word_list(request.bad_word_ids)  # with the word's variants
    tensors = {tensor.name(): tensor for tensor in build_inputs(request)}
    assert {"input_ids", "input_lengths", "request_output_len", "streaming", "end_id", "pad_id",
            "runtime_top_k", "runtime_top_p", "bad_words_list", "exclude_input_in_output"} <= set(
        tensors
    )  # fmt: skip
    assert "text_input" not in tensors and "top_k" not in tensors


def test_log_probs_ask_the_engine_and_top_ones_need_an_engine_that_has_them(
    context: EngineContext,
) -> None:
    """TensorRT-LLM 0.20 (info.top_logprobs False) returns the chosen token's log-prob only."""
    params = GenerationInput(prompt="Hi", max_tokens=2)
    plain = asyncio.run(prepare(options(params), context, max_beam_width=1))
    assert "return_log_probs" not in plain.request.sampling and plain.logprobs is None
    chosen = asyncio.run(prepare(options(params, logprobs=0), context, max_beam_width=1))
    assert chosen.request.sampling["return_log_probs"] is True
    assert "num_top_logprobs" not in chosen.request.sampling  # not an input of NVIDIA's engine
    names = {tensor.name() for tensor in build_inputs(chosen.request)}
    assert "return_log_probs" in names and "num_top_logprobs" not in names
    with pytest.raises(ApiError) as raised:
        asyncio.run(
            prepare(
                options(params, logprobs=3, logprobs_field="top_logprobs"),
                context,
                max_beam_width=1,
            )
        )
    assert raised.value.status_code == 400 and raised.value.param == "top_logprobs"
    cpu = replace(context, info=replace(context.info, top_logprobs=True))
    top = asyncio.run(prepare(options(params, logprobs=3), cpu, max_beam_width=1))
    assert top.request.sampling["num_top_logprobs"] == 3 and top.logprobs == 3


def test_a_guide_goes_to_the_engine_only_if_it_follows_guides(context: EngineContext) -> None:
    guide = {"guide_type": "regex", "guide": "[0-9]+"}
    assert "xgrammar" in refused(context, prompt="Hi", guided_decoding=guide)  # not enabled
    guided = replace(context, info=replace(context.info, guided_decoding=True))
    prepared = run(guided, prompt="Hi", guided_decoding=guide)
    assert prepared.request.guide == ("regex", "[0-9]+")
    assert prepared.applied["guided_decoding"] == guide
    assert run(guided, prompt="Hi").request.guide is None


def test_token_id_prompts_reach_the_engine_as_sent(context: EngineContext) -> None:
    """Token ids are not decoded and tokenised again: ids that text would not give (" Hello"
    spelt as two tokens) go to the engine as they are; the text is their decoding."""
    ids = context.tokenizer.encode(" He") + context.tokenizer.encode("llo")
    assert ids != context.tokenizer.encode(" Hello")
    (source,) = prompt_inputs(context, [ids])
    assert source.ids == ids and source.text == context.tokenizer.decode(ids)
    params = GenerationInput(prompt=IDS_PLACEHOLDER, max_tokens=2)
    prepared = asyncio.run(prepare(options(params), context, max_beam_width=1, prompt_input=source))
    assert list(prepared.request.input_ids or []) == ids
    assert prepared.request.prompt == source.text == prepared.applied["prompt"]
    assert prepared.prompt_tokens == len(ids)


def test_token_ids_are_checked_against_the_vocabulary_and_max_input_len(
    context: EngineContext,
) -> None:
    vocabulary = len(context.tokenizer)
    with pytest.raises(ApiError) as raised:
        prompt_inputs(context, ["fine", [1, vocabulary]])
    assert raised.value.param == "prompt[1]"
    assert f"token id {vocabulary} at position 1" in raised.value.message
    assert f"0 to {vocabulary - 1}" in raised.value.message
    with pytest.raises(ApiError) as raised:
        prompt_inputs(context, [[1] * 65])
    assert raised.value.param == "prompt" and "MAX_INPUT_LEN" in raised.value.message
