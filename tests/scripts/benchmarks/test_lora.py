"""The LoRA benchmark's pieces (scripts/benchmarks/lora_support.py, _report.py) without a server:
adapters made on a tiny random Llama, the request tensors they become, and the page's maths on
made-up batches."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
from tritonbox_testing.repo_scripts import script_module

from tritonbox_common.lora import read_peft_adapter, task_id, to_lora_tensors


@pytest.fixture(scope="module")
def bench() -> tuple[ModuleType, ModuleType]:
    import peft  # noqa: F401  (before the scripts: repo_scripts.py says why)

    report = script_module("scripts.benchmarks.lora_report")
    return script_module("scripts.benchmarks.lora_support"), report


def tiny_llama() -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8,
    )  # fmt: skip
    return LlamaForCausalLM(config)


def test_adapters_are_distinct_random_peft_folders_that_become_request_tensors(
    bench: tuple[ModuleType, ModuleType], tmp_path: Path
) -> None:
    support, _ = bench
    modules = ("q_proj", "v_proj", "down_proj")
    paths = support.make_adapters(tmp_path, 2, 4, modules, tiny_llama, "org/tiny")
    adapters = [read_peft_adapter(path) for path in paths]
    assert [a.base_model for a in adapters] == ["org/tiny", "org/tiny"]
    assert adapters[0].target_modules == modules and adapters[0].rank == 4
    assert adapters[0].sha256 != adapters[1].sha256
    # init_lora_weights=False: B is random, so the adapter changes the output.
    assert all(np.abs(b).max() > 0 for _, b in adapters[0].weights.values())

    tensors = to_lora_tensors(adapters[0], np.float32)
    first = {t.name(): t for t in support.lora_inputs(adapters[0], tensors, "FP32")}
    assert set(first) == {"lora_task_id", "lora_weights", "lora_config"}
    assert first["lora_task_id"].datatype() == "UINT64"
    assert first["lora_task_id"].shape() == [1, 1]
    rows = 2 * len(modules)  # two layers
    assert first["lora_weights"].shape() == [1, rows, tensors[0].shape[1]]
    assert first["lora_weights"].datatype() == "FP32"
    assert (first["lora_config"].shape(), first["lora_config"].datatype()) == (
        [1, rows, 3],
        "INT32",
    )
    later = support.lora_inputs(adapters[0], None, "FP32")
    assert [t.name() for t in later] == ["lora_task_id"]
    id_bytes = later[0]._get_content()  # the raw little-endian UINT64 sent to Triton
    assert int.from_bytes(id_bytes, "little") == task_id(adapters[0].sha256)

    times = support.load_times(paths[0], 3, np.float32)
    assert len(times) == 3 and all(t > 0 for t in times)


def batch(
    report: ModuleType, path: str, mix: str, repeat: int, wall: float, others: float = 0.1
) -> Any:
    # 8 requests of 32 tokens, TTFTs 0.1 .. 0.8 s; Triton's CPU: 1.5 cores for the wall time
    samples = [(0.1 * (i + 1), 32) for i in range(8)]
    return report.Batch(path, mix, repeat, wall, samples, others, 1.6, engine_cpu_s=1.5 * wall)


def test_the_page_quotes_the_median_ratio_and_each_back_to_back_pair(
    bench: tuple[ModuleType, ModuleType],
) -> None:
    _, report = bench
    base, mixed = report.BASE, report.MIXED
    # 256 tokens per batch: base at 25.6 tok/s (10 s); adapters 12.5, 11, 20 s -> 0.80, 0.91, 0.5
    batches = [
        batch(report, "Triton gRPC", base, 0, 10.0),
        batch(report, "Triton gRPC", mixed, 0, 12.5),
        batch(report, "Triton gRPC", mixed, 1, 11.0),
        batch(report, "Triton gRPC", base, 1, 10.0),
        batch(report, "Triton gRPC", base, 2, 10.0),
        batch(report, "Triton gRPC", mixed, 2, 20.0, others=1.2),  # a noisy neighbour
    ]
    assert report.paired_ratios(batches, "Triton gRPC") == pytest.approx([0.8, 10 / 11, 0.5])
    quiet = report.paired_ratios(batches, "Triton gRPC", quiet=True)
    assert quiet == pytest.approx([0.8, 10 / 11])
    loads = [report.LoadTime("rank 16, q k v o_proj", 7_400_000, [0.02, 0.03, 0.025])]
    setup = {"command": "bench", "elapsed": "1 min", "engine": "e", "workload": "w",
             "adapters": "a"}  # fmt: skip
    page = report.report(batches, loads, setup, (1.0, 2.0))
    # Median batches: base 25.6 tok/s, adapters 256 / 12.5 = 20.48 tok/s: 0.80x, met.
    # Triton CPU per token: 1.5 cores x 10 s / 256 = 58.6 ms (base), x 12.5 s = 73.2 ms.
    assert "| Triton gRPC | 4 adapters | 20.5 (20.5, 23.3, 12.8) | 0.80 | 450 | 73.2 | 0.47 |" \
        in page  # fmt: skip
    assert "≥ 0.8× throughput: **met** — 0.80× (medians; each repeat's back-to-back pair: " \
        "0.80, 0.91, 0.50; the pairs during which the others used under 0.25 cores: 0.80, " \
        "0.91)" in page  # fmt: skip
    assert "a token with adapters costs 1.25× a base token: 0.80× the base's throughput" in page
    assert "1 of 3 pairs fall below it." in page
    assert "| rank 16, q k v o_proj | 7.4 | 25 | 20 | 30 | 3 |" in page
    assert "Load of rank 16, q k v o_proj ≤ 1 s: **met** — 25 ms (median)." in page
    slower = [*batches[:1], batch(report, "Triton gRPC", mixed, 0, 13.0)]
    assert "**not met** — 0.77×" in report.report(slower, loads, setup, (1.0, 2.0))


def test_the_in_process_step_runs_the_engine_layers_on_both_plans(
    bench: tuple[ModuleType, ModuleType], tmp_path: Path
) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    support, _ = bench
    torch.set_num_threads(1)

    def base() -> Any:
        return AutoModelForCausalLM.from_pretrained(support.DEFAULT_MODEL, dtype=torch.float32)

    path = support.make_adapters(tmp_path, 1, 2, ("q_proj",), base)[0]
    base_s, mixed_s = support.step_times([read_peft_adapter(path)], [1, 2, 3], rows=2, steps=3)
    assert len(base_s) == len(mixed_s) == 3
    assert all(t > 0 for t in base_s + mixed_s)
