"""Structured output on the cpu engine: TensorRT-LLM's guided-decoding inputs, through xgrammar.

A request names a guide with the `tensorrt_llm` inputs `guided_decoding_guide_type` and
`guided_decoding_guide` (TensorRT-LLM 0.20's names and type strings, read by its backend in
`getGuidedDecodingParamsFromTensors`). The guide is compiled once, before the request reaches
the engine, by a few workers of its own with a time limit (guide_pool.py; a trial in a process
killed at the limit first, guide_process.py), and kept in a small LRU keyed by its text, so a
batch never waits for a compilation and a repeated schema costs nothing. Each sequence then gets
its own matcher (`GuideState`): before sampling it masks every token the grammar forbids; after,
it accepts the chosen one. TensorRT-LLM's executor drives xgrammar the same way.

The answer ends when the grammar does: the matcher takes the request's end id as its one stop
token, so the end id is allowed exactly when the text is complete, and the scheduler ends on it
as on any end. With no end id (-1, `ignore_eos`) the matcher ends without one, and the next step
reports the end (`GuideState.finished`).
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import xgrammar as xgr

from tritonbox_common.errors import RequestError
from tritonbox_common.guided import GUIDE_INPUT, GUIDE_TYPE_INPUT, GUIDE_TYPES

__all__ = [
    "GUIDE_INPUT", "GUIDE_TYPE_INPUT", "Guide", "GuideCompiler", "GuideKey", "GuideState",
    "compile_guide",
]  # fmt: skip
GuideKey = tuple[str, str]  # (guide type, guide text): what a compiled guide is cached by
# Compiled grammars kept: a schema compiles in about a millisecond but its token masks are
# precomputed per grammar, which is what the cache saves for a repeated schema.
CACHE_SIZE = 64
# xgrammar's C++ errors start with "[time] /path/file.cc:line: "; the rest is the reason.
_CPP_PREFIX = re.compile(r"^\[[^\]]*\]\s*\S+:\d+:\s*")


@dataclass(frozen=True, eq=False)
class Guide:
    """A compiled grammar; shared by every request with the same (type, guide)."""

    guide_type: str
    compiled: xgr.CompiledGrammar

    def matcher(self, end_id: int) -> GuideState:
        return GuideState(self, end_id)


class GuideState:
    """One sequence's position in its grammar."""

    def __init__(self, guide: Guide, end_id: int) -> None:
        # The request's end id is the grammar's one stop token; -1 (no end id): the grammar
        # ends by itself once complete.
        self._matcher = xgr.GrammarMatcher(
            guide.compiled,
            override_stop_tokens=[end_id] if end_id >= 0 else None,
            terminate_without_stop_token=end_id < 0,
        )
        self._vocab_size = guide.compiled.tokenizer_info.vocab_size
        self._bitmask = xgr.allocate_token_bitmask(1, self._vocab_size)

    @property
    def finished(self) -> bool:
        """The grammar is complete and accepts nothing more."""
        return bool(self._matcher.is_terminated())

    def mask(self, logits: torch.Tensor) -> None:
        """Set every token the grammar forbids next to -inf, in place (a 1-D row)."""
        self._matcher.fill_next_token_bitmask(self._bitmask)
        if logits.dtype in (torch.float32, torch.float16, torch.bfloat16):
            xgr.apply_token_bitmask_inplace(logits, self._bitmask[0], vocab_size=self._vocab_size)
        else:  # xgrammar's CPU kernel takes these three dtypes only
            view = logits.float()
            xgr.apply_token_bitmask_inplace(view, self._bitmask[0], vocab_size=self._vocab_size)
            logits.copy_(view)
        # Ids past the tokenizer's vocabulary (a padded embedding) are never text.
        logits[self._vocab_size :] = float("-inf")

    def accept(self, token: int) -> bool:
        return bool(self._matcher.accept_token(token))


def _message(error: Exception) -> str:
    return _CPP_PREFIX.sub("", str(error).strip().splitlines()[0] if str(error) else repr(error))


