"""`tritonbox-triton serve` end to end, as the GPU container runs it: a local engine folder is
fetched (used in place), checked against the settings and the GPUs, the repository rendered, and
tritonserver launched — one rank per GPU under mpirun for tensor parallelism. The NVIDIA-only
programs are stand-ins (tritonbox_testing.entrypoint); everything else is the real code path."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from tritonbox_testing.engines import write_engine
from tritonbox_testing.entrypoint import install_fakes, serve_environment, serving
from tritonbox_testing.ports import free_ports


@pytest.fixture
def engine_repository(tmp_path: Path, tokenizer_dir: Path) -> Path:
    """A built engine as build_engine.py leaves it: config.json, rank files, the tokenizer."""
    engine = write_engine(tmp_path / "models" / "gemma-7b-it-int4-awq", tp=2)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (tokenizer_dir / name).is_file():
            shutil.copy2(tokenizer_dir / name, engine / name)
    return engine


def gpu_settings(tmp_path: Path, engine: Path, fake_bin: Path, **extra: str) -> dict[str, str]:
    http, grpc, metrics = free_ports(3)
    values = {
        "ENGINE": "trtllm",
        "ENGINE_REPOSITORY": str(engine),
        "CACHE_DIR": str(tmp_path / "cache"),
        "TRITONSERVER_BIN": str(fake_bin),
        "TRITON_HTTP_PORT": str(http),
        "TRITON_GRPC_PORT": str(grpc),
        "TRITON_METRICS_PORT": str(metrics),
        "TRITON_READY_TIMEOUT_S": "60",
        "MAX_BATCH_SIZE": "64",
        "MAX_INPUT_LEN": "3000",
        "MAX_OUTPUT_LEN": "1000",
        "TENSOR_PARALLELISM": "2",
    }
    return values | extra


def test_tensor_parallel_engine_is_served_by_two_ranks(
    tmp_path: Path, engine_repository: Path
) -> None:
    fake = install_fakes(tmp_path / "bin", gpus=2)
    env = serve_environment(gpu_settings(tmp_path, engine_repository, fake), tmp_path / "bin")
    with serving(env, tmp_path) as output:
        repository = tmp_path / "cache" / "model_repository"
        config = (repository / "tensorrt_llm" / "config.pbtxt").read_text()
        assert f'string_value: "{engine_repository}"' in config
        preprocessing = (repository / "preprocessing" / "config.pbtxt").read_text()
        assert str(engine_repository) in preprocessing  # the tokenizer is the engine's folder
        assert "(trtllm engine" in "\n".join(output)
    log = next((tmp_path / "cache" / "logs").glob("tritonserver-*.log")).read_text()
    assert "fake mpirun: 2 ranks" in log
    assert log.count("fake tritonserver") == 2
    assert "--load-model=tensorrt_llm" in log
    assert "--backend-directory" not in log  # NVIDIA's binary uses its own backends


def test_single_gpu_engine_is_one_process(tmp_path: Path, tokenizer_dir: Path) -> None:
    engine = write_engine(tmp_path / "engine")
    shutil.copy2(tokenizer_dir / "tokenizer.json", engine / "tokenizer.json")
    shutil.copy2(tokenizer_dir / "tokenizer_config.json", engine / "tokenizer_config.json")
    fake = install_fakes(tmp_path / "bin", gpus=1)
    settings = gpu_settings(tmp_path, engine, fake, TENSOR_PARALLELISM="1")
    with serving(serve_environment(settings, tmp_path / "bin"), tmp_path):
        pass
    log = next((tmp_path / "cache" / "logs").glob("tritonserver-*.log")).read_text()
    assert "fake mpirun" not in log and log.count("fake tritonserver") == 1


def run_serve(env: dict[str, str], workdir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tritonbox_triton", "serve", "--env-file", str(workdir / "none")],
        env=env,
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(
    ("gpus", "extra", "message"),
    [
        (2, {"MAX_BATCH_SIZE": "128"}, "MAX_BATCH_SIZE=128 is more than the engine was built for"),
        (2, {"MAX_OUTPUT_LEN": "1500"}, "set MAX_OUTPUT_LEN to at most 1000"),
        (4, {"TENSOR_PARALLELISM": "4"}, "TENSOR_PARALLELISM=4 but the engine"),
        (1, {}, r"TENSOR_PARALLELISM=2 needs 2 GPU(s), 1 visible"),
        (2, {"ENGINE_REPOSITORY": "not a repo"}, "ENGINE_REPOSITORY='not a repo' is neither"),
    ],
)
def test_mismatches_stop_before_tritonserver_starts(
    tmp_path: Path, engine_repository: Path, gpus: int, extra: dict[str, str], message: str
) -> None:
    fake = install_fakes(tmp_path / "bin", gpus=gpus)
    settings = gpu_settings(tmp_path, engine_repository, fake, **extra)
    result = run_serve(serve_environment(settings, tmp_path / "bin"), tmp_path)
    assert result.returncode == 1
    assert message in result.stderr
    assert result.stderr.startswith("tritonbox-triton serve: ")
    assert not (tmp_path / "cache" / "logs").exists()  # no server was started


def test_trtllm_needs_an_engine(tmp_path: Path) -> None:
    result = run_serve(serve_environment({"ENGINE": "trtllm"}), tmp_path)
    assert result.returncode == 1
    assert "ENGINE=trtllm needs ENGINE_REPOSITORY" in result.stderr
