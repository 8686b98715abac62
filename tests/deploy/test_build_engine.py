"""scripts/build_engine.py without a GPU: the quantize.py and trtllm-build command lines of each
preset, the limits from the settings, the tokenizer copied next to the engine, the upload."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from tritonbox_testing.deploy import REPO

from tritonbox_triton.settings import TritonSettings


def load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("build_engine", REPO / "scripts/build_engine.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["build_engine"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


build_engine = load_script()

GEMMA = [
    "--model=google/gemma-7b-it",
    "--preset=int4_awq",
    "--kv-cache=int8",
    "--output=models/gemma-7b-it-int4-awq",
    "--max-batch-size=64",
    "--max-input-len=3000",
    "--max-output-len=1000",
]


def commands(argv: list[str]) -> tuple[list[str], list[str]]:
    args = build_engine.parse_args(argv)
    checkpoint = Path("/tmp/ckpt")
    return (
        build_engine.quantize_command(args, Path("/hf/gemma"), checkpoint),
        build_engine.build_command(args, checkpoint),
    )


def test_gemma_int4_awq_example() -> None:
    quantize, build = commands(GEMMA)
    assert quantize[1] == "/app/tensorrt_llm/examples/quantization/quantize.py"
    assert {"--qformat=int4_awq", "--kv_cache_dtype=int8", "--dtype=float16"} <= set(quantize)
    assert {"--model_dir=/hf/gemma", "--output_dir=/tmp/ckpt", "--tp_size=1"} <= set(quantize)
    assert build[0] == "trtllm-build"
    assert {
        "--max_batch_size=64",
        "--max_input_len=3000",
        "--max_seq_len=4000",
        "--gpt_attention_plugin=auto",
        "--gemm_plugin=auto",
        "--kv_cache_type=paged",
        "--remove_input_padding=enable",
        "--max_num_tokens=8192",
        "--context_fmha=enable",
        "--output_dir=models/gemma-7b-it-int4-awq",
    } <= set(build)
    # INT8 KV cache: no paged context FMHA (TensorRT-LLM refuses to build it), said explicitly
    # because the 0.20 default is on.
    assert "--use_paged_context_fmha=disable" in build
    assert "--use_paged_context_fmha=enable" not in build
    assert not [flag for flag in build if flag.startswith("--paged_kv_cache")]  # deprecated


@pytest.mark.parametrize(
    ("preset", "kv_cache", "paged_context"),
    [
        ("int4_awq", None, "enable"),
        ("int4_awq", "int8", "disable"),
        ("int4_awq", "fp8", "disable"),  # FP8 paged context FMHA needs the FP8 preset
        ("fp8", "fp8", "enable"),
        ("fp8", "int8", "disable"),
    ],
)
def test_paged_context_fmha_only_where_tensorrt_llm_builds_it(
    preset: str, kv_cache: str | None, paged_context: str
) -> None:
    argv = ["--model=m", "--output=o", f"--preset={preset}"]
    _, build = commands(argv + ([f"--kv-cache={kv_cache}"] if kv_cache else []))
    assert f"--use_paged_context_fmha={paged_context}" in build


def test_max_num_tokens_holds_the_longest_prompt(capsys: pytest.CaptureFixture[str]) -> None:
    # Served without chunked context, a whole prompt must fit one engine step.
    _, build = commands(["--model=m", "--output=o", "--max-input-len=16000"])
    assert "--max_num_tokens=16000" in build
    _, build = commands(["--model=m", "--output=o", "--max-num-tokens=20000"])
    assert "--max_num_tokens=20000" in build
    with pytest.raises(SystemExit):
        build_engine.parse_args(["--model=m", "--output=o", "--max-num-tokens=1000"])
    assert "less than --max-input-len" in capsys.readouterr().err


def test_the_build_container_must_be_the_serving_version(monkeypatch: pytest.MonkeyPatch) -> None:
    from importlib import metadata

    from tritonbox_triton.engine_check import TRTLLM_VERSION

    assert build_engine.TRTLLM_VERSION == TRTLLM_VERSION
    monkeypatch.setattr(metadata, "version", lambda name: "0.19.0")
    assert "has TensorRT-LLM 0.19.0" in build_engine.check_container()
    monkeypatch.setattr(metadata, "version", lambda name: TRTLLM_VERSION)
    assert build_engine.check_container() is None


@pytest.mark.parametrize(
    ("preset", "qformat", "dtype"),
    [
        ("fp16", "full_prec", "float16"),
        ("bf16", "full_prec", "bfloat16"),
        ("int8_wo", "int8_wo", "float16"),
        ("int4_wo", "int4_wo", "float16"),
        ("int4_awq", "int4_awq", "float16"),
        ("w4a8_awq", "w4a8_awq", "float16"),
        ("fp8", "fp8", "float16"),
        ("int8_sq", "int8_sq", "float16"),
    ],
)
def test_presets(preset: str, qformat: str, dtype: str) -> None:
    quantize, build = commands(["--model=m", f"--preset={preset}", "--output=out"])
    assert f"--qformat={qformat}" in quantize and f"--dtype={dtype}" in quantize
    assert ("--gemm_plugin=auto" in build) == (preset != "fp8")
    assert "--use_paged_context_fmha=enable" in build  # enables KV-cache reuse
    assert "--kv_cache_type=paged" in build


def test_limits_come_from_the_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in ("MAX_BATCH_SIZE", "MAX_INPUT_LEN", "MAX_OUTPUT_LEN", "TENSOR_PARALLELISM"):
        monkeypatch.delenv(key, raising=False)
    fields = TritonSettings.model_fields
    args = build_engine.parse_args(["--model=m", "--output=o"])
    assert args.max_batch_size == fields["max_batch_size"].default
    assert args.max_input_len == fields["max_input_len"].default
    assert args.max_output_len == fields["max_output_len"].default
    assert args.tp == fields["tensor_parallelism"].default
    monkeypatch.setenv("MAX_BATCH_SIZE", "64")
    monkeypatch.setenv("TENSOR_PARALLELISM", "2")
    args = build_engine.parse_args(["--model=m", "--output=o"])
    assert (args.max_batch_size, args.tp) == (64, 2)
    quantize, build = commands(["--model=m", "--output=o"])
    assert "--tp_size=2" in quantize and "--workers=2" in build


def test_dry_run_prints_both_commands(capsys: pytest.CaptureFixture[str]) -> None:
    assert build_engine.main([*GEMMA, "--dry-run"]) == 0
    quantize, build = capsys.readouterr().out.splitlines()
    assert "quantize.py" in quantize and build.startswith("trtllm-build ")


def test_tokenizer_travels_with_the_engine(tmp_path: Path) -> None:
    tokenizer_dir = tmp_path / "checkpoint"
    tokenizer_dir.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json", "config.json", "model.safetensors"):
        (tokenizer_dir / name).write_text(name)
    engine = tmp_path / "engine"
    engine.mkdir()
    copied = build_engine.copy_tokenizer(tokenizer_dir, engine)
    assert "tokenizer.json" in copied and "config.json" not in copied  # the engine's stays
    assert (engine / "tokenizer.json").read_bytes() == (
        tokenizer_dir / "tokenizer.json"
    ).read_bytes()


def test_upload(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, Any]] = []

    class FakeApi:
        def __init__(self, token: str | None) -> None:
            calls.append(("token", token))

        def create_repo(self, repo_id: str, **kwargs: Any) -> None:
            calls.append(("create", (repo_id, kwargs)))

        def upload_folder(self, **kwargs: Any) -> None:
            calls.append(("upload", kwargs))

    import huggingface_hub

    monkeypatch.setattr(huggingface_hub, "HfApi", FakeApi)
    monkeypatch.setenv("HF_TOKEN", "hf_write")
    build_engine.upload(tmp_path, "my-org/engine", private=True)
    assert calls[0] == ("token", "hf_write")
    assert calls[1] == ("create", ("my-org/engine", {"private": True, "exist_ok": True}))
    assert calls[2][1]["folder_path"] == str(tmp_path)


def test_the_lora_plugin_follows_max_lora_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    # trtllm-build 0.20: --lora_plugin takes a PluginConfig dtype, --max_lora_rank an int,
    # --lora_target_modules (nargs +) names of LoraManager.LORA_MODULE_IDS (tensorrt_llm/
    # commands/build.py, plugin/plugin.py; tests/triton/conformance/SOURCE.md, "LoRA").
    monkeypatch.delenv("MAX_LORA_RANK", raising=False)
    assert build_engine.parse_args(["--model=m", "--output=o"]).max_lora_rank == (
        TritonSettings.model_fields["max_lora_rank"].default
    )
    _, build = commands(["--model=m", "--output=o", "--preset=bf16", "--max-lora-rank=16"])
    assert "--lora_plugin=bfloat16" in build and "--max_lora_rank=16" in build
    at = build.index("--lora_target_modules")
    modules = build[at + 1 : at + 8]
    assert modules == [
        "attn_q",
        "attn_k",
        "attn_v",
        "attn_dense",
        "mlp_h_to_4h",
        "mlp_gate",
        "mlp_4h_to_h",
    ]
    assert build[at + 8 :] == []  # nargs="+": nothing may follow that is not a module
    monkeypatch.setenv("MAX_LORA_RANK", "0")
    _, build = commands(["--model=m", "--output=o"])
    assert not [flag for flag in build if flag.startswith("--lora") or "lora_rank" in flag]
    monkeypatch.setenv("MAX_LORA_RANK", "8")
    _, build = commands(["--model=m", "--output=o"])  # fp16 preset
    assert "--lora_plugin=float16" in build and "--max_lora_rank=8" in build


def test_a_negative_lora_rank_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_engine.parse_args(["--model=m", "--output=o", "--max-lora-rank=-1"])
    assert "--max-lora-rank -1" in capsys.readouterr().err


def test_context_logits_are_gathered_on_request() -> None:
    # trtllm-build 0.20's --gather_context_logits (a store_true flag): without it the executor
    # refuses return_context_logits, which the api's `echo` with `logprobs` needs (docs/gpu.md).
    _, build = commands(["--model=m", "--output=o", "--max-lora-rank=0"])
    assert "--gather_context_logits" not in build
    _, build = commands(["--model=m", "--output=o", "--gather-context-logits"])
    assert "--gather_context_logits" in build
    assert build.index("--gather_context_logits") < build.index("--lora_target_modules")
