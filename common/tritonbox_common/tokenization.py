"""The pure logic of the ensemble's `preprocessing` and `postprocessing` steps.

The Triton models (`triton/models/*/1/model.py`) only move tensors in and out; everything here
works on numpy arrays and a tokenizer, so it is tested without a Triton server.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from tritonbox_common.end_ids import TokenIds
from tritonbox_common.errors import RequestError
from tritonbox_common.word_lists import (
    decode_word_list,
    encode_word_list,
    pack_word_ids,
    stack_word_lists,
)

Int32Array = npt.NDArray[np.int32]
ObjectArray = npt.NDArray[np.object_]


class Tokenizer(Protocol):
    """What the steps need from a transformers tokenizer."""

    eos_token_id: int | None
    pad_token_id: int | None

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...

    def batch_decode(
        self, sequences: list[list[int]], skip_special_tokens: bool = ...
    ) -> list[str]: ...


@dataclass(frozen=True, slots=True)
class PreprocessingLimits:
    max_input_len: int
    max_output_len: int


def load_tokenizer(tokenizer_dir: Path) -> Any:
    """Load a tokenizer from a local directory; never reaches out to a hub."""
    if not tokenizer_dir.is_dir():
        raise FileNotFoundError(f"tokenizer_dir {tokenizer_dir} is not a directory")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tokenizer_dir, local_files_only=True)


def _text(value: object, name: str) -> str:
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError as error:
            raise RequestError(f"{name}: not valid UTF-8 ({error.reason})") from None
    if isinstance(value, str):
        return value
    raise RequestError(f"{name}: expected a string, got {type(value).__name__}")


def adds_special_tokens(tokenizer: Tokenizer, prompt: str) -> bool:
    """Whether to let the tokenizer add its special tokens (a BOS) to `prompt`: not when the
    prompt already starts with the BOS, as a rendered chat template does (Gemma's starts with
    <bos>; encoding it with special tokens would start the prompt with two)."""
    bos = getattr(tokenizer, "bos_token", None)
    return not (isinstance(bos, str) and bos and prompt.startswith(bos))


class PromptTooLongError(RequestError):
    """A prompt of more tokens than max_input_len; `tokens` says how many (its caller need not
    tokenize it again to tell the client)."""

    def __init__(self, tokens: int, max_input_len: int) -> None:
        super().__init__(
            f"QUERY: the prompt is {tokens} tokens long, more than max_input_len {max_input_len}"
        )
        self.tokens = tokens


def encode_prompt(tokenizer: Tokenizer, prompt: str, max_input_len: int) -> list[int]:
    """The prompt's ids (with the tokenizer's special tokens unless the prompt carries its own
    BOS: adds_special_tokens); rejects empty or too long prompts."""
    if not prompt:
        raise RequestError("QUERY: the prompt is empty")
    ids = tokenizer.encode(prompt, add_special_tokens=adds_special_tokens(tokenizer, prompt))
    if not ids:
        raise RequestError("QUERY: the prompt has no tokens")
    if len(ids) > max_input_len:
        raise PromptTooLongError(len(ids), max_input_len)
    return ids


def words_from_tensor(row: npt.NDArray[Any] | None, name: str) -> list[str]:
    """The words of one batch row of a STRING[-1] words tensor.

    Exactly empty strings are dropped: NVIDIA's examples send `"stop_words": ""` for "none".
    """
    if row is None:
        return []
    words = [_text(value, name) for value in np.asarray(row, dtype=object).reshape(-1)]
    return [word for word in words if word]


def _word_lists(
    tokenizer: Tokenizer, rows: Sequence[list[str]], name: str
) -> npt.NDArray[np.int32]:
    lists = []
    for words in rows:
        try:
            lists.append(encode_word_list(tokenizer, words))
        except ValueError as error:
            raise RequestError(f"{name}: {error}") from None
    return stack_word_lists(lists)


def _with_end_ids(words: npt.NDArray[np.int32], end_ids: Sequence[int]) -> npt.NDArray[np.int32]:
    """A `[batch, 2, N]` stop-word tensor with each of `end_ids` added as a one-token word."""
    rows = []
    for row in words:
        ids = decode_word_list(row)
        rows.append(pack_word_ids(ids + [[end] for end in end_ids if [end] not in ids]))
    return stack_word_lists(rows)


def _row(array: npt.NDArray[Any] | None, index: int) -> npt.NDArray[Any] | None:
    return None if array is None else array[index]


def _ids_column(array: npt.NDArray[Any] | None, default: int, batch: int, name: str) -> Int32Array:
    if array is None:
        return np.full((batch, 1), default, dtype=np.int32)
    if array.size != batch:
        raise RequestError(f"{name}: expected one value per prompt, got shape {list(array.shape)}")
    return np.asarray(array, dtype=np.int32).reshape(batch, 1)


def preprocess(
    tokenizer: Tokenizer,
    limits: PreprocessingLimits,
    defaults: TokenIds,
    inputs: dict[str, npt.NDArray[Any] | None],
) -> dict[str, npt.NDArray[Any]]:
    """One request's preprocessing outputs from its input tensors (each with a batch dimension).

    `inputs` maps QUERY, REQUEST_OUTPUT_LEN (required) and BAD_WORDS_DICT, STOP_WORDS_DICT,
    END_ID, PAD_ID (None when absent) to arrays. Raises RequestError naming the bad input.
    """
    query = inputs.get("QUERY")
    output_len = inputs.get("REQUEST_OUTPUT_LEN")
    if query is None or output_len is None:
        raise RequestError("QUERY and REQUEST_OUTPUT_LEN are required")
    batch = query.shape[0]
    prompts = [_text(value, "QUERY") for value in query.reshape(batch, -1)[:, 0]]
    ids = [encode_prompt(tokenizer, prompt, limits.max_input_len) for prompt in prompts]

    if output_len.size != batch:
        raise RequestError(
            f"REQUEST_OUTPUT_LEN: expected one value per prompt, got shape {list(output_len.shape)}"
        )
    for value in output_len.reshape(-1):
        if not 1 <= int(value) <= limits.max_output_len:
            raise RequestError(
                f"REQUEST_OUTPUT_LEN: must be between 1 and max_output_len "
                f"{limits.max_output_len}, got {int(value)}"
            )

    pad_ids = _ids_column(inputs.get("PAD_ID"), defaults.pad_id, batch, "PAD_ID")
    # A batch of prompts of different lengths is right-padded; REQUEST_INPUT_LEN has the truth.
    input_ids = np.empty((batch, max(len(row) for row in ids)), dtype=np.int32)
    for index, row in enumerate(ids):
        input_ids[index, : len(row)] = row
        input_ids[index, len(row) :] = pad_ids[index, 0]

    bad = inputs.get("BAD_WORDS_DICT")
    stop = inputs.get("STOP_WORDS_DICT")
    stop_ids = _word_lists(
        tokenizer,
        [words_from_tensor(_row(stop, i), "STOP_WORDS_DICT") for i in range(batch)],
        "STOP_WORDS_DICT",
    )
    if inputs.get("END_ID") is None and defaults.extra_end_ids:
        # A client that names its END_ID chose its one end; the default stops on all of them.
        stop_ids = _with_end_ids(stop_ids, defaults.extra_end_ids)
    return {
        "INPUT_ID": input_ids,
        "REQUEST_INPUT_LEN": np.array([[len(row)] for row in ids], dtype=np.int32),
        "BAD_WORDS_IDS": _word_lists(
            tokenizer,
            [words_from_tensor(_row(bad, i), "BAD_WORDS_DICT") for i in range(batch)],
            "BAD_WORDS_DICT",
        ),
        "STOP_WORDS_IDS": stop_ids,
        "REQUEST_OUTPUT_LEN": np.asarray(output_len, dtype=np.int32).reshape(batch, 1),
        "OUT_END_ID": _ids_column(inputs.get("END_ID"), defaults.end_id, batch, "END_ID"),
        "OUT_PAD_ID": pad_ids,
    }


def decode_outputs(
    tokenizer: Tokenizer,
    tokens_batch: npt.NDArray[Any],
    sequence_length: npt.NDArray[Any],
    *,
    skip_special_tokens: bool = True,
) -> ObjectArray:
    """Decode `[batch, beams, tokens]` ids, each cut to its `[batch, beams]` length, to UTF-8.

    Stateless on purpose: each response is decoded on its own, as NVIDIA's postprocessing does,
    so a streamed chunk can split a character. The api decodes exactly and incrementally from
    the ensemble's `output_ids` instead of concatenating these texts.
    """
    if tokens_batch.ndim != 3 or sequence_length.shape != tokens_batch.shape[:2]:
        raise RequestError(
            f"TOKENS_BATCH {list(tokens_batch.shape)} and SEQUENCE_LENGTH "
            f"{list(sequence_length.shape)} must be [batch, beams, tokens] and [batch, beams]"
        )
    batch, beams, width = tokens_batch.shape
    sequences = [
        [
            int(token)
            for token in tokens_batch[b, k, : max(0, min(int(sequence_length[b, k]), width))]
        ]
        for b in range(batch)
        for k in range(beams)
    ]
    texts = tokenizer.batch_decode(sequences, skip_special_tokens=skip_special_tokens)
    encoded = np.empty(len(texts), dtype=object)
    encoded[:] = [text.encode("utf-8") for text in texts]
    return encoded.reshape(batch, beams)
