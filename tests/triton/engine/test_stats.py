"""The engine's iteration stats under TensorRT-LLM backend's metric names."""

from __future__ import annotations

from tritonbox_triton.engine.stats import FAMILIES, IterationStats, nvidia_values


def test_values_use_the_backends_families_and_kinds() -> None:
    stats = IterationStats(
        iteration=7, timestamp_us=123, active=3, waiting=2, max_active=8, context=1,
        context_tokens=40, generation=2, kv_tokens_used=130, kv_tokens_max=6400,
    )  # fmt: skip
    values = nvidia_values(stats)
    assert {family for family, _ in values} == set(FAMILIES)
    request = "nv_trt_llm_request_metrics"
    assert {kind: v for (family, kind), v in values.items() if family == request} == {
        "active": 3, "waiting": 2, "max": 8, "scheduled": 3, "context": 1,
    }  # fmt: skip
    kv = {kind: v for (family, kind), v in values.items() if "kv_cache" in family}
    assert kv == {"max": 100, "used": 3, "free": 97, "tokens_per": 64, "fraction": 0.03}
    batcher = "nv_trt_llm_inflight_batcher_metrics"
    assert values[(batcher, "generation_requests")] == 2
    assert values[(batcher, "total_context_tokens")] == 40
    assert values[("nv_trt_llm_general_metrics", "iteration_counter")] == 7
