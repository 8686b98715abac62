"""The prompt's token log-probs from an engine response, on either engine (docs/api.md).

- The cpu engine answers TritonBox's compact `return_prompt_log_probs`: `prompt_log_probs`
  [1, input_len - 1] and, with `num_top_logprobs`, `prompt_top_token_ids` /
  `prompt_top_log_probs` [1, input_len - 1, N].
- TensorRT-LLM 0.20 has no such output; it returns `context_logits` [1, input_len, vocab] (FP32
  or FP16, the engine's logits dtype) to `return_context_logits` from an engine built with
  `gather_context_logits`. The same values are computed here: the log-softmax of the logits at
  position i, read at prompt token i+1, and the N highest of that row, CHUNK_BYTES of rows at a
  time (the log-softmax and top-N work take several times a chunk, not several times the whole).
  The tensor itself arrives whole, input_len x vocab x 4 bytes (FP32): ECHO_MAX_PROMPT_TOKENS is
  what bounds it.

The first prompt token has no log-prob (nothing comes before it): its entry is (token, None,
None), as vLLM's and OpenAI's `null`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from pydantic import Field
from pydantic_settings import BaseSettings
from tritonclient.grpc import InferResult

from tritonbox_common.log_probs import TopLogprobs

# The longest prompt the api scores for `echo` with `logprobs`. TensorRT-LLM sends the api the
# whole [input_len, vocab] context logits: 1,024 x 49,152 x 4 = 201,326,592 bytes (192 MiB) of
# FP32 for the default model (SmolLM2), 525,336,576 (501 MiB) at Llama 3's 128,256, per request.
# The cpu engine sends 4 bytes a token (plus 8 per top alternative) and computes them in chunks;
# there the limit bounds the prefill's time. One limit keeps both engines alike.
ECHO_MAX_PROMPT_TOKENS = 1024
DEFAULT_VOCAB = 49152  # the default model's (SmolLM2), for the setting's description
# Float32 log-probs computed at once from context logits (as engine/prompt_logprobs.py does).
CHUNK_BYTES = 8 << 20


class EchoLimitSettings(BaseSettings):
    """The api's ECHO_MAX_PROMPT_TOKENS, beside the scoring it bounds (a base of ApiSettings)."""

    echo_max_prompt_tokens: int = Field(
        default=ECHO_MAX_PROMPT_TOKENS,
        ge=1,
        description="Longest prompt, in tokens, whose log-probs `echo` with `logprobs` returns "
        "(a 400 naming echo past it), on both engines. On TensorRT-LLM the api receives the "
        "prompt's logits whole: tokens x vocabulary x 4 bytes per request, "
        f"{ECHO_MAX_PROMPT_TOKENS * DEFAULT_VOCAB * 4 >> 20} MiB at {ECHO_MAX_PROMPT_TOKENS} "
        f"tokens and the default model's {DEFAULT_VOCAB} (docs/api.md, 'echo').",
    )


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
    vocab = np.shape(logits)[-1]
    # The last position predicts the first generated token. FP16 logits become FP32 a chunk at
    # a time, below; FP32 ones are read in place.
    rows = np.asarray(logits).reshape(-1, vocab)[: len(prompt) - 1]
    following = np.asarray(prompt[1:], dtype=np.int64)
    values = np.empty(len(following), dtype=np.float32)
    ids = np.empty((len(following), top), dtype=np.int64)
    best_values = np.empty((len(following), top), dtype=np.float32)
    step = max(1, CHUNK_BYTES // (4 * vocab))
    for at in range(0, len(following), step):
        chunk = rows[at : at + step].astype(np.float32, copy=False)
        peak = chunk.max(axis=-1, keepdims=True)
        logprobs = chunk - (peak + np.log(np.exp(chunk - peak).sum(axis=-1, keepdims=True)))
        wanted = following[at : at + step]
        values[at : at + len(wanted)] = logprobs[np.arange(len(wanted)), wanted]
        if top:
            # The N highest per row, best first, ties in index order (argpartition, then a
            # stable sort).
            best = np.argpartition(-logprobs, top - 1, axis=-1)[:, :top]
            order = np.argsort(-np.take_along_axis(logprobs, best, -1), axis=-1, kind="stable")
            ids[at : at + len(wanted)] = np.take_along_axis(best, order, -1)
            best_values[at : at + len(wanted)] = np.take_along_axis(
                logprobs, ids[at : at + len(wanted)], -1
            )
    return _entries(prompt, values, ids, best_values) if top else _entries(prompt, values)


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
