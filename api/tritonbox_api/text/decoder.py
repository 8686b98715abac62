"""Exact text from a stream of token ids.

Decoding tokens one at a time loses SentencePiece's leading spaces and breaks characters that
span several byte tokens. So each step decodes a short window of earlier tokens plus the new ones
and emits only the difference (the prefix/read offsets of vLLM and TGI), which keeps a step's
cost proportional to the window, not to the whole output. A character that is still incomplete
(the decoder renders it as U+FFFD) is held back until the ids that complete it arrive.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

_REPLACEMENT = "\ufffd"
# The longest window held while its text ends in U+FFFD. Real text needs far less (the longest
# emoji sequence of byte tokens is about 25 ids); past it, the ids are invalid bytes, not a
# character still arriving: the window is released as decoded (U+FFFD, as decoding everything at
# once renders them) and moves on. Unbounded, 2 000 stray byte tokens grew the window to all of
# them, each push decoding it again: 2M ids decoded, on the event loop.
MAX_WINDOW_IDS = 64


class Detokenizer(Protocol):
    """What the decoder needs from a transformers tokenizer."""

    def decode(
        self,
        token_ids: list[int],
        /,
        skip_special_tokens: bool = ...,
        clean_up_tokenization_spaces: bool | None = ...,
    ) -> str: ...


def _direct_decode(tokenizer: Any, skip_special_tokens: bool) -> Callable[[list[int]], str] | None:
    """The Rust tokenizer's own decode, where transformers' `decode` would only wrap it.

    Each streamed token is decoded twice (window and context): transformers' checks and
    conversions around the Rust call cost about 4 µs of the 6 µs of each, on the event loop.
    Only for the class whose `decode` is known to be exactly that wrapper (with
    clean_up_tokenization_spaces=False); any other tokenizer keeps its own `decode`.
    """
    try:
        from transformers.tokenization_utils_base import PreTrainedTokenizerBase
        from transformers.tokenization_utils_tokenizers import TokenizersBackend
    except ImportError:  # another transformers layout: the public decode still works
        return None
    kind = type(tokenizer)
    if not isinstance(tokenizer, TokenizersBackend) or (
        kind.decode is not PreTrainedTokenizerBase.decode
        or kind._decode is not TokenizersBackend._decode
    ):
        return None
    backend = tokenizer.backend_tokenizer

    def decode(ids: list[int]) -> str:
        return str(backend.decode(ids, skip_special_tokens=skip_special_tokens))

    return decode


class IncrementalDecoder:
    """Turns ids pushed in any chunks into the same text as decoding them all at once."""

    def __init__(self, tokenizer: Detokenizer, *, skip_special_tokens: bool = True) -> None:
        self._tokenizer = tokenizer
        self._skip_special_tokens = skip_special_tokens
        self._direct = _direct_decode(tokenizer, skip_special_tokens)
        self._ids: list[int] = []
        self._chunks: list[str] = []
        # ids[prefix_offset:read_offset] were emitted already and are decoded again only as
        # context, so the new ids decode as they would in the middle of the text.
        self._prefix_offset = 0
        self._read_offset = 0
        # Characters beyond ids[:read_offset] emitted while a later character was incomplete.
        self._emitted_ahead = 0

    @property
    def ids(self) -> tuple[int, ...]:
        return tuple(self._ids)

    @property
    def text(self) -> str:
        """All text returned so far by push() and flush()."""
        return "".join(self._chunks)

    def push(self, ids: Sequence[int]) -> str:
        """Add `ids`; return the text that is now final ("" while a character is incomplete)."""
        if len(ids) == 0:  # not `not ids`: a numpy array has no truth value
            return ""
        self._ids.extend(map(int, ids))  # numpy integers from a response tensor become ints
        prefix, window = self._decode_window()
        if not window.endswith(_REPLACEMENT):
            new = window[len(prefix) + self._emitted_ahead :]
            if new:
                self._advance()
            return self._emit(new)
        if len(self._ids) - self._prefix_offset > MAX_WINDOW_IDS:
            return self.flush()
        # Text before the incomplete character cannot change any more: release it now. All the
        # trailing U+FFFD go, since SentencePiece's byte fallback renders every byte of an
        # unfinished run as one.
        final = len(window.rstrip(_REPLACEMENT)) - len(prefix)
        if final <= self._emitted_ahead:
            return ""
        new = window[len(prefix) + self._emitted_ahead : len(prefix) + final]
        self._emitted_ahead = final
        return self._emit(new)

    def flush(self) -> str:
        """At the end of the stream: whatever is still held back, decoded as it is."""
        prefix, window = self._decode_window()
        new = window[len(prefix) + self._emitted_ahead :]
        if new:
            self._advance()
        return self._emit(new)

    def _decode_window(self) -> tuple[str, str]:
        context = self._ids[self._prefix_offset : self._read_offset]
        return self._decode(context), self._decode(self._ids[self._prefix_offset :])

    def _decode(self, ids: list[int]) -> str:
        if self._direct is not None:
            return self._direct(ids)
        return self._tokenizer.decode(
            ids,
            skip_special_tokens=self._skip_special_tokens,
            clean_up_tokenization_spaces=False,
        )

    def _advance(self) -> None:
        # Only after text was produced: a window of skipped special tokens alone would decode
        # to "" and give the next token no context (SentencePiece would drop its space).
        self._prefix_offset, self._read_offset = self._read_offset, len(self._ids)
        self._emitted_ahead = 0

    def _emit(self, new: str) -> str:
        if new:
            self._chunks.append(new)
        return new
