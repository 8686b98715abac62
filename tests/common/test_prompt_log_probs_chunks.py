"""The api's scoring of TensorRT-LLM's `context_logits` (tritonbox_common/prompt_log_probs.py)
goes a chunk of rows at a time: the same bits as all rows at once, and working memory of a few
chunks, not a few times the whole [input_len, vocab] tensor it received."""

from __future__ import annotations

import tracemalloc
from typing import Any

import numpy as np
import pytest

from tritonbox_common import prompt_log_probs
from tritonbox_common.prompt_log_probs import from_context_logits


def _whole(
    logits: np.ndarray[Any, Any], prompt: list[int], top: int
) -> list[prompt_log_probs.PromptEntry]:
    """The scoring of every row at once: what the chunks must reproduce bit for bit."""
    rows = logits.reshape(-1, logits.shape[-1])[: len(prompt) - 1].astype(np.float32)
    peak = rows.max(axis=-1, keepdims=True)
    logprobs = rows - (peak + np.log(np.exp(rows - peak).sum(axis=-1, keepdims=True)))
    values = logprobs[np.arange(len(prompt) - 1), prompt[1:]]
    best = np.argpartition(-logprobs, top - 1, axis=-1)[:, :top]
    order = np.argsort(-np.take_along_axis(logprobs, best, -1), axis=-1, kind="stable")
    ids = np.take_along_axis(best, order, -1)
    return prompt_log_probs._entries(prompt, values, ids, np.take_along_axis(logprobs, ids, -1))


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_chunks_give_the_bits_of_the_whole(monkeypatch: pytest.MonkeyPatch, dtype: type) -> None:
    generator = np.random.default_rng(0)
    vocab, length = 300, 37
    logits: np.ndarray[Any, Any] = (generator.standard_normal((1, length, vocab)) * 4).astype(dtype)
    prompt = [int(t) for t in generator.integers(0, vocab, length)]
    monkeypatch.setattr(prompt_log_probs, "CHUNK_BYTES", 5 * 4 * vocab)  # 5 rows, 8 chunks
    assert from_context_logits(logits, prompt, top=4) == _whole(logits, prompt, 4)
    plain = from_context_logits(logits, prompt, top=0)
    assert [(t, v) for t, v, _ in plain] == [(t, v) for t, v, _ in _whole(logits, prompt, 4)]
    assert all(top is None for _, _, top in plain)


def test_working_memory_is_a_few_chunks_not_a_few_wholes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each chunk's work is about six chunks (the log-softmax's temporaries, argpartition's
    int64 indices): with 1 MiB chunks, 5 MiB for 48 MiB of logits, where all rows at once
    took 191 MiB."""
    vocab, length = 49152, 256  # the default model's vocabulary: 48 MiB of float32 logits
    logits = np.random.default_rng(1).standard_normal((1, length, vocab), dtype=np.float32)
    monkeypatch.setattr(prompt_log_probs, "CHUNK_BYTES", 1 << 20)
    tracemalloc.start()
    try:
        from_context_logits(logits, list(range(length)), top=5)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, f"{peak >> 20} MiB of work for {logits.nbytes >> 20} MiB of logits"
