"""Structured output on the GPU flavour, against NVIDIA's TensorRT-LLM 0.20 (the `guided_decoding`
section of nvidia_tensorrt_llm_0_20.json; files and commits in SOURCE.md, "Guided decoding"):
the two inputs with NVIDIA's names and types on every config that declares them, the guide-type
strings the api sends, the ensemble's mapping, the tokenizer-info file the build writes and the
renderer finds, and the backend value that turns it on."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
import types
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from tritonbox_common.guided import GUIDE_TYPES
from tritonbox_common.request_tensors import GenerationRequest, build_engine_inputs, build_inputs
from tritonbox_triton.engine_check import XGRAMMAR_TOKENIZER_INFO
from tritonbox_triton.render import render_repository
from tritonbox_triton.settings import TritonSettings

REFERENCE = Path(__file__).with_name("nvidia_tensorrt_llm_0_20.json")
REPO_ROOT = Path(__file__).resolve().parents[3]
MODELS = REPO_ROOT / "triton/models"


@cache
def nvidia() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(REFERENCE.read_text())
    return data


def guided() -> dict[str, Any]:
    section: dict[str, Any] = nvidia()["guided_decoding"]
    return section


def declared(config: Any) -> dict[str, Any]:
    return {tensor.name: tensor for tensor in config.input}


def parse(text: str) -> Any:
    """A template's structure: its placeholders filled with values that parse (the renderer's
    own values are tested in test_render.py)."""
    config = model_config_pb2.ModelConfig()
    text = text.replace("${lora_weights_data_type}", "TYPE_FP32")
    text_format.Parse(re.sub(r"\$\{[a-z_]+\}", "1", text), config)
    return config


def test_the_guide_types_sent_are_nvidia_s() -> None:
    assert tuple(guided()["guide_types"]) == GUIDE_TYPES


@pytest.mark.parametrize("model", ["tensorrt_llm", "tensorrt_llm_cpu", "tensorrt_llm_synthetic"])
def test_each_engine_step_declares_the_inputs_as_nvidia_s_template(model: str) -> None:
    reference = {t["name"]: t for t in nvidia()["inputs"]}
    tensors = declared(parse((MODELS / model / "config.pbtxt").read_text()))
    for name in guided()["inputs"]:
        ours, theirs = tensors[name], reference[name]
        assert model_config_pb2.DataType.Name(ours.data_type) == theirs["data_type"]
        assert list(ours.dims) == theirs["dims"]
        assert ours.optional is theirs["optional"]
        assert ours.allow_ragged_batch is theirs["allow_ragged_batch"]
        assert not ours.HasField("reshape")


def test_the_ensemble_takes_and_passes_them_as_nvidia_s() -> None:
    config = parse((MODELS / "ensemble/config.pbtxt").read_text())
    tensors = declared(config)
    for name, spec in guided()["ensemble_inputs"].items():
        assert model_config_pb2.DataType.Name(tensors[name].data_type) == spec["data_type"]
        assert list(tensors[name].dims) == spec["dims"]
        assert tensors[name].optional is spec["optional"]
    engine_step = next(s for s in config.ensemble_scheduling.step if s.model_name == "tensorrt_llm")
    for key, value in guided()["ensemble_maps_to_engine_step"].items():
        assert engine_step.input_map[key] == value


def test_the_api_sends_both_as_strings_to_either_model() -> None:
    names = set(guided()["inputs"])
    for guide in (("json", None), ("regex", "[0-9]+")):
        engine = GenerationRequest(prompt="Hi", max_tokens=4, input_ids=[1], guide=guide)
        ensemble = GenerationRequest(prompt="Hi", max_tokens=4, guide=guide)
        for inputs in (build_engine_inputs(engine), build_inputs(ensemble)):
            sent = {t.name(): t for t in inputs if t.name() in names}
            assert set(sent) == {n for n in names if guide[1] is not None or "type" in n}
            assert all(t.datatype() == "BYTES" for t in sent.values())  # TYPE_STRING
            assert all(t.shape() == [1, 1] for t in sent.values())


def rendered(settings: TritonSettings, out: Path) -> dict[str, str]:
    repository = render_repository(settings, out_dir=out)
    config = model_config_pb2.ModelConfig()
    text_format.Parse((repository / "tensorrt_llm" / "config.pbtxt").read_text(), config)
    return {key: value.string_value for key, value in config.parameters.items()}


def test_guided_decoding_is_off_without_the_tokenizer_info(
    trtllm: TritonSettings, tmp_path: Path
) -> None:
    values = rendered(trtllm, tmp_path / "repo")
    assert values["guided_decoding_backend"] == values["xgrammar_tokenizer_info_path"] == ""


def test_guided_decoding_is_on_with_the_tokenizer_info_the_build_wrote(
    trtllm: TritonSettings, engine_dir: Path, tmp_path: Path
) -> None:
    assert guided()["tokenizer_info_file"] == XGRAMMAR_TOKENIZER_INFO
    info = engine_dir / XGRAMMAR_TOKENIZER_INFO
    info.write_text(json.dumps({key: [] for key in guided()["tokenizer_info_keys"]}))
    values = rendered(trtllm, tmp_path / "repo")
    assert (
        values["guided_decoding_backend"]
        == guided()["backend_parameter_values"]["guided_decoding_backend"]
    )
    assert values["guided_decoding_backend"] in nvidia()["choices"]["guided_decoding_backend"]
    assert values["xgrammar_tokenizer_info_path"] == str(info.resolve())


def test_the_build_writes_what_nvidia_s_script_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """build_engine.py calls TensorRT-LLM's own `_xgrammar_tokenizer_info` (stubbed here: it
    exists only in NVIDIA's container) and writes its JSON under the name the renderer finds."""
    spec = importlib.util.spec_from_file_location(
        "build_engine", REPO_ROOT / "scripts/build_engine.py"
    )
    assert spec is not None and spec.loader is not None
    build_engine = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "build_engine", build_engine)  # for its dataclasses
    spec.loader.exec_module(build_engine)
    assert build_engine.XGRAMMAR_TOKENIZER_INFO == XGRAMMAR_TOKENIZER_INFO
    keys = guided()["tokenizer_info_keys"]
    stub = types.ModuleType("tensorrt_llm.llmapi.tokenizer")
    stub._xgrammar_tokenizer_info = lambda tokenizer: {key: [key] for key in keys}  # type: ignore[attr-defined]
    for name in ("tensorrt_llm", "tensorrt_llm.llmapi"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "tensorrt_llm.llmapi.tokenizer", stub)
    transformers = types.ModuleType("transformers")
    transformers.AutoTokenizer = types.SimpleNamespace(from_pretrained=lambda path: path)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "transformers", transformers)
    path = build_engine.write_xgrammar_tokenizer_info(tmp_path, tmp_path)
    assert path == tmp_path / XGRAMMAR_TOKENIZER_INFO
    assert sorted(json.loads(path.read_text())) == sorted(keys)
