"""The workers benchmark's report maths (scripts/benchmarks/workers_report.py and _targets.py) on
made-up batches: no server, no timing."""

from __future__ import annotations

import statistics
from types import ModuleType
from typing import Any

import pytest
from tritonbox_testing.repo_scripts import script_module


@pytest.fixture(scope="module")
def bench() -> tuple[ModuleType, ModuleType, ModuleType]:
    support = script_module("scripts.benchmarks.api_report")
    report = script_module("scripts.benchmarks.workers_report")
    targets = script_module("scripts.benchmarks.workers_targets")
    return support, report, targets


def make(support: ModuleType, path: str, c: int, tok_s: float, ttft_ms: float, **cpu: float) -> Any:
    """A batch of 4 requests of 250 tokens (1 000 tokens) at `tok_s`, each `ttft_ms` to first."""
    wall = 1000 / tok_s
    samples = [(ttft_ms / 1000, 250)] * 4
    return support.Batch(path, c, 0, wall, samples, {k: v * wall for k, v in cpu.items()})


def test_percentile_interpolates_like_inclusive_quantiles(bench: Any) -> None:
    _, report, _ = bench
    values = [5.0, 1.0, 9.0, 3.0, 7.0, 2.0]
    for q in (0.1, 0.5, 0.9):
        expected = statistics.quantiles(values, n=10, method="inclusive")[round(q * 10) - 1]
        assert report.percentile(values, q) == pytest.approx(expected)
    assert report.percentile([4.0], 0.9) == 4.0


def test_summary_cpu_per_1k_tokens_busy_and_others(bench: Any) -> None:
    support, report, _ = bench
    # cpu given in cores (CPU seconds per wall second): at 500 tok/s, 0.1 core of api is
    # 0.2 ms per token = 200 ms per 1 000 tokens.
    batches = [
        make(support, "p", 64, 500, 100, api=0.1, all_apis=0.15, triton=0.5, db=0.05,
             client=0.2, machine=1.8),
        make(support, "p", 64, 400, 300, api=0.1, all_apis=0.15, triton=0.5, db=0.05,
             client=0.2, machine=1.8),
        make(support, "p", 64, 600, 200, api=0.1, all_apis=0.15, triton=0.5, db=0.05,
             client=0.2, machine=1.8),
    ]  # fmt: skip
    s = report.summarise(batches)
    assert s.tok_s == 500  # the median batch
    assert s.ttft_p50_ms == pytest.approx(200)
    # 3 000 tokens in 2 + 2.5 + 1.67 s: api 0.1 core over that wall time.
    wall = sum(b.wall_s for b in batches)
    assert s.cpu_ms_per_1k["api"] == pytest.approx(0.1 * wall * 1000 / 3)
    assert s.busy == pytest.approx(1.8)
    assert s.others == pytest.approx(1.8 - 0.15 - 0.5 - 0.05 - 0.2)  # the api's own not again


def test_targets_verdicts(bench: Any) -> None:
    support, report, targets = bench
    lite, pg = report.Config(1, "sqlite"), report.Config(1, "postgresql")
    cpu = {"triton": 0.5, "all_apis": 0.1, "db": 0.0, "client": 0.1}
    batches = [
        make(support, report.GRPC, 64, 1000, 100, api=0.0, machine=1.0, **cpu),
        make(support, lite.name, 64, 1000, 140, api=0.1, machine=1.0, **cpu),  # 100 ms / 1k
        make(support, pg.name, 64, 900, 200, api=0.2, machine=1.99, **cpu),  # saturated
    ]
    lines = "\n".join(targets.targets(report.summaries(batches), [lite, pg], [64]))
    assert "≤ 150 ms: **not met** — api ×1, SQLite: 100 ms, api ×1, PostgreSQL: 222 ms" in lines
    # Only the SQLite row had free cores: +40 ms is within 50.
    assert "not saturated: **met** — rows with free cores: api ×1, SQLite;" in lines
    assert "×1 c=64: +10.0%" in lines
    assert "throughput (vs SQLite, same workers and concurrency): **not met**" in lines
    # PostgreSQL's extra CPU per 1k tokens: api 222 - 100 = 122, over SQLite's path's 700
    # (api 100 + Triton 500 + client 100) + 122.
    assert "it should cost +14.9% to +14.9%" in lines
