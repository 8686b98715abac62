"""Token log-probs from an engine response: `output_log_probs` (TensorRT-LLM's, both engines)
and the cpu engine's `top_token_ids` / `top_log_probs` (docs/api.md)."""

from __future__ import annotations

import numpy as np
from tritonclient.grpc import InferResult

TopLogprobs = tuple[list[int], list[float]]  # one token's best alternatives: ids, log-probs


def token_log_probs(result: InferResult | None, count: int) -> list[float]:
    """The log-prob of each of a response's `count` new tokens (asked by `return_log_probs`)."""
    values = result.as_numpy("output_log_probs") if result is not None else None
    if values is None or not count:
        return []
    # The last ones: a response carries the new tokens' (a GPU engine may send them all).
    return [float(v) for v in np.asarray(values).reshape(-1)[-count:]]


def top_log_probs(result: InferResult | None, count: int) -> list[TopLogprobs]:
    """Per new token, the engine's most likely alternatives (`num_top_logprobs`)."""
    ids = result.as_numpy("top_token_ids") if result is not None else None
    values = result.as_numpy("top_log_probs") if result is not None else None
    if ids is None or values is None or not count:
        return []
    width = ids.shape[-1]
    rows = ids.reshape(-1, width)[-count:], values.reshape(-1, width)[-count:]
    return [
        ([int(i) for i in row], [float(v) for v in lps]) for row, lps in zip(*rows, strict=True)
    ]
