"""The GPU flavour's settings: the KV cache is sized by GPU memory unless a cap is set, and the
TensorRT-LLM engine is refused with the wheel's tritonserver, which has no tensorrtllm backend."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from tritonbox_triton.settings import CPU_KV_CACHE_TOKENS, TritonSettings

NVIDIA_TRITONSERVER = "/opt/tritonserver/bin/tritonserver"


def settings(**values: Any) -> TritonSettings:
    factory: Any = TritonSettings  # `_env_file=None`: ignore a developer's .env
    made: TritonSettings = factory(_env_file=None, **values)
    return made


def gpu(**values: Any) -> TritonSettings:
    return settings(
        engine="trtllm",
        engine_repository="my-org/engine",
        tritonserver_bin=NVIDIA_TRITONSERVER,
        **values,
    )


def test_the_kv_cache_default_follows_the_flavour(clean_environment: None) -> None:
    assert settings().kv_cache_max_tokens == CPU_KV_CACHE_TOKENS == 65536
    assert settings(engine="synthetic").kv_cache_max_tokens == CPU_KV_CACHE_TOKENS
    # 0 = no token cap: the backend sizes the cache by KV_CACHE_FREE_GPU_MEM_FRACTION.
    assert gpu().kv_cache_max_tokens == 0


def test_a_set_kv_cache_size_is_kept(
    clean_environment: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert gpu(kv_cache_max_tokens=100000).kv_cache_max_tokens == 100000
    assert settings(kv_cache_max_tokens=0).kv_cache_max_tokens == 0
    monkeypatch.setenv("ENGINE", "trtllm")
    monkeypatch.setenv("KV_CACHE_MAX_TOKENS", "32768")
    monkeypatch.setenv("ENGINE_REPOSITORY", "my-org/engine")
    monkeypatch.setenv("TRITONSERVER_BIN", NVIDIA_TRITONSERVER)
    assert settings().kv_cache_max_tokens == 32768
    monkeypatch.delenv("KV_CACHE_MAX_TOKENS")
    assert settings().kv_cache_max_tokens == 0  # ENGINE from the environment decides too


def test_the_kv_cache_default_comes_from_a_dotenv_file(
    clean_environment: None, tmp_path: Path
) -> None:
    env = tmp_path / ".env"
    env.write_text(
        f"ENGINE=trtllm\nENGINE_REPOSITORY=my-org/engine\nTRITONSERVER_BIN={NVIDIA_TRITONSERVER}\n"
    )
    factory: Any = TritonSettings
    assert factory(_env_file=env).kv_cache_max_tokens == 0
    env.write_text(env.read_text() + "KV_CACHE_MAX_TOKENS=4096\n")
    assert factory(_env_file=env).kv_cache_max_tokens == 4096


def test_trtllm_without_tritonserver_bin_is_refused(clean_environment: None) -> None:
    with pytest.raises(ValidationError) as error:
        settings(engine="trtllm", engine_repository="my-org/engine")
    message = str(error.value)
    assert "ENGINE=trtllm needs TRITONSERVER_BIN" in message
    assert "TRITONSERVER_BIN=/opt/tritonserver/bin/tritonserver" in message
    assert "has no tensorrtllm backend" in message
    # The other flavours run the wheel's tritonserver.
    assert settings(engine="cpu").tritonserver_bin is None
    assert gpu().tritonserver_bin == Path(NVIDIA_TRITONSERVER)


def test_the_native_launcher_refuses_before_starting_anything(
    clean_environment: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tritonbox_triton.cli import main

    env = tmp_path / ".env"
    env.write_text(f"ENGINE=trtllm\nENGINE_REPOSITORY={tmp_path}\nCACHE_DIR={tmp_path / 'c'}\n")
    assert main(["serve", "--env-file", str(env)]) == 1
    assert "ENGINE=trtllm needs TRITONSERVER_BIN" in capsys.readouterr().err
    assert not (tmp_path / "c").exists()  # nothing fetched, rendered or started
