"""The api's settings: one typed object read from the environment and the shared `.env`.

The engine's limits (max input and output tokens) and the tokenizer are not repeated here: the
api reads them from Triton's `preprocessing` config at start, so they have one source of truth
(TritonSettings) and cannot drift apart.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict


class ApiSettings(BaseSettings):
    """api: the FastAPI proxy, its database and its limits."""

    model_config = SettingsConfigDict(
        env_file=".env", extra="ignore", frozen=True, env_ignore_empty=True
    )

    api_host: str = Field(default="127.0.0.1", description="Address the api listens on.")
    api_port: int = Field(default=8080, ge=1, le=65535, description="The api's HTTP port.")
    triton_url: str = Field(
        default="127.0.0.1:8001", description="Triton's gRPC address (host:port) the api uses."
    )
    triton_timeout_s: float = Field(
        default=5.0,
        gt=0,
        description="Bound on the api's health and metadata calls to Triton (seconds).",
    )
    api_tokenizer_dir: Path | None = Field(
        default=None,
        description="Tokenizer the api counts tokens and decodes with; unset = the one Triton's "
        "preprocessing step uses (same machine or a shared volume).",
    )
    model_name: str | None = Field(
        default=None,
        description="Model name shown by /v1/models and stored with predictions; unset = the "
        "tokenizer directory's name.",
    )
    database_path: Path = Field(
        default=Path(".cache/tritonbox.db"),
        description="SQLite file holding every prediction (created on first start).",
    )
    api_key: SecretStr | None = Field(
        default=None,
        description="When set, every route but health and metrics needs "
        "`Authorization: Bearer <API_KEY>`.",
    )
    max_concurrent_requests: int = Field(
        default=64,
        ge=1,
        le=4096,
        description="Generations the api runs at once; more get 429 with Retry-After.",
    )
    max_body_bytes: int = Field(
        default=1_048_576, ge=1024, description="Largest request body the api accepts (bytes)."
    )
    max_beam_width: int = Field(
        default=1,
        ge=1,
        le=64,
        description="Largest beam_width accepted; the cpu engine has no beam search (1).",
    )
    public_url: str = Field(
        default="http://127.0.0.1:8080",
        description="The api's address as users reach it, for permalinks.",
    )
    playground_url: str = Field(
        default="http://127.0.0.1:7860",
        description="The playground's address as users reach it, for 'open in playground'.",
    )
    log_predictions: bool = Field(
        default=True,
        description="Save every prediction to the database; false only to measure what "
        "logging costs (predictions then get no permalink).",
    )
