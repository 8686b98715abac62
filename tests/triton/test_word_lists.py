"""Stop/bad word lists in the [2, N] layout, with the default model's real tokenizer."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from tritonbox_common.parameters import MAX_WORDS
from tritonbox_common.word_lists import (
    MAX_WORD_TOKENS,
    decode_word_list,
    encode_word_list,
    pack_word_ids,
    stack_word_lists,
    word_variants,
)

# SmolLM2's byte-level BPE: the leading space is part of the token.
PARIS = 38634
SPACE_PARIS = 7042


def ids(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


def test_pack_layout_matches_tensorrt_llm() -> None:
    packed = pack_word_ids([[11, 12], [13]])
    assert packed.dtype == np.int32
    assert packed.tolist() == [[11, 12, 13], [2, 3, -1]]


def test_no_words_is_the_empty_marker(tokenizer: Any) -> None:
    assert encode_word_list(tokenizer, []).tolist() == [[0], [-1]]
    assert decode_word_list(np.array([[0], [-1]])) == []


def test_word_variants() -> None:
    assert word_variants("Paris") == ["Paris", " Paris"]
    assert word_variants(" Paris") == [" Paris", "Paris"]
    assert word_variants("  Paris") == ["  Paris", "Paris"]
    assert word_variants("\n\n") == ["\n\n", " \n\n"]


def test_a_word_is_listed_with_and_without_a_leading_space(tokenizer: Any) -> None:
    assert ids(tokenizer, "Paris") == [PARIS]
    assert ids(tokenizer, " Paris") == [SPACE_PARIS]
    assert encode_word_list(tokenizer, ["Paris"]).tolist() == [[PARIS, SPACE_PARIS], [1, 2]]
    assert encode_word_list(tokenizer, [" Paris"]).tolist() == [[SPACE_PARIS, PARIS], [1, 2]]


def test_multi_token_words_and_offsets(tokenizer: Any) -> None:
    hello = ids(tokenizer, "Hello world")
    space_hello = ids(tokenizer, " Hello world")
    assert len(hello) == 2 and hello != space_hello
    packed = encode_word_list(tokenizer, ["Hello world", "Paris"])
    flat = [*hello, *space_hello, PARIS, SPACE_PARIS]
    ends = np.cumsum([len(hello), len(space_hello), 1, 1]).tolist()
    assert packed.tolist() == [flat, ends + [-1] * (len(flat) - len(ends))]
    assert decode_word_list(packed) == [hello, space_hello, [PARIS], [SPACE_PARIS]]


def test_repeated_words_and_shared_encodings_are_listed_once(tokenizer: Any) -> None:
    packed = encode_word_list(tokenizer, ["Paris", " Paris", "Paris"])
    assert decode_word_list(packed) == [[PARIS], [SPACE_PARIS]]


def test_newline_words_are_allowed(tokenizer: Any) -> None:
    words = decode_word_list(encode_word_list(tokenizer, ["\n\n"]))
    assert words[0] == ids(tokenizer, "\n\n")


@pytest.mark.parametrize("word", ["", " ", "   "])
def test_empty_or_blank_words_are_rejected(tokenizer: Any, word: str) -> None:
    with pytest.raises(ValueError, match="empty or blank word") as raised:
        encode_word_list(tokenizer, ["ok", word])
    assert repr(word) in str(raised.value)


def test_too_many_words(tokenizer: Any) -> None:
    encode_word_list(tokenizer, [f"w{i}" for i in range(MAX_WORDS)])
    with pytest.raises(ValueError, match=f"too many words: {MAX_WORDS + 1}, at most {MAX_WORDS}"):
        encode_word_list(tokenizer, [f"w{i}" for i in range(MAX_WORDS + 1)])


def test_too_long_word_names_the_word(tokenizer: Any) -> None:
    word = "😀" * 12  # three byte-level tokens per emoji
    assert len(ids(tokenizer, word)) > MAX_WORD_TOKENS
    with pytest.raises(ValueError, match=f"at most {MAX_WORD_TOKENS}") as raised:
        encode_word_list(tokenizer, [word])
    assert repr(word) in str(raised.value)


def test_decode_accepts_a_batch_dimension_of_one() -> None:
    assert decode_word_list(np.array([[[5, 6, 7], [1, 3, -1]]])) == [[5], [6, 7]]


@pytest.mark.parametrize(
    "array",
    [
        np.array([[1, 2, 3]]),  # one row
        np.array([[1, 2], [2, 1]]),  # offsets go back
        np.array([[1, 2], [3, -1]]),  # offset beyond the ids
        np.array([[1, 2], [0, -1]]),  # an empty word
    ],
)
def test_decode_rejects_malformed_lists(array: npt.NDArray[Any]) -> None:
    with pytest.raises(ValueError):
        decode_word_list(array)


def test_stack_pads_ids_with_zero_and_offsets_with_minus_one() -> None:
    stacked = stack_word_lists([pack_word_ids([[4, 5], [6]]), pack_word_ids([])])
    assert stacked.shape == (2, 2, 3)
    assert stacked.tolist() == [[[4, 5, 6], [2, 3, -1]], [[0, 0, 0], [-1, -1, -1]]]
    assert decode_word_list(stacked[1]) == []
