"""The api's settings: one typed object read from the environment and the shared `.env`.

The engine's limits (max input and output tokens) and the tokenizer are not repeated here: the
api reads them from Triton's `preprocessing` config at start, so they have one source of truth
(TritonSettings) and cannot drift apart.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Self

from pydantic import Field, SecretStr, model_validator

from tritonbox_api import keys as keyring
from tritonbox_common.prompt_log_probs import EchoLimitSettings
from tritonbox_common.shared_settings import (
    API_PORT,
    CACHE_DIR,
    PLAYGROUND_PORT,
    PUBLISH_ADDRESS,
    SERVICE_SETTINGS_CONFIG,
    TRITON_GRPC_PORT,
    AllowOpenAccess,
    ApiKey,
    ApiPort,
    CacheDir,
    HfToken,
    PlaygroundPort,
    PublicUrl,
    PublishAddress,
    TritonGrpcPort,
    refuse_open_access,
    with_derived_url,
)


class ApiSettings(EchoLimitSettings):
    """api: the FastAPI proxy, its database and its limits."""

    model_config = SERVICE_SETTINGS_CONFIG

    publish_address: PublishAddress = PUBLISH_ADDRESS
    allow_open_access: AllowOpenAccess = False
    api_port: ApiPort = API_PORT
    triton_grpc_port: TritonGrpcPort = TRITON_GRPC_PORT
    triton_url: str = Field(
        default="",
        description="Triton's gRPC address (host:port) as the api reaches it; unset = "
        "127.0.0.1:TRITON_GRPC_PORT (compose names the triton service).",
    )
    triton_timeout_s: float = Field(
        default=5.0,
        gt=0,
        description="Bound on the api's health and metadata calls to Triton (seconds).",
    )
    model_name: str | None = Field(
        default=None,
        description="Model name shown by /v1/models and stored with predictions; unset = the "
        "tokenizer directory's name.",
    )
    database_path: Path = Field(
        default=Path(".cache/tritonbox.db"),
        description="SQLite file holding every prediction (created on first start); used when "
        "DATABASE_URL is unset.",
    )
    database_url: SecretStr | None = Field(
        default=None,
        description="SQLAlchemy URL of the prediction database; unset = the SQLite file "
        "DATABASE_PATH. PostgreSQL: `postgresql+psycopg://USER@HOST:5432/NAME` with "
        "POSTGRES_PASSWORD, or the password in the URL (docs/scaling.md). The schema is "
        "migrated on start.",
    )
    postgres_password: SecretStr | None = Field(
        default=None,
        description="Password for a PostgreSQL DATABASE_URL that names none (it then needs no "
        "URL-encoding); compose.postgres.yaml also creates its server's user with it.",
    )
    api_workers: int = Field(
        default=1,
        ge=0,
        le=64,
        description="api processes serving the one port; 0 = one per CPU core (at most 8). "
        "Several share the database: PostgreSQL suits them best (docs/scaling.md).",
    )
    api_key: ApiKey = None
    api_keys: SecretStr | None = Field(
        default=None,
        description="Named keys, each with a role: `name:role:key` separated by commas. Role "
        "`use`: generate and read predictions; `manage`: also register and delete adapters. "
        "The key as clients send it, or `sha256:<64 hex digits>` of it. The name is recorded "
        "on every prediction and in the metrics; API_KEY, when set too, is the key `default` "
        "with both roles. An entry may end in its rate limits, `:rpm=N:tpm=N` (0 = none; "
        "unset = RATE_LIMIT_RPM, RATE_LIMIT_TPM) (docs/deployment.md).",
    )
    api_keys_file: Path | None = Field(
        default=None,
        description="A file of more keys, one `name:role:key` a line as in API_KEYS (`#` "
        "starts a comment line); read at start.",
    )
    rate_limit_rpm: int = Field(
        default=0,
        ge=0,
        description="Requests per minute each key may send to the generating routes, for keys "
        "that set no `rpm=` of their own (API_KEYS); past it 429 with Retry-After and OpenAI's "
        "x-ratelimit-* headers; 0 = no limit. With API_WORKERS > 1 each worker enforces its "
        "share (docs/deployment.md).",
    )
    rate_limit_tpm: int = Field(
        default=0,
        ge=0,
        description="Tokens per minute each key may use, for keys that set no `tpm=` of their "
        "own: a request reserves its prompt plus max_tokens for each of its n choices, and its "
        "actual usage replaces that when it ends; 0 = no limit. Per worker as RATE_LIMIT_RPM.",
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
    max_batch_file_bytes: int = Field(
        default=104_857_600,
        ge=1,
        description="Largest batch input file accepted by POST /v1/files (bytes); larger: 413. "
        "Files are kept in the database (docs/batches.md).",
    )
    max_batch_lines: int = Field(
        default=50_000,
        ge=1,
        description="Most lines in a batch input file; more: 413 at upload and at create.",
    )
    batch_concurrent_requests: int = Field(
        default=16,
        ge=1,
        le=4096,
        description="Engine requests batch lines may run at once (a line of `n` choices takes "
        "n), shared with live requests: a line starts only while live and batch requests "
        "together are fewer; live requests keep all MAX_CONCURRENT_REQUESTS (docs/batches.md). "
        "With API_WORKERS > 1, the workers share it.",
    )
    batch_requests_beside_live: int = Field(
        default=0,
        ge=0,
        description="Engine requests batch lines keep while live requests run: as one comes, "
        "the newest lines over it stop and run again later (docs/batches.md; workers share it).",
    )
    max_beam_width: int = Field(
        default=1,
        ge=1,
        le=64,
        description="Largest beam_width accepted; the cpu engine has no beam search (1).",
    )
    public_url: PublicUrl = ""
    playground_port: PlaygroundPort = PLAYGROUND_PORT
    playground_url: str = Field(
        default="",
        description="The playground's address as users reach it, for 'open in playground'; "
        "unset = http://127.0.0.1:PLAYGROUND_PORT.",
    )
    log_predictions: bool = Field(
        default=True,
        description="Save every prediction to the database; false only to measure what "
        "logging costs (predictions then get no permalink).",
    )
    lora_adapters: str = Field(
        default="",
        description="LoRA adapters to register at start, `name=source` separated by commas; a "
        "source is a PEFT folder in ADAPTER_DIRS or a Hugging Face repo id ADAPTER_HUB_REPOS "
        "allows (org/name or org/name@revision, fetched into CACHE_DIR/hub). An entry that "
        "fails is logged as an error and left out; the others register. Registered adapters "
        "are kept in the database, so this is only needed once (docs/adapters.md).",
    )
    adapter_dirs: str = Field(
        default="",
        description="Folders adapter sources may be in, separated by commas (a local source "
        "outside them, symbolic links followed, is refused as if it did not exist); unset = "
        "CACHE_DIR/adapters.",
    )
    adapter_hub_repos: str = Field(
        default="",
        description="Hugging Face repositories adapters may be fetched from: patterns separated "
        "by commas, `*` and `?` as in file names (`acme/*`); HF_TOKEN is sent only to these. "
        "Unset = none: adapters come from ADAPTER_DIRS only.",
    )
    adapter_max_bytes: int = Field(
        default=1_073_741_824,
        ge=1,
        description="Largest adapter accepted, its two files together (bytes): checked before a "
        "byte is downloaded and before a file is read.",
    )
    adapter_cache_bytes: int = Field(
        default=1_073_741_824,
        ge=1,
        description="Memory each api worker keeps converted adapters in (bytes), least recently "
        "used evicted first; the adapter in use is kept even when larger.",
    )
    cache_dir: CacheDir = CACHE_DIR
    hf_token: HfToken = None

    @model_validator(mode="before")
    @classmethod
    def _derived_addresses(cls, data: Any) -> Any:
        data = with_derived_url(
            data,
            "triton_url",
            port_key="triton_grpc_port",
            default_port=TRITON_GRPC_PORT,
            template="{host}:{port}",
        )
        data = with_derived_url(
            data,
            "public_url",
            port_key="api_port",
            default_port=API_PORT,
        )
        return with_derived_url(
            data,
            "playground_url",
            port_key="playground_port",
            default_port=PLAYGROUND_PORT,
        )

    @model_validator(mode="after")
    def _closed_unless_opened(self) -> Self:
        keys = self.keys()  # malformed keys stop the start here, with what is wrong
        refuse_open_access(
            service="api",
            address=self.publish_address,
            guarded_by="API_KEY" if keys else None,
            allow_open_access=self.allow_open_access,
        )
        return self

    def keys(self) -> list[keyring.ApiKey]:
        """API_KEY, API_KEYS and API_KEYS_FILE's keys; ValueError naming what is malformed."""
        return keyring.load_keys(self.api_key, self.api_keys, self.api_keys_file)

    @property
    def adapter_roots(self) -> list[Path]:
        """ADAPTER_DIRS as absolute folders (relative ones from the working directory)."""
        named = [Path(d.strip()).expanduser() for d in self.adapter_dirs.split(",") if d.strip()]
        return [d.absolute() for d in named or [self.cache_dir / "adapters"]]

    @property
    def hub_patterns(self) -> list[str]:
        return [p.strip() for p in self.adapter_hub_repos.split(",") if p.strip()]
