"""The cpu engine's metrics on Triton's /metrics: TensorRT-LLM backend's gauge families (same
names and labels, engine/stats.py), plus token and outcome counters."""

from __future__ import annotations

import time

import triton_python_backend_utils as pb_utils

from tritonbox_triton.engine.stats import FAMILIES, IterationStats, nvidia_values

OUTCOMES = ("stop", "length", "stop_word", "cancelled", "error")

# The request counts are set as soon as they change (they tell that a stopped request has left);
# everything else at most this often, and once more when the engine falls idle. Each set is a
# round trip to the Triton process, which on a loaded CPU costs milliseconds: a dozen per
# iteration slowed every decode step, and with it every stop.
FULL_UPDATE_S = 0.5
IMMEDIATE = {("nv_trt_llm_request_metrics", "active"), ("nv_trt_llm_request_metrics", "waiting")}


class TritonMetrics:
    """Engine metrics on Triton's /metrics: TensorRT-LLM backend's gauge families (same names
    and labels), plus token and outcome counters."""

    def __init__(self, model: str, version: str) -> None:
        gauge, counter = pb_utils.MetricFamily.GAUGE, pb_utils.MetricFamily.COUNTER
        # Triton invalidates a Metric once its family is garbage-collected: keep the families.
        self._families = {
            name: pb_utils.MetricFamily(name=name, description=description, kind=gauge)
            for name, (description, _) in FAMILIES.items()
        }
        for name, description in (
            ("tritonbox_engine_generated_tokens_total", "Tokens generated"),
            ("tritonbox_engine_finished_requests_total", "Requests done, by outcome"),
        ):
            self._families[name] = pb_utils.MetricFamily(
                name=name, description=description, kind=counter
            )
        labels = {"model": model, "version": version}
        self._gauges = {
            key: self._families[key[0]].Metric(labels={**labels, FAMILIES[key[0]][1]: key[1]})
            for key in nvidia_values(IterationStats(0, 0, 0, 0, 0, 0, 0, 0, 0, 0))
        }
        self._tokens = self._families["tritonbox_engine_generated_tokens_total"].Metric(labels={})
        finished = self._families["tritonbox_engine_finished_requests_total"]
        self._finished = {name: finished.Metric(labels={"outcome": name}) for name in OUTCOMES}
        self._pending_tokens = 0
        self._last: dict[tuple[str, str], float] = {}
        self._full_at = 0.0
        self._idle_written = False

    def on_iteration(self, stats: IterationStats) -> None:
        now = time.monotonic()
        idle = not (stats.active or stats.waiting)
        full = now - self._full_at >= FULL_UPDATE_S or (idle and not self._idle_written)
        if full:
            self._full_at, self._idle_written = now, idle
            if self._pending_tokens:
                self._tokens.increment(self._pending_tokens)
                self._pending_tokens = 0
        for key, value in nvidia_values(stats).items():
            # Only changes: an idle engine iterates 20 times a second for nothing.
            if (full or key in IMMEDIATE) and self._last.get(key) != value:
                self._gauges[key].set(value)
                self._last[key] = value

    def on_tokens(self, count: int) -> None:
        self._pending_tokens += count

    def on_finished(self, outcome: str) -> None:
        self._finished[outcome].increment(1)
