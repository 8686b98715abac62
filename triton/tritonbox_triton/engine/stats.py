"""What one engine iteration did, and how NVIDIA's TensorRT-LLM backend names it on /metrics.

The cpu engine reports the backend's own gauge families (0.20: `nv_trt_llm_request_metrics`,
`nv_trt_llm_inflight_batcher_metrics`, `nv_trt_llm_kv_cache_block_metrics`,
`nv_trt_llm_general_metrics`, each labelled `model` and `version` plus one kind label), so a
dashboard or a test written against the GPU engine reads the cpu engine unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

# TensorRT-LLM's default paged KV cache block: the cpu engine has no blocks, but counts its
# tokens in blocks of this size so the block gauges mean the same on both engines.
TOKENS_PER_BLOCK = 64

# family -> (help text, kind label). The help texts are the backend's.
FAMILIES: dict[str, tuple[str, str]] = {
    "nv_trt_llm_request_metrics": ("TRT LLM request metrics", "request_type"),
    "nv_trt_llm_inflight_batcher_metrics": (
        "TRT LLM inflight_batcher-specific metrics",
        "inflight_batcher_specific_metric",
    ),
    "nv_trt_llm_kv_cache_block_metrics": ("TRT LLM KV cache block metrics", "kv_cache_block_type"),
    "nv_trt_llm_general_metrics": ("General TRT LLM metrics", "general_type"),
}


@dataclass(frozen=True)
class IterationStats:
    iteration: int  # iterations since the engine started
    timestamp_us: int  # wall clock, microseconds since the epoch
    active: int  # sequences in the in-flight batch after this iteration
    waiting: int  # requests queued for a place in the batch
    max_active: int  # the batch's capacity (max_batch_size)
    context: int  # requests prefilled this iteration
    context_tokens: int  # prompt tokens prefilled this iteration
    generation: int  # sequences advanced by this iteration's decode step
    kv_tokens_used: int  # tokens held in the KV cache now
    kv_tokens_max: int  # the KV cache's capacity in tokens
    # Requests each of this iteration's prefill admissions took in, in order: an idle engine
    # also admits, in the same iteration, whatever came during its first pass (scheduler.py).
    # Not on /metrics (TensorRT-LLM has no such gauge); the tests read waves from it.
    admissions: tuple[int, ...] = ()

    @property
    def scheduled(self) -> int:
        return self.context + self.generation


def _blocks(tokens: int) -> int:
    return -(-tokens // TOKENS_PER_BLOCK)


def nvidia_values(stats: IterationStats) -> dict[tuple[str, str], float]:
    """(family, kind label value) -> gauge value, as TensorRT-LLM's backend reports them."""
    max_blocks = stats.kv_tokens_max // TOKENS_PER_BLOCK
    used = min(_blocks(stats.kv_tokens_used), max_blocks)
    request, batcher = "nv_trt_llm_request_metrics", "nv_trt_llm_inflight_batcher_metrics"
    kv, general = "nv_trt_llm_kv_cache_block_metrics", "nv_trt_llm_general_metrics"
    return {
        (request, "active"): stats.active,
        (request, "waiting"): stats.waiting,
        (request, "max"): stats.max_active,
        (request, "scheduled"): stats.scheduled,
        (request, "context"): stats.context,
        (batcher, "micro_batch_id"): 0,
        (batcher, "generation_requests"): stats.generation,
        (batcher, "total_context_tokens"): stats.context_tokens,
        (batcher, "paused_requests"): 0,
        (kv, "max"): max_blocks,
        (kv, "free"): max_blocks - used,
        (kv, "used"): used,
        (kv, "tokens_per"): TOKENS_PER_BLOCK,
        (kv, "fraction"): used / max_blocks if max_blocks else 0.0,
        (general, "iteration_counter"): stats.iteration,
        (general, "timestamp"): stats.timestamp_us,
    }
