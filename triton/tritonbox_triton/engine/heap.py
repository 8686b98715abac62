"""Giving the engine's freed memory back to the system once it is idle.

glibc's malloc keeps what a process frees in its arenas for the next allocation; only the top of
the main heap goes back by itself. After a burst of long prompts (16 of 2048 tokens) the idle
engine held 2.1 GB where 1.3 GB were in use: its KV buffers and the prefill's activations, freed
but kept. `malloc_trim` returns such free pages of every arena.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Callable


def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's malloc_trim, or None under another C library (musl has none)."""
    name = ctypes.util.find_library("c")
    try:
        function: Callable[[int], int] = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError, TypeError):
        return None
    return function


MALLOC_TRIM = _malloc_trim()


def release_free_memory() -> bool:
    """Return the process's free heap pages to the system; whether anything went back."""
    return bool(MALLOC_TRIM(0)) if MALLOC_TRIM is not None else False
