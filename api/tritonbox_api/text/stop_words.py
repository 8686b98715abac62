"""Cut streamed text at the first stop word, even when it arrives split across chunks.

Matching the decoded text finds a stop word however the model happened to tokenise it. This is
the one rule for stop words: their exact text, whitespace included. The end of the text that
could still grow into a stop word is held back, and released as soon as it cannot.

Set-up is free (no table of prefixes: 32 words of 256 characters made one of 2 MB, built on the
event loop for every request); each push looks for the words' first characters in the held-back
tail, which is short.
"""

from __future__ import annotations

from collections.abc import Sequence


class StopStringMatcher:
    """Releases text up to (never including) the earliest stop word; nothing after it."""

    def __init__(self, stop_words: Sequence[str]) -> None:
        if any(not word for word in stop_words):
            raise ValueError("stop words must not be empty")
        self._words = tuple(dict.fromkeys(stop_words))
        self._longest_prefix = max((len(word) - 1 for word in self._words), default=0)
        self._pending = ""
        self.matched: str | None = None

    @property
    def stopped(self) -> bool:
        return self.matched is not None

    def push(self, text: str) -> str:
        """Add `text`; return what is safe to show now. After a match, always ""."""
        if not self._words:  # most requests have none: nothing to hold back or find
            return text
        if self.stopped:
            return ""
        pending = self._pending + text
        match = self._earliest_match(pending)
        cut = len(pending) - self._held_back(pending)
        # A longer word that starts before the match may still complete: wait for it, or the
        # cut would depend on how the text was chunked. On a tie the cut is the same: stop now.
        if match is not None and match[0] <= cut:
            return self._stop(pending, *match)
        self._pending = pending[cut:]
        return pending[:cut]

    def flush(self) -> str:
        """At the end of the stream: the held-back text, up to a stop word found in it."""
        if self.stopped:
            return ""
        pending, self._pending = self._pending, ""
        match = self._earliest_match(pending)
        return pending if match is None else self._stop(pending, *match)

    def _stop(self, pending: str, start: int, word: str) -> str:
        self.matched = word
        self._pending = ""
        return pending[:start]

    def _earliest_match(self, pending: str) -> tuple[int, str] | None:
        # Released text never holds the start of a match (see _held_back), so a match in the
        # pending text is the earliest so far. On a tie, the longest word wins.
        found: tuple[int, str] | None = None
        for word in self._words:
            start = pending.find(word)
            if start < 0:
                continue
            if found is None or (start, -len(word)) < (found[0], -len(found[1])):
                found = (start, word)
        return found

    def _held_back(self, pending: str) -> int:
        """Length of the longest end of `pending` that is a proper prefix of some stop word."""
        longest = 0
        for word in self._words:
            # Only an end shorter than the word, starting with its first character, can grow
            # into it; the earliest such start gives the longest end.
            start = max(len(pending) - len(word) + 1, 0)
            while (start := pending.find(word[0], start)) >= 0:
                if len(pending) - start <= longest:
                    break
                if word.startswith(pending[start:]):
                    longest = len(pending) - start
                    break
                start += 1
        return longest
