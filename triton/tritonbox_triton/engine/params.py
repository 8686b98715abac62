"""Per-request generation parameters of the cpu engine, read from the `tensorrt_llm` input tensors.

Names and defaults follow TensorRT-LLM's executor so that a request means the same thing on
either flavour: greedy unless `runtime_top_k` > 1 or `runtime_top_p` > 0, temperature 1.0.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from tritonbox_common.errors import RequestError

if TYPE_CHECKING:
    from .grammar import Guide

# The most top log-probs per token `num_top_logprobs` may ask for (OpenAI's top_logprobs limit).
MAX_TOP = 20


@dataclass(frozen=True, slots=True)
class EngineLimits:
    max_input_len: int
    max_output_len: int
    kv_cache_max_tokens: int


@dataclass(frozen=True, slots=True)
class SamplingParams:
    max_tokens: int
    end_id: int
    pad_id: int
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    min_tokens: int = 0
    seed: int = 0
    streaming: bool = False
    exclude_input_in_output: bool = True
    return_log_probs: bool = False
    num_top_logprobs: int = 0  # a TritonBox extension: top alternatives per token (≤ MAX_TOP)
    # Structured output: the compiled grammar of guided_decoding_guide(_type) (grammar.py),
    # set by the Triton model after these scalars are read.
    guide: Guide | None = field(default=None, compare=False, repr=False)
    # The prompt's scores from the prefill (engine/prompt_logprobs.py): TensorRT-LLM's full
    # `context_logits`, and TritonBox's compact prompt log-probs.
    return_context_logits: bool = False
    return_prompt_log_probs: bool = False

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1 or (self.top_k == 0 and self.top_p == 0.0)


def _scalar(tensors: Mapping[str, np.ndarray[Any, Any]], name: str) -> np.ndarray[Any, Any] | None:
    array = tensors.get(name)
    if array is None:
        return None
    if array.size != 1:
        raise RequestError(f"{name}: expected one value, got shape {list(array.shape)}")
    return array.reshape(-1)[0]


def _number(
    tensors: Mapping[str, np.ndarray[Any, Any]],
    name: str,
    default: float,
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
) -> float:
    value = _scalar(tensors, name)
    if value is None:
        return default
    number = float(value)
    if not np.isfinite(number):
        raise RequestError(f"{name}: must be a finite number, got {number}")
    if low is not None and (number < low or (low_open and number == low)):
        bound = ">" if low_open else ">="
        raise RequestError(f"{name}: must be {bound} {low}, got {number}")
    if high is not None and number > high:
        raise RequestError(f"{name}: must be <= {high}, got {number}")
    return number


def _flag(tensors: Mapping[str, np.ndarray[Any, Any]], name: str, default: bool) -> bool:
    value = _scalar(tensors, name)
    return default if value is None else bool(value)


def prompt_ids(tensors: Mapping[str, np.ndarray[Any, Any]], limits: EngineLimits) -> list[int]:
    """The prompt's token ids: `input_ids` cut to `input_lengths` (ragged batching pads them)."""
    ids = tensors.get("input_ids")
    if ids is None:
        raise RequestError("input_ids: required")
    flat = ids.reshape(-1)
    length = int(_number(tensors, "input_lengths", float(flat.size), low=1, high=flat.size))
    if length > limits.max_input_len:
        raise RequestError(
            f"input_ids: the prompt has {length} tokens, more than the engine's max input "
            f"length of {limits.max_input_len}"
        )
    return [int(token) for token in flat[:length]]


def sampling_params(
    tensors: Mapping[str, np.ndarray[Any, Any]],
    limits: EngineLimits,
    *,
    prompt_len: int,
    default_end_id: int,
    default_pad_id: int,
    exclude_input_default: bool,
) -> SamplingParams:
    """Validate and convert the optional scalar inputs; every error names its tensor and limit."""
    max_tokens = int(_number(tensors, "request_output_len", -1, low=0, high=limits.max_output_len))
    if max_tokens < 0:
        raise RequestError("request_output_len: required")
    prompt_scores = (
        _flag(tensors, "return_context_logits", False),
        _flag(tensors, "return_prompt_log_probs", False),
    )
    if max_tokens == 0 and not any(prompt_scores):
        # 0 means a prefill only, which is worth running only for the prompt's scores.
        raise RequestError(
            "request_output_len: must be >= 1, or 0 with return_context_logits or "
            "return_prompt_log_probs (score the prompt, generate nothing)"
        )
    if prompt_len + max_tokens > limits.kv_cache_max_tokens:
        raise RequestError(
            f"request_output_len: prompt ({prompt_len}) + output ({max_tokens}) tokens exceed the "
            f"KV cache of {limits.kv_cache_max_tokens} tokens"
        )
    beam_width = int(_number(tensors, "beam_width", 1, low=1))
    if beam_width != 1:
        raise RequestError(f"beam_width: the cpu engine supports only 1, got {beam_width}")
    seed_value = _scalar(tensors, "seed")
    seed = int(seed_value) if seed_value is not None else secrets.randbits(63)
    return SamplingParams(
        max_tokens=max_tokens,
        # -1: no end id (TensorRT-LLM's meaning; its `ignore_eos` sends it): no token ends it.
        end_id=int(_number(tensors, "end_id", default_end_id, low=-1)),
        pad_id=int(_number(tensors, "pad_id", default_pad_id, low=0)),
        temperature=_number(tensors, "temperature", 1.0, low=0.0, high=100.0),
        top_k=int(_number(tensors, "runtime_top_k", 0, low=0)),
        top_p=_number(tensors, "runtime_top_p", 0.0, low=0.0, high=1.0),
        repetition_penalty=_number(tensors, "repetition_penalty", 1.0, low=0.0, low_open=True),
        presence_penalty=_number(tensors, "presence_penalty", 0.0, low=-2.0, high=2.0),
        frequency_penalty=_number(tensors, "frequency_penalty", 0.0, low=-2.0, high=2.0),
        min_tokens=int(_number(tensors, "min_tokens", 0, low=0)),
        seed=seed % (1 << 63),
        streaming=_flag(tensors, "streaming", False),
        exclude_input_in_output=_flag(tensors, "exclude_input_in_output", exclude_input_default),
        return_log_probs=_flag(tensors, "return_log_probs", False),
        num_top_logprobs=int(_number(tensors, "num_top_logprobs", 0, low=0, high=MAX_TOP)),
        return_context_logits=prompt_scores[0],
        return_prompt_log_probs=prompt_scores[1],
    )
