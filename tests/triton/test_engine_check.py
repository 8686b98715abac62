"""The engine's build config against the settings, in both config.json layouts, and the GPUs."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
from tritonbox_testing.engines import write_engine

from tritonbox_triton.engine_check import (
    EngineCheckError,
    check_engine,
    check_gpus,
    read_engine_build,
    visible_gpus,
)
from tritonbox_triton.settings import TritonSettings


def settings_for(trtllm: TritonSettings, **values: Any) -> TritonSettings:
    return trtllm.model_copy(update=values)


def test_a_fitting_engine_passes(trtllm: TritonSettings, tmp_path: Path) -> None:
    engine = write_engine(tmp_path / "engine")
    settings = settings_for(trtllm, max_batch_size=64, max_input_len=3000, max_output_len=1000)
    build = check_engine(settings, engine)
    assert (build.max_batch_size, build.max_input_len, build.max_seq_len) == (64, 3000, 4000)
    assert build.engine_files == ("rank0.engine",)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"max_batch_size": 65}, r"MAX_BATCH_SIZE=65 is more than the engine was built for \(64\)"),
        ({"max_input_len": 3001}, r"MAX_INPUT_LEN=3001 is more than the engine was built for"),
        (
            {"max_input_len": 3000, "max_output_len": 1001},
            r"MAX_OUTPUT_LEN=1001 .*\(max_seq_len 4000\): set MAX_OUTPUT_LEN to at most 1000",
        ),
        (
            {"tensor_parallelism": 2},
            r"TENSOR_PARALLELISM=2 but .* built for 1 .*TENSOR_PARALLELISM=1",
        ),
    ],
)
def test_mismatches_name_the_setting(
    trtllm: TritonSettings, tmp_path: Path, values: dict[str, int], message: str
) -> None:
    engine = write_engine(tmp_path / "engine")
    with pytest.raises(EngineCheckError, match=message):
        check_engine(settings_for(trtllm, **values), engine)


def test_tensor_parallel_engine_needs_every_rank_file(
    trtllm: TritonSettings, tmp_path: Path
) -> None:
    engine = write_engine(tmp_path / "engine", tp=4)
    check_engine(settings_for(trtllm, tensor_parallelism=4), engine)
    (engine / "rank3.engine").unlink()
    with pytest.raises(EngineCheckError, match=r"lacks rank3.engine \(one engine file per GPU\)"):
        check_engine(settings_for(trtllm, tensor_parallelism=4), engine)


def test_pipeline_parallel_engines_are_refused(trtllm: TritonSettings, tmp_path: Path) -> None:
    engine = write_engine(tmp_path / "engine", tp=1, pp=2)
    with pytest.raises(EngineCheckError, match=r"pipeline parallelism \(pp_size=2\)"):
        check_engine(trtllm, engine)


@pytest.mark.parametrize(
    "plugins",
    [
        {"paged_kv_cache": False},
        {"gpt_attention_plugin": None},
        {"remove_input_padding": "disable"},
    ],
)
def test_in_flight_batching_needs_its_plugins(
    trtllm: TritonSettings, tmp_path: Path, plugins: dict[str, Any]
) -> None:
    engine = write_engine(tmp_path / "engine", plugins=plugins)
    with pytest.raises(EngineCheckError, match=f"built without {next(iter(plugins))}"):
        check_engine(trtllm, engine)


def test_versions_0_8_and_0_9_give_max_output_len(trtllm: TritonSettings, tmp_path: Path) -> None:
    engine = write_engine(tmp_path / "engine", build={"max_seq_len": None, "max_output_len": 500})
    assert read_engine_build(engine).max_seq_len == 3500
    with pytest.raises(EngineCheckError, match="MAX_OUTPUT_LEN=1024"):
        check_engine(settings_for(trtllm, max_input_len=3000), engine)


def test_legacy_layout_is_refused_by_version(trtllm: TritonSettings, tmp_path: Path) -> None:
    # TensorRT-LLM <= 0.7: builder_config + plugin_config and no version.
    engine = tmp_path / "legacy"
    engine.mkdir()
    builder = {"name": "llama", "precision": "float16", "tensor_parallel": 1}
    (engine / "config.json").write_text(json.dumps({"builder_config": builder}))
    with pytest.raises(EngineCheckError, match=r"built by an unknown TensorRT-LLM .*version None"):
        check_engine(trtllm, engine)


def test_unreadable_config(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(EngineCheckError, match=r"engine_dir: cannot read .*config.json"):
        read_engine_build(tmp_path)


def test_gpu_count(trtllm: TritonSettings, caplog: pytest.LogCaptureFixture) -> None:
    two = settings_for(trtllm, tensor_parallelism=2)
    check_gpus(two, 2)
    with pytest.raises(EngineCheckError, match=r"TENSOR_PARALLELISM=2 needs 2 GPU\(s\), 1 visible"):
        check_gpus(two, 1)
    with pytest.raises(EngineCheckError, match="0 visible"):
        check_gpus(trtllm, 0)
    with caplog.at_level(logging.WARNING):
        check_gpus(two, 8)  # more is fine: the engine uses two of them
        check_gpus(two, None)  # nvidia-smi missing: Triton will say
    assert "8 GPUs visible, the engine uses 2" in caplog.text
    assert "nvidia-smi not found" in caplog.text


def test_visible_gpus_asks_nvidia_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert visible_gpus() is None
    fake = tmp_path / "nvidia-smi"
    fake.write_text(
        "#!/bin/sh\necho 'GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-1)'\n"
        "echo 'GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-2)'\n"
    )
    fake.chmod(0o755)
    assert visible_gpus() == 2
