"""The preprocessing/postprocessing logic, with the default model's real tokenizer."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from tritonbox_common.end_ids import TokenIds, default_token_ids
from tritonbox_common.errors import RequestError
from tritonbox_common.tokenization import (
    PreprocessingLimits,
    decode_outputs,
    encode_prompt,
    preprocess,
    words_from_tensor,
)

EOS = 2  # SmolLM2's <|im_end|>, also its pad token
LIMITS = PreprocessingLimits(max_input_len=64, max_output_len=32)
DEFAULTS = TokenIds(end_id=EOS, pad_id=EOS)
PROMPT = "What is the capital of France?"


def strings(*rows: list[str | bytes]) -> npt.NDArray[np.object_]:
    array = np.empty((len(rows), max(len(row) for row in rows)), dtype=object)
    for index, row in enumerate(rows):
        array[index] = [value.encode() if isinstance(value, str) else value for value in row]
    return array


def request(
    *prompts: str | bytes, max_tokens: int = 8, **extra: npt.NDArray[Any]
) -> dict[str, npt.NDArray[Any] | None]:
    inputs: dict[str, npt.NDArray[Any] | None] = {
        "QUERY": strings(*[[prompt] for prompt in prompts]),
        "REQUEST_OUTPUT_LEN": np.full((len(prompts), 1), max_tokens, dtype=np.int32),
    }
    inputs.update(extra)
    return inputs


def test_default_token_ids_come_from_the_tokenizer(tokenizer: Any) -> None:
    assert default_token_ids(tokenizer) == TokenIds(end_id=EOS, pad_id=EOS)


class _NoPad:
    eos_token_id: int | None = 7
    pad_token_id: int | None = None

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [1]

    def batch_decode(
        self, sequences: list[list[int]], skip_special_tokens: bool = True
    ) -> list[str]:
        return [""]


def test_pad_defaults_to_eos_and_eos_is_required() -> None:
    assert default_token_ids(_NoPad()) == TokenIds(end_id=7, pad_id=7)
    no_eos = _NoPad()
    no_eos.eos_token_id = None
    with pytest.raises(ValueError, match="no eos token"):
        default_token_ids(no_eos)


def test_preprocess_one_prompt(tokenizer: Any) -> None:
    out = preprocess(tokenizer, LIMITS, DEFAULTS, request(PROMPT, max_tokens=16))
    expected = tokenizer.encode(PROMPT)
    assert out["INPUT_ID"].dtype == np.int32
    assert out["INPUT_ID"].tolist() == [expected]
    assert out["REQUEST_INPUT_LEN"].tolist() == [[len(expected)]]
    assert out["REQUEST_OUTPUT_LEN"].tolist() == [[16]]
    assert out["BAD_WORDS_IDS"].tolist() == [[[0], [-1]]]
    assert out["STOP_WORDS_IDS"].tolist() == [[[0], [-1]]]
    assert out["OUT_END_ID"].tolist() == [[EOS]]
    assert out["OUT_PAD_ID"].tolist() == [[EOS]]
    assert all(array.dtype == np.int32 for array in out.values())


def test_preprocess_words_and_explicit_ids(tokenizer: Any) -> None:
    out = preprocess(
        tokenizer,
        LIMITS,
        DEFAULTS,
        request(
            PROMPT,
            STOP_WORDS_DICT=strings(["Paris", ""]),  # "" is NVIDIA's "no word"
            BAD_WORDS_DICT=strings([" London"]),
            END_ID=np.array([[7]], dtype=np.int32),
            PAD_ID=np.array([[9]], dtype=np.int32),
        ),
    )
    assert out["STOP_WORDS_IDS"].tolist() == [[[38634, 7042], [1, 2]]]
    assert out["BAD_WORDS_IDS"].tolist() == [
        [tokenizer.encode(" London") + tokenizer.encode("London"), [1, 2]]
    ]
    assert out["OUT_END_ID"].tolist() == [[7]]
    assert out["OUT_PAD_ID"].tolist() == [[9]]


def test_a_batch_of_prompts_is_right_padded_with_the_pad_id(tokenizer: Any) -> None:
    out = preprocess(
        tokenizer,
        LIMITS,
        DEFAULTS,
        request("Hi", PROMPT, PAD_ID=np.array([[0], [0]], dtype=np.int32)),
    )
    short, long = tokenizer.encode("Hi"), tokenizer.encode(PROMPT)
    assert out["REQUEST_INPUT_LEN"].tolist() == [[len(short)], [len(long)]]
    assert out["INPUT_ID"].tolist() == [short + [0] * (len(long) - len(short)), long]
    assert out["STOP_WORDS_IDS"].shape == (2, 2, 1)


def test_empty_prompt_is_rejected(tokenizer: Any) -> None:
    with pytest.raises(RequestError, match="QUERY: the prompt is empty"):
        preprocess(tokenizer, LIMITS, DEFAULTS, request(""))


def test_too_long_prompt_names_the_limit_and_the_count(tokenizer: Any) -> None:
    prompt = "word " * 100
    count = len(tokenizer.encode(prompt))
    with pytest.raises(RequestError) as raised:
        encode_prompt(tokenizer, prompt, max_input_len=64)
    assert str(raised.value) == (
        f"QUERY: the prompt is {count} tokens long, more than max_input_len 64"
    )
    assert encode_prompt(tokenizer, prompt, max_input_len=count) == tokenizer.encode(prompt)


@pytest.mark.parametrize("max_tokens", [0, -1, 33])
def test_output_length_out_of_range(tokenizer: Any, max_tokens: int) -> None:
    with pytest.raises(RequestError, match=f"max_output_len 32, got {max_tokens}"):
        preprocess(tokenizer, LIMITS, DEFAULTS, request(PROMPT, max_tokens=max_tokens))


def test_invalid_utf8_is_a_request_error(tokenizer: Any) -> None:
    with pytest.raises(RequestError, match="QUERY: not valid UTF-8"):
        preprocess(tokenizer, LIMITS, DEFAULTS, request(b"\xff\xfe"))


def test_bad_words_errors_name_the_tensor(tokenizer: Any) -> None:
    with pytest.raises(RequestError, match="STOP_WORDS_DICT: empty or blank word ' '"):
        preprocess(tokenizer, LIMITS, DEFAULTS, request(PROMPT, STOP_WORDS_DICT=strings([" "])))


def test_words_from_tensor_drops_only_empty_strings() -> None:
    assert words_from_tensor(None, "X") == []
    assert words_from_tensor(strings(["a", "", " b"])[0], "X") == ["a", " b"]


def test_decode_honours_sequence_length_and_skips_special_tokens(tokenizer: Any) -> None:
    answer = tokenizer.encode(" The capital of France is Paris.")
    tokens = np.array([[[*answer, EOS, 99, 99]]], dtype=np.int32)
    lengths = np.array([[len(answer) + 1]], dtype=np.int32)  # includes the eos, not the tail
    text = decode_outputs(tokenizer, tokens, lengths)
    assert text.shape == (1, 1)
    assert text[0, 0] == b" The capital of France is Paris."


def test_decode_beams_and_utf8(tokenizer: Any) -> None:
    first, second = tokenizer.encode("héllo 😀"), tokenizer.encode("ok")
    width = max(len(first), len(second))
    tokens = np.zeros((1, 2, width), dtype=np.int32)
    tokens[0, 0, : len(first)] = first
    tokens[0, 1, : len(second)] = second
    lengths = np.array([[len(first), len(second)]], dtype=np.int32)
    assert decode_outputs(tokenizer, tokens, lengths).tolist() == [["héllo 😀".encode(), b"ok"]]


def test_decode_of_a_split_character_is_lossy_by_design(tokenizer: Any) -> None:
    # One streamed response can end inside a character: that is why the api decodes from ids.
    emoji = tokenizer.encode("😀")
    tokens = np.array([[emoji[:1]]], dtype=np.int32)
    assert decode_outputs(tokenizer, tokens, np.array([[1]], dtype=np.int32))[0, 0] == (
        "\ufffd".encode()
    )


def test_decode_rejects_mismatched_shapes(tokenizer: Any) -> None:
    with pytest.raises(RequestError, match="must be"):
        decode_outputs(tokenizer, np.zeros((1, 4), np.int32), np.zeros((1, 1), np.int32))
