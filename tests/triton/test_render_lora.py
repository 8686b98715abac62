"""LoRA settings reach the rendered configs: the cpu engine's parameters, and the ensemble's
lora_weights type matching each flavour's engine step."""

from __future__ import annotations

import json
import re
from pathlib import Path

from tritonbox_triton.render import render_repository
from tritonbox_triton.settings import TritonSettings


def parameter(config: str, key: str) -> str:
    match = re.search(rf'key: "{key}"\s*value: {{ string_value: "([^"]*)" }}', config)
    assert match is not None, key
    return match.group(1)


def input_type(config: str, name: str) -> str:
    match = re.search(rf'name: "{name}"\s*data_type: (\w+)', config)
    assert match is not None, name
    return match.group(1)


def test_cpu_engine_gets_the_lora_settings(cpu: TritonSettings, tmp_path: Path) -> None:
    settings = cpu.model_copy(update={"max_lora_rank": 16, "lora_cache_host_memory_bytes": 12345})
    repository = render_repository(settings, out_dir=tmp_path / "repo")
    engine = (repository / "tensorrt_llm" / "config.pbtxt").read_text()
    assert parameter(engine, "max_lora_rank") == "16"
    assert parameter(engine, "lora_cache_host_memory_bytes") == "12345"
    modules = parameter(engine, "lora_target_modules").split()
    assert modules == ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    ensemble = (repository / "ensemble" / "config.pbtxt").read_text()
    assert input_type(engine, "lora_weights") == input_type(ensemble, "lora_weights") == "TYPE_FP32"
    assert 'input_map { key: "lora_task_id" value: "lora_task_id" }' in ensemble


def test_trtllm_lora_weights_take_the_engine_dtype(
    trtllm: TritonSettings, engine_dir: Path, tmp_path: Path
) -> None:
    config = json.loads((engine_dir / "config.json").read_text())
    config["pretrained_config"]["dtype"] = "bfloat16"
    (engine_dir / "config.json").write_text(json.dumps(config))
    repository = render_repository(trtllm, out_dir=tmp_path / "repo")
    engine = (repository / "tensorrt_llm" / "config.pbtxt").read_text()
    ensemble = (repository / "ensemble" / "config.pbtxt").read_text()
    assert input_type(engine, "lora_weights") == input_type(ensemble, "lora_weights") == "TYPE_BF16"
