"""The per-model page's gathering (scripts/benchmarks/vllm_families.py) on made-up runs: a run
replaces its model's rows from the same kind of CPU only, and the page names each row's CPU."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from tritonbox_testing.repo_scripts import script_module


@pytest.fixture(scope="module")
def families() -> ModuleType:
    return script_module("scripts.benchmarks.vllm_families")


def _run(
    families: ModuleType,
    monkeypatch: pytest.MonkeyPatch,
    data: Path,
    cpu: str,
    tok_s: float,
    emulated: str | None = None,
) -> None:
    Model = script_module("scripts.benchmarks.vllm_models").Model
    report = script_module("scripts.benchmarks.vllm_report")
    PEER, Batch, Server = report.PEER, report.Batch, report.Server

    def batch(path: str) -> Any:  # 2 requests of 11 tokens over `wall` s
        return Batch(path, 1, 22 / tok_s, [(0.1, 11, 1.1), (0.1, 11, 1.1)], 0.0)

    servers = [Server("TritonBox", 1.0, {}, [batch(families.OURS)]),
               Server("vLLM", 1.0, {}, [batch(PEER)])]  # fmt: skip
    model = Model("random qwen3", data.parent, "qwen3", random=True, default=False)
    args = argparse.Namespace(tokens=11, repeats=1, concurrency=[1], emulated=emulated)
    monkeypatch.setattr(families, "_cpu", lambda: cpu)  # the machine this run is said to be on
    families.record(model, servers, args, None, data)


def test_a_run_replaces_its_own_cpus_rows_only(
    families: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = tmp_path / "families.json"
    _run(families, monkeypatch, data, "AMX, bfloat16", 30.0)
    _run(families, monkeypatch, data, "AVX2, float32", 9.0)
    _run(families, monkeypatch, data, "AVX2, float32", 10.0)
    _run(families, monkeypatch, data, "AVX2, float32", 12.0, emulated="emulated on AMX")
    entries = json.loads(data.read_text())
    assert [(e["cpu"], round(e["rows"]["1"]["ours"]["tok_s"], 6)) for e in entries] == [
        ("AMX, bfloat16", 30.0),
        ("AVX2, float32", 10.0),
        ("AVX2, float32 (emulated on AMX)", 12.0),  # beside the real machine's, not over it
    ]
    page = families.page(data)
    assert "| random qwen3 | qwen3 | random | AMX, bfloat16 | 1 | 30.0 (30–30) |" in page
    assert "| random qwen3 | qwen3 | random | AVX2, float32 | 1 | 10.0 (10–10) |" in page


def test_this_machines_cpu(families: ModuleType) -> None:
    unit, dtype = families._cpu().split(", ")
    assert unit in {"AMX", "AVX512-BF16", "AVX-512", "AVX2", "no AVX2"}
    assert dtype in {"bfloat16", "float32"}
