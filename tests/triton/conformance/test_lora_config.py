"""The trtllm `tensorrt_llm` config's LoRA part against NVIDIA's TensorRT-LLM 0.20 sources.

The reference is the `lora` section of nvidia_tensorrt_llm_0_20.json (SOURCE.md, "LoRA", names
the files, commits and lines read): the three request tensors of the template, the runtime's
rule that `lora_weights` has the engine's dtype, the LoRA cache parameters the backend reads,
and the error a request with an uncached task id gets — the text the api matches to resend.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from tritonbox_triton.engine_lora import DEFAULT_TRTLLM_TO_HF, read_engine_lora
from tritonbox_triton.render import placeholder_values, render_repository
from tritonbox_triton.settings import TritonSettings

REFERENCE = json.loads(Path(__file__).with_name("nvidia_tensorrt_llm_0_20.json").read_text())
LORA = REFERENCE["lora"]
# What build_engine.py passes to --lora_target_modules (all the Llama projections).
TARGETS = ["attn_q", "attn_k", "attn_v", "attn_dense", "mlp_h_to_4h", "mlp_gate", "mlp_4h_to_h"]


def with_lora(engine_dir: Path, *, rank: int = 16, dtype: str = "float16") -> Path:
    """The conftest engine, as `trtllm-build --lora_plugin <dtype> --max_lora_rank <rank>
    --lora_target_modules ...` writes it (build_config.lora_config, plugin_config.lora_plugin)."""
    path = engine_dir / "config.json"
    config = json.loads(path.read_text())
    config["pretrained_config"]["dtype"] = dtype
    config["build_config"]["plugin_config"] = {"lora_plugin": dtype}
    config["build_config"]["lora_config"] = {
        "lora_dir": [],
        "lora_ckpt_source": "hf",
        "max_lora_rank": rank,
        "lora_target_modules": TARGETS,
        "trtllm_modules_to_hf_modules": {},
    }
    path.write_text(json.dumps(config))
    return engine_dir


def rendered(settings: TritonSettings, out: Path) -> Any:
    config = model_config_pb2.ModelConfig()
    repository = render_repository(settings, out_dir=out)
    text_format.Parse((repository / "tensorrt_llm" / "config.pbtxt").read_text(), config)
    return config


def parameters(config: Any) -> dict[str, str]:
    return {key: value.string_value for key, value in config.parameters.items()}


def inputs(config: Any) -> dict[str, Any]:
    return {tensor.name: tensor for tensor in config.input}


def test_the_three_lora_inputs_are_nvidias(
    trtllm: TritonSettings, engine_dir: Path, tmp_path: Path
) -> None:
    with_lora(engine_dir)
    ours = inputs(rendered(trtllm, tmp_path / "repo"))
    theirs = {tensor["name"]: tensor for tensor in REFERENCE["inputs"]}
    for name in LORA["inputs"]:
        tensor, want = ours[name], theirs[name]
        assert model_config_pb2.DataType.Name(tensor.data_type) == want["data_type"], name
        assert list(tensor.dims) == want["dims"], name
        assert tensor.optional and want["optional"], name
        assert tensor.allow_ragged_batch == want["allow_ragged_batch"], name
        assert tensor.HasField("reshape") == want["reshape"], name
    assert LORA["config_columns"] == ["module_id", "layer_idx", "adapter_size"]
    assert theirs["lora_config"]["dims"][-1] == len(LORA["config_columns"])


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_lora_weights_take_the_engines_dtype(
    trtllm: TritonSettings, engine_dir: Path, tmp_path: Path, dtype: str
) -> None:
    # NVIDIA's template hard-codes TYPE_FP16; the runtime refuses any dtype but the model's.
    with_lora(engine_dir, dtype=dtype)
    weights = inputs(rendered(trtllm, tmp_path / "repo"))["lora_weights"]
    want = LORA["weights_data_type_by_engine_dtype"][dtype]
    assert model_config_pb2.DataType.Name(weights.data_type) == want
    assert "same data type as base model" in LORA["weights_dtype_rule"]


def test_cache_parameters_are_nvidias_and_sized_by_the_engine(
    trtllm: TritonSettings, engine_dir: Path, tmp_path: Path
) -> None:
    with_lora(engine_dir, rank=16)
    values = parameters(rendered(trtllm, tmp_path / "repo"))
    cache = LORA["cache_parameters"]
    ours = {key for key in values if key.startswith("lora_cache")}
    assert ours == {key for key in cache if key.startswith("lora_cache")}
    assert ours <= set(REFERENCE["parameters"])
    # Sent adapters only: a prefetch folder would load adapters the api does not know about.
    assert "lora_prefetch_dir" not in values
    assert values["lora_cache_max_adapter_size"] == "16"  # MAX_LORA_RANK 64, engine 16
    assert int(values["lora_cache_optimal_adapter_size"]) <= 16
    assert (
        float(values["lora_cache_gpu_memory_fraction"])
        == cache["lora_cache_gpu_memory_fraction"]["default"]
    )
    assert int(values["lora_cache_host_memory_bytes"]) == trtllm.lora_cache_host_memory_bytes
    assert values["max_lora_rank"] == "16"
    modules = values["lora_target_modules"].split(" ")
    assert modules == ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def test_an_engine_without_the_plugin_serves_no_adapters(
    trtllm: TritonSettings, tmp_path: Path
) -> None:
    values = parameters(rendered(trtllm, tmp_path / "repo"))
    assert (values["max_lora_rank"], values["lora_target_modules"]) == ("0", "")


def test_max_lora_rank_zero_turns_adapters_off(
    trtllm: TritonSettings, engine_dir: Path, tmp_path: Path
) -> None:
    with_lora(engine_dir)
    values = parameters(rendered(trtllm.model_copy(update={"max_lora_rank": 0}), tmp_path / "r"))
    assert (values["max_lora_rank"], values["lora_target_modules"]) == ("0", "")


def test_module_names_follow_nvidias_mapping(engine_dir: Path) -> None:
    # The Llama MLP is where a wrong guess hides: HF gate_proj is mlp_h_to_4h, up_proj mlp_gate.
    for hf, trtllm in LORA["hf_to_trtllm"].items():
        assert DEFAULT_TRTLLM_TO_HF[trtllm] == hf
    assert read_engine_lora(with_lora(engine_dir)).hf_modules == tuple(
        DEFAULT_TRTLLM_TO_HF[name] for name in TARGETS
    )


def test_the_uncached_task_error_is_what_the_api_matches() -> None:
    # The api resends the weights once when the backend's error contains this substring.
    text = LORA["not_cached_error"].format(task_id=12345)
    assert text == "LoRA task 12345 not found in cache. Please send LoRA weights with request"
    assert "not found in cache" in text


def test_every_flavour_names_the_lora_weights_type(
    cpu: TritonSettings, trtllm: TritonSettings, engine_dir: Path
) -> None:
    # The ensemble passes lora_weights through: its type must be the engine step's.
    assert placeholder_values(cpu)["lora_weights_data_type"] == "TYPE_FP32"
    with_lora(engine_dir, dtype="bfloat16")
    assert placeholder_values(trtllm)["lora_weights_data_type"] == "TYPE_BF16"


def test_the_engines_own_module_mapping_wins(engine_dir: Path) -> None:
    # A build may carry its own TensorRT-LLM -> HF names (lora_config.trtllm_modules_to_hf_modules).
    path = with_lora(engine_dir) / "config.json"
    config = json.loads(path.read_text())
    lora = config["build_config"]["lora_config"]
    lora["trtllm_modules_to_hf_modules"] = {"attn_dense": "out_proj"}
    del lora["max_lora_rank"]  # absent: trtllm-build's default
    path.write_text(json.dumps(config))
    engine = read_engine_lora(engine_dir)
    assert engine.hf_modules[3] == "out_proj" and engine.max_lora_rank == 64
