"""Reading the tensorrt_llm inputs: defaults, limits, and errors that name the tensor."""

from __future__ import annotations

import numpy as np
import pytest

from tritonbox_common.errors import RequestError
from tritonbox_triton.engine.params import (
    EngineLimits,
    SamplingParams,
    prompt_ids,
    sampling_params,
)

LIMITS = EngineLimits(max_input_len=8, max_output_len=16, kv_cache_max_tokens=20)


def params(**tensors: object) -> SamplingParams:
    arrays = {"request_output_len": np.array([[4]], dtype=np.int32)}
    arrays |= {name: np.array([[value]]) for name, value in tensors.items()}
    return sampling_params(
        arrays, LIMITS, prompt_len=3, default_end_id=2, default_pad_id=2, exclude_input_default=True
    )


def test_defaults_are_tensorrt_llm_s() -> None:
    result = params()
    assert result.greedy and result.temperature == 1.0 and result.end_id == 2


def test_prompt_is_cut_to_its_length_and_limited() -> None:
    ids = np.array([[5, 6, 7, 0, 0]], dtype=np.int32)
    assert prompt_ids({"input_ids": ids, "input_lengths": np.array([[3]])}, LIMITS) == [5, 6, 7]
    with pytest.raises(RequestError, match=r"9 tokens.*max input length of 8"):
        prompt_ids({"input_ids": np.arange(9, dtype=np.int32)[None]}, LIMITS)


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("runtime_top_p", 1.5, r"runtime_top_p: must be <= 1.0"),
        ("temperature", -1.0, r"temperature: must be >= 0.0"),
        ("repetition_penalty", 0.0, r"repetition_penalty: must be > 0.0"),
        ("runtime_top_k", -3, r"runtime_top_k: must be >= 0"),
        ("beam_width", 4, r"beam_width: the cpu engine supports only 1"),
        ("request_output_len", 17, r"request_output_len: must be <= 16"),
        ("temperature", float("nan"), r"temperature: must be a finite number"),
    ],
)
def test_out_of_range_inputs_name_the_tensor(name: str, value: float, message: str) -> None:
    with pytest.raises(RequestError, match=message):
        params(**{name: value})


def test_end_id_minus_one_means_none_and_lower_is_refused() -> None:
    assert params(end_id=-1).end_id == -1
    with pytest.raises(RequestError, match=r"end_id: must be >= -1"):
        params(end_id=-2)


def test_prompt_plus_output_must_fit_the_kv_cache() -> None:
    arrays = {"request_output_len": np.array([[15]], dtype=np.int32)}
    with pytest.raises(RequestError, match="exceed the KV cache of 20 tokens"):
        sampling_params(
            arrays,
            LIMITS,
            prompt_len=8,
            default_end_id=2,
            default_pad_id=2,
            exclude_input_default=True,
        )