def _text(tensors: Mapping[str, np.ndarray[Any, Any]], name: str) -> str | None:
    array = tensors.get(name)
    if array is None:
        return None
    if array.size != 1:
        raise RequestError(f"{name}: expected one string, got shape {list(array.shape)}")
    value = array.reshape(-1)[0]
    try:
        return value.decode() if isinstance(value, bytes) else str(value)
    except UnicodeDecodeError:
        raise RequestError(f"{name}: not valid UTF-8") from None


def _checked(guide_type: str | None, guide: str | None) -> GuideKey | None:
    """(type, guide) of a request's inputs, or None without a guide; RequestError names the
    input at fault."""
    if guide_type is None:
        if guide is not None:
            raise RequestError(f"{GUIDE_INPUT}: needs {GUIDE_TYPE_INPUT}")
        return None
    if guide_type not in GUIDE_TYPES:
        raise RequestError(
            f"{GUIDE_TYPE_INPUT}: must be one of {', '.join(GUIDE_TYPES)}, got {guide_type!r}"
        )
    if guide_type != "json" and not guide:
        raise RequestError(f"{GUIDE_INPUT}: required for {GUIDE_TYPE_INPUT} {guide_type!r}")
    return guide_type, guide or ""


class GuideCompiler:
    """Compiles guides for one tokenizer, with an LRU of the last CACHE_SIZE."""

    def __init__(self, tokenizer: Any, vocab_size: int, cache_size: int = CACHE_SIZE) -> None:
        # vocab_size: the model's logits width, which may exceed the tokenizer's (padding).
        info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size)
        self.tokenizer_info = info  # what guide_process.py's trials compile for
        self._compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
        self._cache: OrderedDict[tuple[str, str], Guide] = OrderedDict()
        self._cache_size = cache_size
        self._lock = threading.Lock()

    def from_tensors(self, tensors: Mapping[str, np.ndarray[Any, Any]]) -> Guide | None:
        """The request's guide, compiled here; None without one. RequestError names the input
        at fault."""
        key = self.requested(tensors)
        return None if key is None else self.compile(*key)

    def requested(self, tensors: Mapping[str, np.ndarray[Any, Any]]) -> GuideKey | None:
        """The request's (type, guide), checked but not compiled; None without one."""
        return _checked(_text(tensors, GUIDE_TYPE_INPUT), _text(tensors, GUIDE_INPUT))

    def lookup(self, key: GuideKey) -> Guide | None:
        """The compiled guide for `key` if the LRU has it (now its most recent)."""
        with self._lock:
            cached = self._cache.get(key)
            if cached is not None:
                self._cache.move_to_end(key)
            return cached

    def compile(self, guide_type: str, guide: str | None) -> Guide:
        key = _checked(guide_type, guide)
        assert key is not None  # a type was given
        cached = self.lookup(key)
        if cached is not None:
            return cached
        entry = Guide(guide_type, compile_guide(self._compiler, guide_type, key[1]))
        with self._lock:
            self._cache[key] = entry
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return entry

    def cached(self) -> int:
        return len(self._cache)


def compile_guide(
    compiler: xgr.GrammarCompiler, guide_type: str, guide: str
) -> xgr.CompiledGrammar:
    """`guide` compiled: here, and in guide_process.py's trial. RequestError names the input and
    xgrammar's reason; MemoryError where xgrammar ran out of memory (its std::bad_alloc)."""
    try:
        if guide_type == "json":
            return compiler.compile_builtin_json_grammar()
        if guide_type == "json_schema":
            return compiler.compile_json_schema(guide)
        if guide_type == "regex":
            return compiler.compile_regex(guide)
        return compiler.compile_grammar(guide)
    except Exception as error:  # xgrammar raises RuntimeError with the parser's reason
        if "bad_alloc" in str(error):
            raise MemoryError(f"compiling the {guide_type} ran out of memory") from None
        raise RequestError(f"{GUIDE_INPUT}: invalid {guide_type}: {_message(error)}") from None
