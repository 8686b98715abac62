"""The prompt's token log-probs from an engine response, on either engine (docs/api.md).

- The cpu engine answers TritonBox's compact `return_prompt_log_probs`: `prompt_log_probs`
  [1, input_len - 1] and, with `num_top_logprobs`, `prompt_top_token_ids` /
  `prompt_top_log_probs` [1, input_len - 1, N].
- TensorRT-LLM 0.20 has no such output; it returns `context_logits` [1, input_len, vocab] (FP32
  or FP16, the engine's logits dtype) to `return_context_logits` from an engine built with
  `gather_context_logits`. The same values are computed here: the log-softmax of the logits at
  position i, read at prompt token i+1, and the N highest of that row.

The first prompt token has no log-prob (nothing comes before it): its entry is (token, None,
None), as vLLM's and OpenAI's `null`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from tritonclient.grpc import InferResult

from tritonbox_common.log_probs import TopLogprobs

# One prompt token's id, log-prob (None for the first) and its best alternatives (when asked).
PromptEntry = tuple[int, float | None, TopLogprobs | None]


def _entries(
    prompt: Sequence[int], values: Any, top_ids: Any = None, top_values: Any = None
) -> list[PromptEntry]:
    entries: list[PromptEntry] = [(int(prompt[0]), None, None)]
    for i, token in enumerate(prompt[1:]):
        top = None
        if top_ids is not None:
            top = ([int(t) for t in top_ids[i]], [float(v) for v in top_values[i]])
        entries.append((int(token), float(values[i]), top))
    return entries


def from_context_logits(logits: Any, prompt: Sequence[int], top: int) -> list[PromptEntry]:
    """TensorRT-LLM's `context_logits` ([1, input_len, vocab]) to the prompt's entries."""
    rows = np.asarray(logits, dtype=np.float32).reshape(-1, np.shape(logits)[-1])
    rows = rows[: len(prompt) - 1]  # the last position predicts the first generated token
    peak = rows.max(axis=-1, keepdims=True)
    logprobs = rows - (peak + np.log(np.exp(rows - peak).sum(axis=-1, keepdims=True)))
    following = np.asarray(prompt[1:], dtype=np.int64)
    values = logprobs[np.arange(len(following)), following]
    if not top:
        return _entries(prompt, values)
    # The N highest per row, best first, ties in index order (argpartition, then a stable sort).
    best = np.argpartition(-logprobs, top - 1, axis=-1)[:, :top]
    order = np.argsort(-np.take_along_axis(logprobs, best, -1), axis=-1, kind="stable")
    ids = np.take_along_axis(best, order, -1)
    return _entries(prompt, values, ids, np.take_along_axis(logprobs, ids, -1))


def prompt_log_probs(
    result: InferResult | None, prompt: Sequence[int], top: int
) -> list[PromptEntry] | None:
    """The prompt's entries from one response; None when it carries no prompt scores."""
    if result is None or not prompt:
        return None
    values = result.as_numpy("prompt_log_probs")
    if values is not None:  # the cpu engine's compact extension
        rows = np.asarray(values).reshape(-1)
        ids = result.as_numpy("prompt_top_token_ids")
        scores = result.as_numpy("prompt_top_log_probs")
        if not top or ids is None or scores is None:
            return _entries(prompt, rows)
        width = ids.shape[-1]
        ids, scores = ids.reshape(-1, width)[:, :top], scores.reshape(-1, width)[:, :top]
        return _entries(prompt, rows, ids, scores)
    logits = result.as_numpy("context_logits")
    if logits is None:
        return None
    return from_context_logits(logits, prompt, top)
