"""The Triton service's settings: one typed object read from the environment and `.env`.

Every key is documented in `.env.example`. A key in `.env` that no service knows is an error
(see `env_file.check_env_file`), so a typo cannot silently fall back to a default.
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated, Self

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"


class EngineFlavour(StrEnum):
    """Which `tensorrt_llm` step the ensemble runs."""

    CPU = "cpu"  # the embedded Python-backend engine (torch on CPU)
    TRTLLM = "trtllm"  # NVIDIA's C++ tensorrtllm backend with a TensorRT-LLM engine


class TritonSettings(BaseSettings):
    """Settings of the Triton service (model repository rendering and the server launch)."""

    model_config = SettingsConfigDict(
        env_file=".env", extra="ignore", frozen=True, env_ignore_empty=True
    )

    engine: EngineFlavour = EngineFlavour.CPU
    cache_dir: Path = Path(".cache")
    model_dir: Path | None = Field(
        default=None,
        description="cpu flavour: a Hugging Face checkpoint directory; empty = the default model "
        "prepared into CACHE_DIR/models.",
    )
    tokenizer_dir: Path | None = Field(
        default=None, description="Tokenizer directory; empty = MODEL_DIR (cpu flavour)."
    )
    engine_dir: Path | None = Field(
        default=None, description="trtllm flavour: the TensorRT-LLM engine directory."
    )
    model_repository: Path | None = Field(
        default=None,
        description="Where the rendered model repository goes; empty = CACHE_DIR/model_repository.",
    )

    max_batch_size: Annotated[int, Field(ge=1, le=256)] = 16
    max_input_len: Annotated[int, Field(ge=1, le=131072)] = 2048
    max_output_len: Annotated[int, Field(ge=1, le=131072)] = 1024
    kv_cache_max_tokens: Annotated[int, Field(ge=0)] = 65536
    kv_cache_free_gpu_mem_fraction: Annotated[float, Field(gt=0, le=1)] = 0.9
    enable_kv_cache_reuse: bool = False
    preprocessing_instance_count: Annotated[int, Field(ge=1, le=64)] = 1
    postprocessing_instance_count: Annotated[int, Field(ge=1, le=64)] = 1
    max_queue_delay_microseconds: Annotated[int, Field(ge=0)] = 0
    max_queue_size: Annotated[int, Field(ge=0)] = 0
    decoupled_mode: bool = True
    tensor_parallelism: Annotated[int, Field(ge=1, le=64)] = 1
    cpu_threads: Annotated[int, Field(ge=0, le=512)] = Field(
        default=0, description="Torch threads for the cpu engine; 0 = all cores."
    )

    triton_host: str = "127.0.0.1"
    triton_http_port: Annotated[int, Field(ge=1, le=65535)] = 8000
    triton_grpc_port: Annotated[int, Field(ge=1, le=65535)] = 8001
    triton_metrics_port: Annotated[int, Field(ge=1, le=65535)] = 8002
    triton_ready_timeout_s: Annotated[float, Field(gt=0)] = 300.0
    triton_log_verbose: Annotated[int, Field(ge=0, le=3)] = 0

    @model_validator(mode="after")
    def _flavour_requirements(self) -> Self:
        if self.engine is EngineFlavour.TRTLLM:
            missing = [
                key
                for key, value in (
                    ("ENGINE_DIR", self.engine_dir),
                    ("TOKENIZER_DIR", self.tokenizer_dir),
                )
                if value is None
            ]
            if missing:
                raise ValueError(f"ENGINE=trtllm needs {' and '.join(missing)} to be set")
        return self

    @property
    def default_model_dir(self) -> Path:
        return self.cache_dir / "models" / DEFAULT_MODEL_NAME

    @property
    def resolved_model_dir(self) -> Path:
        """The cpu engine's checkpoint directory (absolute)."""
        return (self.model_dir or self.default_model_dir).resolve()

    @property
    def resolved_tokenizer_dir(self) -> Path:
        return (self.tokenizer_dir or self.model_dir or self.default_model_dir).resolve()

    @property
    def resolved_model_repository(self) -> Path:
        return (self.model_repository or self.cache_dir / "model_repository").resolve()

    @property
    def grpc_url(self) -> str:
        return f"{self.triton_host}:{self.triton_grpc_port}"

    @property
    def http_url(self) -> str:
        return f"http://{self.triton_host}:{self.triton_http_port}"
