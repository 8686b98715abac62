"""Guides whose trial compilation passed the time limit (guide_pool.py), and the limit's words.

Such a guide is remembered, so that sent again it is refused at once, with the same words,
rather than costing a worker the whole limit again (its trial's process killed and replaced once
more) and its client the wait.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict

from tritonbox_common.guided import GUIDE_INPUT

from .grammar import GuideKey

# The last this many are kept, each by a 32-byte digest (a guide holds up to MAX_GUIDE_CHARS):
# 8 KiB. Each one got here by holding a worker for the whole limit, so a client going through
# more distinct slow guides than this pays that limit for each anyway.
LATE_KEPT = 256


def late(key: GuideKey, timeout_s: float) -> str:
    """The refusal of a guide not compiled within `timeout_s`, naming its input and the limit."""
    return (f"{GUIDE_INPUT}: the {key[0]} was not compiled within the engine's limit of "
            f"{timeout_s:g} s (GUIDE_COMPILE_TIMEOUT_S), where its compilation is "
            "stopped; a simpler one compiles sooner (fewer bounded repetitions such as "
            ".{1,1000} or a maxLength)")  # fmt: skip


class LateGuides:
    """The last `kept` guides whose trial was killed at the limit, least recently sent first.
    Not locked: guide_pool.py uses it under its own lock."""

    def __init__(self, kept: int = LATE_KEPT) -> None:
        self._kept = kept
        self._digests: OrderedDict[bytes, None] = OrderedDict()

    def add(self, key: GuideKey) -> None:
        self._digests[_digest(key)] = None
        if len(self._digests) > self._kept:
            self._digests.popitem(last=False)

    def __contains__(self, key: GuideKey) -> bool:
        """Whether `key` is remembered (then now its most recently sent)."""
        digest = _digest(key)
        if digest in self._digests:
            self._digests.move_to_end(digest)
            return True
        return False


def _digest(key: GuideKey) -> bytes:
    return hashlib.sha256("\0".join(key).encode(errors="surrogatepass")).digest()
