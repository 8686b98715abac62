"""The rendered `tensorrt_llm` config (trtllm flavour) against NVIDIA's TensorRT-LLM 0.20 template.

The reference, nvidia_tensorrt_llm_0_20.json, is derived from NVIDIA/TensorRT-LLM
`triton_backend/all_models/inflight_batcher_llm/tensorrt_llm/config.pbtxt` and the C++ backend's
`model_instance_state.cc` / `model_state.cc` (TensorRT-LLM 0.20; commits and caveats in
SOURCE.md next to this file). A config that passes declares only tensors the backend knows, with
its types and shapes, and every parameter the backend reads without a fallback, with values it
parses — what a GPU would otherwise be needed to find out.
"""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from tritonbox_triton.engine_check import BUILD_IMAGE, TRTLLM_VERSION
from tritonbox_triton.render import render_repository
from tritonbox_triton.settings import TritonSettings

REFERENCE = Path(__file__).with_name("nvidia_tensorrt_llm_0_20.json")
REPO_ROOT = Path(__file__).resolve().parents[3]
# NVIDIA's Triton release -> the TensorRT-LLM it carries (the Triton/TRT-LLM support matrix).
TRITON_RELEASE_TRTLLM = {"25.06": "0.20.0"}


@cache
def reference() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(REFERENCE.read_text())
    return data


def rendered(settings: TritonSettings, out: Path) -> Any:
    config = model_config_pb2.ModelConfig()
    repository = render_repository(settings, out_dir=out)
    text_format.Parse((repository / "tensorrt_llm" / "config.pbtxt").read_text(), config)
    return config


def type_name(data_type: int) -> str:
    return str(model_config_pb2.DataType.Name(data_type))


# The engine of the `trtllm` fixture has `logits_dtype` float32 (pretrained_config), which
# render.py writes where NVIDIA's template has ${logits_datatype} (engine_logits.py).
LOGITS_TYPES = {"context_logits": "TYPE_FP32"}


@pytest.fixture
def config(trtllm: TritonSettings, tmp_path: Path) -> Any:
    return rendered(trtllm, tmp_path / "repo")


def test_backend_and_instances(config: Any) -> None:
    assert config.name == "tensorrt_llm" and config.backend == "tensorrtllm"
    # The template's instance group: one CPU-kind instance; the backend drives the GPUs.
    assert [(group.count, group.kind) for group in config.instance_group] == [
        (1, model_config_pb2.ModelInstanceGroup.KIND_CPU)
    ]


def test_inputs_are_nvidias(config: Any) -> None:
    theirs = {tensor["name"]: tensor for tensor in reference()["inputs"]}
    for tensor in config.input:
        assert tensor.name in theirs, f"{tensor.name} is not an input of NVIDIA's template"
        want = theirs[tensor.name]
        where = f"input {tensor.name}"
        assert type_name(tensor.data_type) == want["data_type"], where
        assert list(tensor.dims) == want["dims"], where
        assert tensor.HasField("reshape") == want["reshape"], where
        if want["reshape"]:
            assert list(tensor.reshape.shape) == [], where
        assert tensor.allow_ragged_batch == want["allow_ragged_batch"], where
        # Stricter is fine (we always send it); optional where the backend requires it is not.
        assert want["optional"] or not tensor.optional, where
    required = {name for name, tensor in theirs.items() if not tensor["optional"]}
    assert required <= {tensor.name for tensor in config.input}


def test_outputs_are_nvidias(config: Any) -> None:
    theirs = {tensor["name"]: tensor for tensor in reference()["outputs"]}
    ours = {tensor.name: tensor for tensor in config.output}
    assert {"output_ids", "sequence_length"} <= set(ours)
    for name, tensor in ours.items():
        assert name in theirs, f"{name} is not an output of NVIDIA's template"
        expected = theirs[name]["data_type"]
        if expected == "${logits_datatype}":  # fill_template's choice: the engine's logits dtype
            expected = LOGITS_TYPES[name]
        assert type_name(tensor.data_type) == expected, name
        assert list(tensor.dims) == theirs[name]["dims"], name


def test_parameter_keys_are_nvidias_and_complete(config: Any) -> None:
    # TritonBox's own keys are for the api; the backend reads parameters by name only.
    ours = set(config.parameters) - set(reference()["tritonbox_parameters"]["keys"])
    unknown = ours - set(reference()["parameters"])
    assert not unknown, f"not parameters of NVIDIA's template: {sorted(unknown)}"
    # Each of these missing fails model instance creation ("Cannot find parameter with name").
    missing = set(reference()["required_parameters"]) - ours
    assert not missing, f"the backend reads these without a fallback: {sorted(missing)}"
    assert not ours & set(reference()["forbidden_parameters"])


def test_parameter_values_parse_as_the_backend_parses_them(config: Any) -> None:
    ref = reference()
    values = {key: value.string_value for key, value in config.parameters.items()}
    assert not [value for value in values.values() if "${" in value], values
    for key in ref["boolean_parameters"]:
        if key in values:
            assert values[key] in ref["boolean_values"], f"{key}={values[key]!r}"
    for key, choices in ref["choices"].items():
        if key in values:
            assert values[key] in choices, f"{key}={values[key]!r}"
    # Read inside try/catch: empty means "not set", anything else must parse.
    for key in ref["integer_parameters"]:
        if values.get(key):
            int(values[key])
    for key in ref["float_parameters"]:
        if values.get(key):
            float(values[key])
    assert values["gpt_model_path"], "the engine path must be set"


def test_guided_decoding_is_off_until_configured(config: Any) -> None:
    # The backend turns guided decoding on only with both a backend and a tokenizer-info path;
    # this engine folder has no tokenizer info (test_guided_decoding.py: with one).
    values = {key: value.string_value for key, value in config.parameters.items()}
    assert values["guided_decoding_backend"] == ""
    assert values["xgrammar_tokenizer_info_path"] == ""


def test_gpu_flavour_sizes_the_kv_cache_by_memory(config: Any) -> None:
    # Empty token cap = the backend sizes the KV cache by kv_cache_free_gpu_mem_fraction.
    assert config.parameters["max_tokens_in_paged_kv_cache"].string_value == ""
    assert float(config.parameters["kv_cache_free_gpu_mem_fraction"].string_value) == 0.9


def test_the_image_runs_the_tensorrt_llm_the_checks_expect() -> None:
    dockerfile = (REPO_ROOT / "triton" / "Dockerfile").read_text()
    releases = set(
        re.findall(r"nvcr\.io/nvidia/tritonserver:(\d\d\.\d\d)-trtllm-python-py3", dockerfile)
    )
    assert releases, "triton/Dockerfile names no tritonserver TensorRT-LLM image"
    for release in releases:
        assert TRITON_RELEASE_TRTLLM.get(release) == TRTLLM_VERSION, (
            f"tritonserver {release}: add its TensorRT-LLM version here, re-derive "
            "nvidia_tensorrt_llm_0_20.json and update TRTLLM_VERSION"
        )
    # Engines must be built by the same version (scripts/build_engine.py's documented image).
    assert BUILD_IMAGE in (REPO_ROOT / "scripts" / "build_engine.py").read_text()
