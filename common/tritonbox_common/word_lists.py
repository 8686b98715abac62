"""Stop and bad word lists in TensorRT-LLM's `[2, N]` tensor layout.

Row 0 holds the token ids of every word, concatenated; row 1 holds the cumulative end offset of
each word, padded with -1 to the length of row 0: ids `[[A, B], [C]]` become
`[[A, B, C], [2, 3, -1]]`. `[[0], [-1]]` means "no words".

A word's ids in running text often differ from its standalone encoding: byte-level BPE and
SentencePiece merge a leading space into the word's first token ("Paris" and " Paris" are
different tokens). So each word is also encoded with a leading space added, or its leading
spaces removed, and every distinct encoding is listed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np
import numpy.typing as npt

from tritonbox_common.parameters import MAX_WORD_TOKENS as MAX_WORD_TOKENS  # defined there
from tritonbox_common.parameters import MAX_WORDS

NO_WORDS: tuple[tuple[int], tuple[int]] = ((0,), (-1,))

WordList = npt.NDArray[np.int32]


class WordEncoder(Protocol):
    """The one tokenizer method this module needs (a transformers tokenizer has it)."""

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...


def word_variants(word: str) -> list[str]:
    """The spellings of `word` to encode: as given, then with a leading space added or removed."""
    variant = word.lstrip(" ") if word.startswith(" ") else " " + word
    return [word] if not variant or variant == word else [word, variant]


def pack_word_ids(words: Sequence[Sequence[int]]) -> WordList:
    """Lay out token id sequences as `[2, N]`; an empty list gives `[[0], [-1]]`."""
    if not words:
        return np.array(NO_WORDS, dtype=np.int32)
    if any(len(ids) == 0 for ids in words):
        raise ValueError("a word list entry has no token ids")
    flat = [int(token) for ids in words for token in ids]
    offsets = np.cumsum([len(ids) for ids in words])
    packed = np.full((2, len(flat)), -1, dtype=np.int32)
    packed[0] = flat
    packed[1, : len(offsets)] = offsets
    return packed


def encode_word_list(tokenizer: WordEncoder, words: Sequence[str]) -> WordList:
    """Encode stop or bad words (each variant without special tokens) as a `[2, N]` list.

    Raises ValueError naming the offending word for an empty or blank (spaces only) word, more than
    MAX_WORDS words, or a word longer than MAX_WORD_TOKENS tokens.
    """
    if len(words) > MAX_WORDS:
        raise ValueError(f"too many words: {len(words)}, at most {MAX_WORDS} are allowed")
    encoded: list[tuple[int, ...]] = []
    for word in words:
        # Newlines and tabs are real stop words ("\n\n"); a word of nothing or only spaces
        # would match between almost any two tokens.
        if not word.strip(" "):
            raise ValueError(f"empty or blank word {word!r}: a word needs more than spaces")
        for variant in word_variants(word):
            ids = tuple(tokenizer.encode(variant, add_special_tokens=False))
            if len(ids) > MAX_WORD_TOKENS:
                raise ValueError(
                    f"word {word!r} is {len(ids)} tokens long, at most {MAX_WORD_TOKENS} are "
                    "allowed"
                )
            # Two spellings can share an encoding, and users repeat words: list each once.
            if ids and ids not in encoded:
                encoded.append(ids)
    return pack_word_ids(encoded)


def decode_word_list(array: npt.ArrayLike) -> list[list[int]]:
    """The token id sequences of a `[2, N]` list (a leading batch dimension of 1 is allowed).

    The inverse of `pack_word_ids`; raises ValueError for a malformed list.
    """
    packed = np.asarray(array)
    if packed.ndim == 3 and packed.shape[0] == 1:
        packed = packed[0]
    if packed.ndim != 2 or packed.shape[0] != 2:
        raise ValueError(f"a word list must have shape [2, N], got {list(packed.shape)}")
    ids, offsets = packed[0], packed[1]
    words: list[list[int]] = []
    start = 0
    for offset in (int(value) for value in offsets):
        if offset < 0:
            break  # -1 pads the offsets row; nothing after it counts
        if offset <= start or offset > ids.size:
            raise ValueError(f"word list offsets must increase within {ids.size}, got {offset}")
        words.append([int(token) for token in ids[start:offset]])
        start = offset
    return words


def stack_word_lists(lists: Sequence[WordList]) -> npt.NDArray[np.int32]:
    """Stack `[2, N_i]` lists into one `[batch, 2, max N]` tensor (ids padded 0, offsets -1)."""
    width = max((item.shape[1] for item in lists), default=1)
    stacked = np.zeros((len(lists), 2, width), dtype=np.int32)
    stacked[:, 1, :] = -1
    for row, item in enumerate(lists):
        stacked[row, :, : item.shape[1]] = item
    return stacked
