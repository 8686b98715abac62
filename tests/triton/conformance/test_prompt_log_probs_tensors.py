"""Every log-probs tensor the api asks TensorRT-LLM 0.20 for, against NVIDIA's source
(nvidia_tensorrt_llm_0_20.json, SOURCE.md "Log-probs and context logits"): `return_log_probs`
-> `output_log_probs` / `cum_log_probs`, and for `echo` `return_context_logits` ->
`context_logits` [batch, input_len, vocab] in the engine's logits dtype, from an engine built
with `gather_context_logits`. The api's scoring of those logits equals the cpu engine's compact
`prompt_log_probs` extension, which TensorRT-LLM does not have."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from tritonbox_common.client import requested_outputs
from tritonbox_common.prompt_log_probs import from_context_logits
from tritonbox_common.request_tensors import GenerationRequest, build_engine_inputs
from tritonbox_triton.engine_logits import logits_values
from tritonbox_triton.render import render_repository
from tritonbox_triton.settings import TritonSettings

HERE = Path(__file__).parent
EXTENSION: tuple[str, ...] = ("return_prompt_log_probs", "prompt_log_probs")
EXTENSION += ("prompt_top_token_ids", "prompt_top_log_probs")


def nvidia() -> tuple[dict[str, Any], dict[str, Any]]:
    data = json.loads((HERE / "nvidia_tensorrt_llm_0_20.json").read_text())
    return {t["name"]: t for t in data["inputs"]}, {t["name"]: t for t in data["outputs"]}


def gpu_config(settings: TritonSettings, out: Path) -> Any:
    repository = render_repository(settings, out_dir=out)
    text = (repository / "tensorrt_llm" / "config.pbtxt").read_text()
    return text_format.Parse(text, model_config_pb2.ModelConfig())


def test_every_log_probs_tensor_is_nvidia_s(trtllm: TritonSettings, tmp_path: Path) -> None:
    inputs, outputs = nvidia()
    config = gpu_config(trtllm, tmp_path / "repo")
    ours_in = {t.name: t for t in config.input}
    ours_out = {t.name: t for t in config.output}
    for name in ("return_log_probs", "return_context_logits"):
        assert inputs[name]["data_type"] == "TYPE_BOOL" and inputs[name]["dims"] == [1]
        assert inputs[name]["optional"] and inputs[name]["reshape"]  # reshape: [ ]
        assert list(ours_in[name].dims) == [1] and list(ours_in[name].reshape.shape) == []
    assert outputs["output_log_probs"]["data_type"] == "TYPE_FP32"
    assert outputs["output_log_probs"]["dims"] == [-1, -1]  # [batch,] beam, tokens
    assert outputs["cum_log_probs"]["data_type"] == "TYPE_FP32"
    assert outputs["cum_log_probs"]["dims"] == [-1]  # [batch,] beam
    # [batch,] input_len, vocab; the dtype is fill_template's ${logits_datatype}.
    assert outputs["context_logits"]["dims"] == [-1, -1]
    assert outputs["context_logits"]["data_type"] == "${logits_datatype}"
    assert list(ours_out["context_logits"].dims) == [-1, -1]
    assert ours_out["context_logits"].data_type == model_config_pb2.TYPE_FP32  # the engine's
    assert config.parameters["gather_context_logits"].string_value == "false"
    assert not set(EXTENSION) & (set(inputs) | set(outputs))


def test_the_api_asks_a_gpu_engine_only_for_nvidia_s_tensors() -> None:
    inputs, outputs = nvidia()
    sent = GenerationRequest(
        prompt="Hi", max_tokens=1, model="tensorrt_llm", input_ids=[1, 2, 3], stream=False,
        sampling={"return_log_probs": True, "return_context_logits": True},
    )  # fmt: skip
    names = {tensor.name() for tensor in build_engine_inputs(sent)}
    assert {"return_log_probs", "return_context_logits"} <= names <= set(inputs)
    asked = {output.name() for output in requested_outputs(sent, with_text=False)}
    assert asked == {"output_ids", "sequence_length", "output_log_probs", "context_logits"}
    assert asked <= set(outputs)


@pytest.mark.parametrize(
    ("dtype", "gather", "data_type"),
    [("float32", True, "TYPE_FP32"), ("float16", False, "TYPE_FP16")],
)
def test_logits_dtype_and_gather_flag_come_from_the_engine(
    tmp_path: Path, dtype: str, gather: bool, data_type: str
) -> None:
    # trtllm-build 0.20 writes build_config.gather_context_logits; the backend writes
    # context_logits as FP32 or FP16 (the engine's logits dtype), nothing else.
    config: dict[str, Any] = {"pretrained_config": {"logits_dtype": dtype}}
    config["build_config"] = {"gather_context_logits": gather}
    (tmp_path / "config.json").write_text(json.dumps(config))
    values = logits_values(tmp_path)
    assert values == {"logits_data_type": data_type, "gather_context_logits": str(gather).lower()}


def test_scoring_context_logits_equals_torch_log_softmax() -> None:
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(1, 6, 50, generator=generator) * 4
    prompt = [3, 7, 7, 0, 49, 12]
    entries = from_context_logits(logits.numpy(), prompt, top=3)
    expected = torch.log_softmax(logits[0], dim=-1)
    assert entries[0] == (3, None, None)  # the first token has nothing before it
    for i, (token, value, top) in enumerate(entries[1:]):
        assert token == prompt[i + 1]
        assert value == pytest.approx(float(expected[i, token]), abs=1e-5)
        assert top is not None
        best = torch.topk(expected[i], 3)
        assert top[0] == best.indices.tolist()
        np.testing.assert_allclose(top[1], best.values.numpy(), atol=1e-5)
    # FP16 logits (an engine whose logits dtype is float16) are scored in float32.
    half = from_context_logits(logits.half().numpy(), prompt, top=0)
    assert [t for t, _, _ in half] == prompt and half[1][2] is None
