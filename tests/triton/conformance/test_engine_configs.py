"""The engine check on the config.json of a TensorRT-LLM 0.20 engine: the Gemma-7B-it recipe
(INT4 AWQ weights, INT8 KV cache, tensor parallelism 2; tests/data/trtllm_engines, reconstructed
from NVIDIA's 0.20 sources as its SOURCE.md says), and the variants each check must refuse."""

from __future__ import annotations

import copy
import json
import logging
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest

from tritonbox_triton import engine_check
from tritonbox_triton.engine_check import (
    TRTLLM_VERSION,
    EngineCheckError,
    check_engine,
    read_engine_build,
    runtime_version,
)
from tritonbox_triton.settings import TritonSettings

FIXTURE = (
    Path(__file__).resolve().parents[2]
    / "data"
    / "trtllm_engines"
    / "gemma-7b-it-int4-awq-kv-int8-tp2.config.json"
)
# The recipe's settings (docs/gpu.md): what the engine was built for.
RECIPE = {
    "max_batch_size": 64,
    "max_input_len": 3000,
    "max_output_len": 1000,
    "tensor_parallelism": 2,
}


def gemma_config() -> dict[str, Any]:
    config: dict[str, Any] = json.loads(FIXTURE.read_text())
    return config


def engine_folder(path: Path, config: dict[str, Any]) -> Path:
    """An engine folder: this config.json and one (empty) rank file per GPU."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    for rank in range(config["pretrained_config"]["mapping"]["world_size"]):
        (path / f"rank{rank}.engine").write_bytes(b"")
    return path


def variant(**changes: Any) -> dict[str, Any]:
    """The Gemma config with `section__key=value` (or `section__sub__key`) changes."""
    config = copy.deepcopy(gemma_config())
    for dotted, value in changes.items():
        *path, key = dotted.split("__")
        section = config
        for name in path:
            section = section[name]
        section[key] = value
    return config


@pytest.fixture
def recipe(trtllm: TritonSettings) -> TritonSettings:
    return trtllm.model_copy(update=RECIPE)


def test_the_fixture_reads_as_built(tmp_path: Path) -> None:
    build = read_engine_build(engine_folder(tmp_path / "gemma", gemma_config()))
    assert build.version == TRTLLM_VERSION
    assert (build.max_batch_size, build.max_input_len, build.max_seq_len) == (64, 3000, 4000)
    assert (build.max_num_tokens, build.kv_cache_type, build.tp_size, build.pp_size) == (
        8192,
        "PAGED",
        2,
        1,
    )
    assert build.plugins["use_paged_context_fmha"] is False  # INT8 KV cache
    # K and V, 28 layers, 16 KV heads split over 2 GPUs, head size 256, 1 byte (INT8).
    assert build.kv_bytes_per_token == 2 * 28 * 8 * 256 * 1
    assert build.engine_files == ("rank0.engine", "rank1.engine")


def test_the_recipe_passes_and_reports_its_kv_cache(
    recipe: TritonSettings, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    engine = engine_folder(tmp_path / "gemma", gemma_config())
    with caplog.at_level(logging.INFO, logger=engine_check.__name__):
        check_engine(recipe.model_copy(update={"kv_cache_max_tokens": 0}), engine)
    # 64 x 4000 tokens x 112 KiB = 27.3 GiB on each of the two GPUs.
    assert "needs 256000 KV-cache tokens, 27.3 GiB per GPU" in caplog.text
    assert "KV_CACHE_MAX_TOKENS" not in caplog.text


def test_a_token_cap_below_the_batch_is_reported(
    recipe: TritonSettings, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    engine = engine_folder(tmp_path / "gemma", gemma_config())
    with caplog.at_level(logging.WARNING, logger=engine_check.__name__):
        check_engine(recipe.model_copy(update={"kv_cache_max_tokens": 65536}), engine)
    assert "KV_CACHE_MAX_TOKENS=65536 holds about 16 of MAX_BATCH_SIZE=64" in caplog.text


@pytest.mark.parametrize("version", ["0.9.0", "0.19.0", "0.21.0rc1"])
def test_an_engine_of_another_version_is_refused(
    recipe: TritonSettings, tmp_path: Path, version: str
) -> None:
    engine = engine_folder(tmp_path / "gemma", variant(version=version))
    message = (
        rf"built by TensorRT-LLM {version} .*this image runs TensorRT-LLM {TRTLLM_VERSION}.*"
        rf"rebuild it with scripts/build_engine.py in nvcr.io/nvidia/tensorrt-llm/release:"
        rf"{TRTLLM_VERSION}"
    )
    with pytest.raises(EngineCheckError, match=message):
        check_engine(recipe, engine)


def test_the_runtime_version_is_the_installed_one(monkeypatch: pytest.MonkeyPatch) -> None:
    def installed(name: str) -> str:
        if name == "tensorrt_llm":
            return "0.21.0"
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", installed)
    assert runtime_version() == "0.21.0"

    def absent(name: str) -> str:
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", absent)
    assert runtime_version() == TRTLLM_VERSION


def test_the_installed_runtime_decides(recipe: TritonSettings, tmp_path: Path) -> None:
    engine = engine_folder(tmp_path / "gemma", gemma_config())
    check_engine(recipe, engine, runtime="0.20.0+local.build")  # a local tag, same release
    with pytest.raises(EngineCheckError, match=r"0\.20\.0.*this image runs TensorRT-LLM 0\.21\.0"):
        check_engine(recipe, engine, runtime="0.21.0")


def test_prompts_longer_than_one_engine_step_are_refused(
    recipe: TritonSettings, tmp_path: Path
) -> None:
    engine = engine_folder(tmp_path / "gemma", variant(build_config__max_num_tokens=2048))
    message = (
        r"MAX_INPUT_LEN=3000 is more than the engine's max_num_tokens \(2048, .*set MAX_INPUT_LEN"
        r" to at most 2048 or rebuild with --max-num-tokens 3000 or more"
    )
    with pytest.raises(EngineCheckError, match=message):
        check_engine(recipe, engine)
    check_engine(recipe.model_copy(update={"max_input_len": 2048}), engine)


def test_kv_cache_reuse_needs_paged_context_fmha(recipe: TritonSettings, tmp_path: Path) -> None:
    engine = engine_folder(tmp_path / "gemma", gemma_config())
    reuse = recipe.model_copy(update={"enable_kv_cache_reuse": True})
    message = (
        r"ENABLE_KV_CACHE_REUSE=true needs an engine built with paged context FMHA.*"
        r"use_paged_context_fmha=False.*set ENABLE_KV_CACHE_REUSE=false, or rebuild without "
        r"--kv-cache int8 \(no KV-cache quantisation, or --preset fp8 --kv-cache fp8\)"
    )
    with pytest.raises(EngineCheckError, match=message):
        check_engine(reuse, engine)
    # The same model without paged-context limits (FP8 preset and KV cache) serves with reuse.
    fp8 = variant(
        pretrained_config__quantization__quant_algo="FP8",
        pretrained_config__quantization__kv_cache_quant_algo="FP8",
        build_config__plugin_config__use_paged_context_fmha=True,
    )
    check_engine(reuse, engine_folder(tmp_path / "gemma-fp8", fp8))


@pytest.mark.parametrize(
    ("changes", "missing"),
    [
        (
            {"build_config__kv_cache_type": "CONTINUOUS"},
            r"paged_kv_cache \(kv_cache_type CONTINUOUS\)",
        ),
        ({"build_config__plugin_config__paged_kv_cache": False}, "paged_kv_cache"),
        ({"build_config__plugin_config__remove_input_padding": False}, "remove_input_padding"),
        ({"build_config__plugin_config__gpt_attention_plugin": None}, "gpt_attention_plugin"),
    ],
)
def test_in_flight_batching_needs_a_paged_cache_and_packed_input(
    recipe: TritonSettings, tmp_path: Path, changes: dict[str, Any], missing: str
) -> None:
    engine = engine_folder(tmp_path / "gemma", variant(**changes))
    with pytest.raises(EngineCheckError, match=f"built without {missing}"):
        check_engine(recipe, engine)


def test_tensor_parallelism_must_match(recipe: TritonSettings, tmp_path: Path) -> None:
    engine = engine_folder(tmp_path / "gemma", gemma_config())
    with pytest.raises(
        EngineCheckError, match=r"TENSOR_PARALLELISM=1 but .* set TENSOR_PARALLELISM=2"
    ):
        check_engine(recipe.model_copy(update={"tensor_parallelism": 1}), engine)
