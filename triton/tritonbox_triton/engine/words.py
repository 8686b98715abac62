"""Stop and bad words for one sequence.

Stop words follow TensorRT-LLM's rule exactly: a sequence ends when its last tokens are one of
the word's token sequences, nothing else. The engine sees only token ids, so this can only be a
hint: the exact text of a stop word (whitespace included) is decided by the api, which matches
the decoded text and stops the request itself. A looser match here (the text window this module
used to strip) ended answers where the api's text did not hold the word.

Bad words are also matched as text, because token sequences alone miss a word the model spells
with other tokens ("Par"+"is" for "Paris"): a candidate token whose text would complete a bad
word is rejected before it is emitted.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

Decode = Callable[[list[int]], str]


def text_decoder(tokenizer: Any) -> Decode:
    """A tokenizer's `decode` as the one-sequence, text-only function the engine needs."""

    def decode(ids: list[int]) -> str:
        return str(tokenizer.decode(ids))

    return decode


def _is_word_char(char: str) -> bool:
    return char.isascii() and (char.isalnum() or char == "_")


def _strings(decode: Decode, words: Sequence[Sequence[int]]) -> list[str]:
    # Bad words only. The variants " Paris" and "Paris" both decode to text containing "Paris";
    # whitespace-only words ("\n\n") keep their text.
    texts = {decode(list(word)) for word in words}
    return sorted({text.strip() or text for text in texts if text})


class WordRules:
    """Stop and bad word matching for one sequence."""

    def __init__(
        self,
        decode: Decode,
        stop_words: Sequence[Sequence[int]] = (),
        bad_words: Sequence[Sequence[int]] = (),
    ) -> None:
        self._decode = decode
        self._stop_ids = [tuple(word) for word in stop_words if word]
        self._bad_ids = [tuple(word) for word in bad_words if word]
        self._bad_strings = _strings(decode, self._bad_ids)
        # A window of this many tokens always holds a whole word plus its neighbours: a token
        # decodes to at least one byte, and a character is at most four.
        self._bad_window = self._window(self._bad_ids, self._bad_strings)

    @property
    def has_bad_words(self) -> bool:
        return bool(self._bad_ids)

    @staticmethod
    def _window(ids: Sequence[tuple[int, ...]], strings: Sequence[str]) -> int:
        longest_ids = max((len(word) for word in ids), default=0)
        longest_bytes = max((len(text.encode()) for text in strings), default=0)
        return max(longest_ids, longest_bytes) + 2

    def banned_tokens(self, context: Sequence[int]) -> set[int]:
        """Tokens that would complete a bad word's token sequence after `context`."""
        banned: set[int] = set()
        for word in self._bad_ids:
            prefix = word[:-1]
            if not prefix or tuple(context[-len(prefix) :]) == prefix:
                banned.add(word[-1])
        return banned

    def completes_bad_word(self, context: Sequence[int], token: int) -> bool:
        """Whether appending `token` makes a bad word appear (as a whole word) in the text."""
        if not self._bad_strings:
            return False
        tail = list(context[-self._bad_window :])
        before = self._decode(tail)
        after = self._decode([*tail, token])
        # Only occurrences that end inside the new token's text are new.
        new_from = len(before) if after.startswith(before) else 0
        for word in self._bad_strings:
            start = after.find(word, max(0, new_from - len(word) + 1))
            while start != -1:
                if self._is_whole_word(after, word, start):
                    return True
                start = after.find(word, start + 1)
        return False

    @staticmethod
    def _is_whole_word(text: str, word: str, start: int) -> bool:
        # A word that starts or ends with a letter only counts where it is not part of a longer
        # word; the end of the text counts as a boundary, because the next token could be one.
        end = start + len(word)
        if _is_word_char(word[0]) and start > 0 and _is_word_char(text[start - 1]):
            return False
        return not (_is_word_char(word[-1]) and end < len(text) and _is_word_char(text[end]))

    def hits_stop_word(self, generated: Sequence[int]) -> bool:
        """Whether the generated tokens now end with one of the stop words' token sequences."""
        return any(tuple(generated[-len(word) :]) == word for word in self._stop_ids)
