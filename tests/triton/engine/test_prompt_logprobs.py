"""The prompt's log-probs and context logits from the engine's prefill (engine/prompt_logprobs.py),
against transformers' log-softmax over the same checkpoint in the engine's dtype (float32), and
request_output_len 0: a prefill only, one final call, no token. Scored a chunk of positions at a
time: the same bits as all positions at once, a prompt over many chunks, the context logits'
limit; the memory bound is test_prompt_logprobs_memory.py's."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, PreTrainedModel, PreTrainedTokenizerBase

from tritonbox_common.errors import RequestError
from tritonbox_common.tokenization import load_tokenizer
from tritonbox_triton.engine import prompt_logprobs
from tritonbox_triton.engine.attention import load_model
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
    plain = run(engine, make_sink(), prompt, max_tokens=6, return_log_probs=True)
    sink = run(
        engine, make_sink(), prompt, max_tokens=6, return_log_probs=True, return_context_logits=True
    )
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


def _hidden(model: PreTrainedModel, prompt: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return model.model(input_ids=torch.tensor([prompt])).last_hidden_state[0]


@pytest.mark.parametrize("chunk", [1, 3, 16])
def test_scores_by_chunks_are_the_scores_of_every_position_at_once(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, chunk: int
) -> None:
    """The chunks change no bit in bfloat16: each position's logits are the head's for that row
    alone (float_logits.py). A float32 head is MKL's product, whose sums follow the row count:
    there within 1e-4, the bound docs/api.md gives prompt log-probs (3.8e-5 seen on AVX2)."""
    prompt = list(tokenizer("One chunk after another, the prompt is scored in parts.").input_ids)
    params = SamplingParams(0, EOS, EOS, num_top_logprobs=4, return_context_logits=True,
                            return_prompt_log_probs=True)  # fmt: skip
    hidden = _hidden(model, prompt)
    whole = prompt_logprobs.score(model, hidden, prompt, params, chunk=len(prompt)).tensors
    parts = prompt_logprobs.score(model, hidden, prompt, params, chunk=chunk).tensors
    assert sorted(parts) == sorted(whole)
    exact = model.dtype == torch.bfloat16
    for name, value in whole.items():
        if exact or not np.issubdtype(value.dtype, np.floating):
            np.testing.assert_array_equal(parts[name], value, err_msg=name)
        else:
            np.testing.assert_allclose(parts[name], value, rtol=0, atol=1e-4, err_msg=name)
    # ... and they are the model forward's own logits, log-softmaxed unchunked.
    with torch.inference_mode():
        expected = model(torch.tensor([prompt])).logits[0].float()
    np.testing.assert_array_equal(whole["context_logits"][0], expected.numpy())
    following = torch.tensor(prompt[1:])[:, None]
    chosen = torch.log_softmax(expected[:-1], dim=-1).gather(1, following)[:, 0]
    np.testing.assert_array_equal(whole["prompt_log_probs"][0], chosen.numpy())


@pytest.fixture(scope="module")
def float32_engine(tokenizer_dir: Path) -> Iterator[tuple[InflightBatcher, PreTrainedModel]]:
    model = load_model(tokenizer_dir, torch.float32)
    batcher = InflightBatcher(model, text_decoder(load_tokenizer(tokenizer_dir)), LIMITS,
                              max_batch_size=2)  # fmt: skip
    batcher.start()
    yield batcher, model
    batcher.stop()


def test_a_prompt_over_many_chunks_equals_stock_float32(
    float32_engine: tuple[InflightBatcher, PreTrainedModel],
    tokenizer_dir: Path,
    tokenizer: PreTrainedTokenizerBase,
    make_sink: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Through the engine (CPU_DTYPE=float32), in chunks of 7 positions: a 200-token prompt is
    29 of them, and its log-probs are stock transformers' float32 ones."""
    engine, model = float32_engine
    vocab = int(model.config.vocab_size)
    monkeypatch.setattr(prompt_logprobs, "CHUNK_BYTES", 7 * 4 * vocab)
    assert prompt_logprobs.chunk_positions(vocab) == 7
    text = " ".join(f"Line {i} of a long prompt says something new." for i in range(40))
    prompt = list(tokenizer(text).input_ids)[:200]
    sink = run(engine, make_sink(), prompt, return_prompt_log_probs=True, num_top_logprobs=3)
    stock = AutoModelForCausalLM.from_pretrained(tokenizer_dir, dtype=torch.float32).eval()
    expected = reference(stock, prompt)
    got = sink.prompt.tensors
    want = expected[:-1].gather(1, torch.tensor(prompt[1:])[:, None])[:, 0].numpy()
    np.testing.assert_allclose(got["prompt_log_probs"][0], want, atol=TOLERANCE, rtol=0)
    best = torch.topk(expected[:-1], 3, dim=-1)
    np.testing.assert_allclose(got["prompt_top_log_probs"][0], best.values.numpy(),
                               atol=TOLERANCE, rtol=0)  # fmt: skip
    assert (got["prompt_top_token_ids"][0][:, 0] == best.indices.numpy()[:, 0]).all()


def test_context_logits_past_their_limit_are_refused_by_size() -> None:
    params = SamplingParams(1, EOS, EOS, return_context_logits=True)
    most = prompt_logprobs.CONTEXT_LOGITS_MAX_BYTES // (4 * 49152)
    prompt_logprobs.check(params, most, 49152)
    with pytest.raises(RequestError, match=rf"return_context_logits: {most + 1} prompt tokens x "
                       rf"49152 float32 logits .* limit of 512 MiB \({most} tokens"):  # fmt: skip
        prompt_logprobs.check(params, most + 1, 49152)
    # The compact log-probs have no such limit: 4 bytes a token.
    prompt_logprobs.check(SamplingParams(1, EOS, EOS, return_prompt_log_probs=True), 10**6, 49152)
