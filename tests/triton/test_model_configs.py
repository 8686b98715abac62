"""The rendered model configs, parsed with Triton's own ModelConfig schema: their values, and
the ensemble's wiring checked the way Triton checks it at load time (without a server)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from tritonbox_triton.render import render_repository
from tritonbox_triton.settings import TritonSettings

MODELS = {"ensemble", "preprocessing", "postprocessing", "tensorrt_llm"}
ModelConfig = Any  # model_config_pb2.ModelConfig (generated code, untyped)


def parse(repository: Path) -> dict[str, ModelConfig]:
    configs = {}
    for name in MODELS:
        config = model_config_pb2.ModelConfig()
        text_format.Parse((repository / name / "config.pbtxt").read_text(), config)
        configs[name] = config
    return configs


def compatible(a: ModelConfig, b: ModelConfig) -> bool:
    """Same data type, and dims equal where neither is -1."""
    return bool(
        a.data_type == b.data_type
        and len(a.dims) == len(b.dims)
        and all(x == y or -1 in (x, y) for x, y in zip(a.dims, b.dims, strict=True))
    )


def check_ensemble_wiring(configs: dict[str, ModelConfig]) -> None:
    """What Triton checks when it loads the ensemble, checked without a server."""
    ensemble = configs["ensemble"]
    tensors = {tensor.name: tensor for tensor in ensemble.input}
    produced: set[str] = set()
    for step in ensemble.ensemble_scheduling.step:
        model = configs[step.model_name]
        inputs = {tensor.name: tensor for tensor in model.input}
        outputs = {tensor.name: tensor for tensor in model.output}
        for key, tensor in step.input_map.items():
            assert key in inputs, f"{step.model_name} has no input {key}"
            assert tensor in tensors, f"{step.model_name}.{key} reads {tensor}, made by no one yet"
            assert compatible(tensors[tensor], inputs[key]), f"{step.model_name}.{key} vs {tensor}"
        required = {name for name, tensor in inputs.items() if not tensor.optional}
        assert required <= set(step.input_map), f"{step.model_name} misses a required input"
        for key, tensor in step.output_map.items():
            assert key in outputs, f"{step.model_name} has no output {key}"
            assert tensor not in produced, f"{tensor} is produced twice"
            produced.add(tensor)
            tensors[tensor] = outputs[key]
    for output in ensemble.output:
        assert output.name in produced, f"ensemble output {output.name} is produced by no step"
        assert compatible(tensors[output.name], output), f"ensemble output {output.name}"


def test_cpu_configs(cpu: TritonSettings, tmp_path: Path, tokenizer_dir: Path) -> None:
    configs = parse(render_repository(cpu, out_dir=tmp_path / "repo"))
    engine = configs["tensorrt_llm"]
    assert engine.name == "tensorrt_llm" and engine.backend == "python"  # the cpu template
    assert engine.parameters["model_dir"].string_value == str(tokenizer_dir)
    assert engine.parameters["max_tokens_in_paged_kv_cache"].string_value == "65536"
    assert engine.model_transaction_policy.decoupled is True
    # No dynamic batcher in front of the engine step (it held requests 500 ms: config.pbtxt);
    # MAX_QUEUE_SIZE is the engine's own bound.
    assert not engine.HasField("dynamic_batching")
    assert engine.parameters["max_queue_size"].string_value == "64"
    for name in MODELS:
        assert configs[name].max_batch_size == 16, name
    pre = configs["preprocessing"]
    assert pre.parameters["tokenizer_dir"].string_value == str(tokenizer_dir)
    assert pre.parameters["max_input_len"].string_value == "2048"
    assert pre.instance_group[0].count == 1
    check_ensemble_wiring(configs)


def test_trtllm_configs(trtllm: TritonSettings, tmp_path: Path, engine_dir: Path) -> None:
    settings = trtllm.model_copy(
        update={"max_batch_size": 8, "kv_cache_max_tokens": 0, "postprocessing_instance_count": 3}
    )
    configs = parse(render_repository(settings, out_dir=tmp_path / "repo"))
    engine = configs["tensorrt_llm"]
    assert engine.backend == "tensorrtllm"
    params = {key: value.string_value for key, value in engine.parameters.items()}
    assert params["gpt_model_path"] == str(engine_dir)
    assert params["gpt_model_type"] == "inflight_fused_batching"
    assert params["batch_scheduler_policy"] == "guaranteed_no_evict"
    assert params["max_tokens_in_paged_kv_cache"] == ""  # 0: bounded by the memory fraction
    assert params["kv_cache_free_gpu_mem_fraction"] == "0.9"
    assert params["enable_kv_cache_reuse"] == "false"
    assert engine.max_batch_size == 8
    assert configs["postprocessing"].instance_group[0].count == 3
    check_ensemble_wiring(configs)


def test_synthetic_configs(
    synthetic: TritonSettings, cpu: TritonSettings, tmp_path: Path, tokenizer_dir: Path
) -> None:
    configs = parse(render_repository(synthetic, out_dir=tmp_path / "synthetic"))
    cpu_engine = parse(render_repository(cpu, out_dir=tmp_path / "cpu"))["tensorrt_llm"]
    engine = configs["tensorrt_llm"]
    assert engine.name == "tensorrt_llm" and engine.backend == "python"
    assert engine.model_transaction_policy.decoupled is True
    params = {key: value.string_value for key, value in engine.parameters.items()}
    assert params["tokenizer_dir"] == str(tokenizer_dir)
    assert params["synthetic_token_interval_s"] == "0.0"
    assert params["max_output_len"] == "1024"
    # A stand-in for the cpu engine: exactly its tensors, so the ensemble cannot tell them apart.
    assert list(engine.input) == list(cpu_engine.input)
    assert list(engine.output) == list(cpu_engine.output)
    assert engine.max_batch_size == cpu_engine.max_batch_size
    check_ensemble_wiring(configs)
