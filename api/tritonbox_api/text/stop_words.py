"""Cut streamed text at the first stop word, even when it arrives split across chunks.

Matching the decoded text finds a stop word however the model happened to tokenise it. The end
of the text that could still grow into a stop word is held back, and released as soon as it
cannot.
"""

from __future__ import annotations

from collections.abc import Sequence


class StopStringMatcher:
    """Releases text up to (never including) the earliest stop word; nothing after it."""

    def __init__(self, stop_words: Sequence[str]) -> None:
        if any(not word for word in stop_words):
            raise ValueError("stop words must not be empty")
        self._words = tuple(dict.fromkeys(stop_words))
        # Every proper prefix: a pending text ending in one of these may still become a match.
        self._prefixes = {word[:size] for word in self._words for size in range(1, len(word))}
        self._longest_prefix = max((len(word) - 1 for word in self._words), default=0)
        self._pending = ""
        self.matched: str | None = None

    @property
    def stopped(self) -> bool:
        return self.matched is not None

    def push(self, text: str) -> str:
        """Add `text`; return what is safe to show now. After a match, always ""."""
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
        """Length of the longest end of `pending` that starts some stop word."""
        for size in range(min(self._longest_prefix, len(pending)), 0, -1):
            if pending[-size:] in self._prefixes:
                return size
        return 0
