"""What the api sends the engine step for `ignore_eos` and log-probs, against NVIDIA's
TensorRT-LLM 0.20 `tensorrt_llm` tensors (nvidia_tensorrt_llm_0_20.json, SOURCE.md): with
`logprobs` and no top alternatives, every input and requested output is one NVIDIA's backend
declares, so the GPU flavour serves it; the top alternatives are the cpu engine's extension,
absent from 0.20 (the api refuses them there with a 400)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tritonbox_common.client import requested_outputs
from tritonbox_common.request_tensors import GenerationRequest, build_engine_inputs

REFERENCE = Path(__file__).with_name("nvidia_tensorrt_llm_0_20.json")
CPU_CONFIG = Path(__file__).resolve().parents[3] / "triton/models/tensorrt_llm_cpu/config.pbtxt"
TOP = ("num_top_logprobs", "top_token_ids", "top_log_probs")


def nvidia() -> tuple[dict[str, Any], dict[str, Any]]:
    data = json.loads(REFERENCE.read_text())
    return {t["name"]: t for t in data["inputs"]}, {t["name"]: t for t in data["outputs"]}


def request(**sampling: Any) -> GenerationRequest:
    return GenerationRequest(
        prompt="Hi", max_tokens=4, model="tensorrt_llm", input_ids=[1, 2, 3],
        sampling={"seed": 1, "end_id": -1, "pad_id": 2, **sampling},
    )  # fmt: skip


def test_ignore_eos_and_log_probs_use_only_nvidia_s_tensors() -> None:
    inputs, outputs = nvidia()
    sent = request(return_log_probs=True)
    names = {tensor.name() for tensor in build_engine_inputs(sent)}
    assert {"end_id", "return_log_probs"} <= names <= set(inputs)
    assert inputs["end_id"]["data_type"] == "TYPE_INT32"  # -1 (no end id) fits
    assert inputs["return_log_probs"]["data_type"] == "TYPE_BOOL"
    asked = {output.name() for output in requested_outputs(sent, with_text=False)}
    assert asked == {"output_ids", "sequence_length", "output_log_probs"}
    assert asked <= set(outputs) and outputs["output_log_probs"]["data_type"] == "TYPE_FP32"


def test_top_log_probs_are_the_cpu_engine_s_extension_only() -> None:
    inputs, outputs = nvidia()
    assert not set(TOP) & (set(inputs) | set(outputs))
    sent = request(return_log_probs=True, num_top_logprobs=3)
    assert "num_top_logprobs" in {tensor.name() for tensor in build_engine_inputs(sent)}
    asked = {output.name() for output in requested_outputs(sent, with_text=False)}
    assert {"top_token_ids", "top_log_probs"} <= asked
    cpu = CPU_CONFIG.read_text()
    assert all(f'name: "{name}"' in cpu for name in TOP)
