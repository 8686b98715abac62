"""The prompt's log-probs and context logits from the engine's prefill (engine/prompt_logprobs.py),
against transformers' log-softmax over the same checkpoint in the engine's dtype (float32), and
request_output_len 0: a prefill only, one final call, no token."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from tritonbox_common.errors import RequestError
from tritonbox_triton.engine.params import EngineLimits, SamplingParams, sampling_params
from tritonbox_triton.engine.scheduler import EngineFinish, EngineRequest, InflightBatcher
from tritonbox_triton.engine.words import text_decoder

EOS = 2
TOLERANCE = 1e-4
LIMITS = EngineLimits(256, 128, 4096)


@pytest.fixture(scope="module")
def engine(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> Iterator[InflightBatcher]:
    batcher = InflightBatcher(model, text_decoder(tokenizer), LIMITS, max_batch_size=4)
    batcher.start()
    yield batcher
    batcher.stop()


def reference(model: PreTrainedModel, prompt: list[int]) -> torch.Tensor:
    """transformers: the log-softmax at every prompt position, [input_len, vocab]."""
    with torch.inference_mode():
        logits = model(torch.tensor([prompt])).logits[0].float()
    return torch.log_softmax(logits, dim=-1)


def run(engine: InflightBatcher, sink: Any, prompt: list[int], **params: Any) -> Any:
    settings = {"max_tokens": 0, "end_id": EOS, "pad_id": EOS, "temperature": 0.0, **params}
    request = EngineRequest(prompt, SamplingParams(**settings), sink, [], [])
    engine.submit(request)
    return sink.wait()


def test_prompt_log_probs_equal_transformers_log_softmax(
    engine: InflightBatcher,
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    make_sink: Any,
) -> None:
    prompt = list(tokenizer("The capital of France is Paris, and of Italy is").input_ids)
    sink = run(engine, make_sink(), prompt, return_prompt_log_probs=True, num_top_logprobs=5)
    expected = reference(model, prompt)
    got = sink.prompt.tensors
    values = got["prompt_log_probs"]
    assert values.shape == (1, len(prompt) - 1) and values.dtype == np.float32
    want = [float(expected[i, prompt[i + 1]]) for i in range(len(prompt) - 1)]
    np.testing.assert_allclose(values[0], want, atol=TOLERANCE, rtol=0)
    top_ids, top_values = got["prompt_top_token_ids"], got["prompt_top_log_probs"]
    assert top_ids.shape == top_values.shape == (1, len(prompt) - 1, 5)
    best = torch.topk(expected[:-1], 5, dim=-1)
    np.testing.assert_allclose(top_values[0], best.values.numpy(), atol=TOLERANCE, rtol=0)
    assert (top_ids[0][:, 0] == best.indices.numpy()[:, 0]).all()
    # max_tokens 0: the prompt only, in one final call with no token and no log-prob.
    assert sink.prompt_before_tokens and sink.calls == 1
    assert sink.tokens == [] and sink.logprobs == [] and sink.finish is EngineFinish.LENGTH


def test_context_logits_are_the_model_s_and_generation_is_unchanged(
    engine: InflightBatcher,
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    make_sink: Any,
) -> None:
    prompt = list(tokenizer("Why is the sky blue?").input_ids)
    plain = run(engine, make_sink(), prompt, max_tokens=6)
    sink = run(engine, make_sink(), prompt, max_tokens=6, return_context_logits=True)
    assert sink.tokens == plain.tokens and sink.logprobs == plain.logprobs
    assert sink.prompt_before_tokens
    logits = sink.prompt.tensors["context_logits"]
    assert logits.dtype == np.float32 and logits.shape == (1, len(prompt), model.config.vocab_size)
    with torch.inference_mode():
        expected = model(torch.tensor([prompt])).logits[0].float().numpy()
    np.testing.assert_allclose(logits[0], expected, atol=TOLERANCE, rtol=0)
    assert "prompt_log_probs" not in sink.prompt.tensors  # only what was asked for


def test_a_one_token_prompt_has_no_prompt_log_probs(
    engine: InflightBatcher, make_sink: Any
) -> None:
    sink = run(engine, make_sink(), [1], return_prompt_log_probs=True, num_top_logprobs=2)
    assert sink.prompt.tensors["prompt_log_probs"].shape == (1, 0)
    assert sink.prompt.tensors["prompt_top_token_ids"].shape == (1, 0, 2)


def _tensors(**values: Any) -> dict[str, np.ndarray[Any, Any]]:
    dtypes = {"request_output_len": np.int32}
    return {k: np.array([[v]], dtype=dtypes.get(k, np.bool_)) for k, v in values.items()}


def test_request_output_len_zero_needs_prompt_scores() -> None:
    def parse(**values: Any) -> SamplingParams:
        return sampling_params(
            _tensors(**values), LIMITS, prompt_len=4, default_end_id=EOS, default_pad_id=EOS,
            exclude_input_default=True,
        )  # fmt: skip

    with pytest.raises(RequestError, match=r"request_output_len: must be >= 1, or 0 with"):
        parse(request_output_len=0)
    assert parse(request_output_len=0, return_prompt_log_probs=True).return_prompt_log_probs
    assert parse(request_output_len=0, return_context_logits=True).return_context_logits
