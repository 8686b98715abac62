"""Settings that more than one service reads, each defined once here.

One `.env` line feeds every service that needs the fact: the key the api checks is the one the
playground sends, the port Triton listens on is the one the api dials. Addresses are derived
from ports unless a deployment names them (compose does: services reach each other by name),
so changing a port is one line. `config_docs` lists a shared key once, and a test checks that
no two services define the same key differently.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, SecretStr
from pydantic.config import JsonDict
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

LOCALHOST = "127.0.0.1"

# Every service's settings: the environment, then the shared `.env`; other services' keys are
# ignored here (env_file.check_env_file refuses keys no service knows); an empty value means
# unset, as compose's `${VAR:-}` passes it. An error never echoes the input: a model-level
# check's input is every setting, secrets (API_KEYS, HF_TOKEN, DATABASE_URL) included.
SERVICE_SETTINGS_CONFIG = SettingsConfigDict(
    env_file=".env", extra="ignore", frozen=True, env_ignore_empty=True, hide_input_in_errors=True
)

ApiPort = Annotated[int, Field(ge=1, le=65535, description="The api's HTTP port.")]
TritonGrpcPort = Annotated[int, Field(ge=1, le=65535, description="Triton's gRPC port.")]
PlaygroundPort = Annotated[int, Field(ge=1, le=65535, description="The playground's HTTP port.")]
API_PORT = 8080
TRITON_GRPC_PORT = 8001
PLAYGROUND_PORT = 7860

ApiKey = Annotated[
    SecretStr | None,
    Field(
        description="When set, every api route but health and metrics needs "
        "`Authorization: Bearer <API_KEY>`; the playground's server sends it (it never reaches "
        "the browser). It holds both roles, under the name `default`; API_KEYS adds named keys."
    ),
]
CacheDir = Annotated[
    Path,
    Field(
        description="Where downloads are kept (the default model, Hugging Face repositories "
        "and adapters under CACHE_DIR/hub), with the rendered repository, server logs and "
        "the cpu engine's compiled kernels (CACHE_DIR/kernels)."
    ),
]
CACHE_DIR = Path(".cache")
HfToken = Annotated[
    SecretStr | None,
    Field(description="Hugging Face token for private or gated repositories (never logged)."),
]
PublicUrl = Annotated[
    str,
    Field(
        description="The api's address as users reach it, used in permalinks and 'copy as curl "
        "/ Python / openai'; unset = http://127.0.0.1:API_PORT."
    ),
]


def with_derived_url(
    data: Any,
    key: str,
    *,
    port_key: str,
    default_port: int,
    template: str = "http://{host}:{port}",
) -> Any:
    """Raw settings `data` with `key` filled from `template` and the port when it is unset.

    For a `model_validator(mode="before")`: values may still be strings from the environment.
    A port that is not a number is left for its own field to report, naming the key.
    """
    if not isinstance(data, Mapping) or data.get(key):
        return data
    try:
        port = int(data.get(port_key, default_port))
    except (TypeError, ValueError):
        return data
    return {**data, key: template.format(host=LOCALHOST, port=port)}


# A field marked RESOLVED is derived at start (a fetched folder, say) and never read from the
# environment or `.env`: it has no key, so `.env` refuses it like any unknown key.
RESOLVED: JsonDict = {"resolved": True}


def is_resolved(field: FieldInfo) -> bool:
    return isinstance(field.json_schema_extra, dict) and bool(
        field.json_schema_extra.get("resolved")
    )


def env_fields(cls: type[BaseSettings]) -> dict[str, FieldInfo]:
    """The fields a user sets through the environment or `.env` (RESOLVED ones left out)."""
    return {name: field for name, field in cls.model_fields.items() if not is_resolved(field)}


class WithoutResolved(PydanticBaseSettingsSource):
    """A settings source (environment, `.env`) with the RESOLVED fields taken out."""

    def __init__(self, source: PydanticBaseSettingsSource) -> None:
        super().__init__(source.settings_cls)
        self.source = source
        self.keys = set(source.settings_cls.model_fields) - set(env_fields(source.settings_cls))

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False  # unused: __call__ delegates to the wrapped source

    def __call__(self) -> dict[str, Any]:
        return {key: value for key, value in self.source().items() if key not in self.keys}


PublishAddress = Annotated[
    str,
    Field(
        description="Where the api and the playground can be reached from: natively the address "
        "they listen on, in compose the host address their ports are published on. 127.0.0.1 = "
        "this machine only; any other address (0.0.0.0 = every interface) needs API_KEY and a "
        "playground login, or ALLOW_OPEN_ACCESS=true.",
    ),
]
AllowOpenAccess = Annotated[
    bool,
    Field(
        description="Serve on a PUBLISH_ADDRESS other than this machine without API_KEY or a "
        "playground login: anyone who reaches the ports may use the model and read every "
        "prediction. Only for networks you trust.",
    ),
]
PUBLISH_ADDRESS = LOCALHOST


def is_loopback(address: str) -> bool:
    """True for addresses only this machine reaches (127.0.0.0/8, ::1, localhost)."""
    host = address.strip().strip("[]").lower()
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything


def refuse_open_access(
    *, service: str, address: str, guarded_by: str | None, allow_open_access: bool
) -> None:
    """Raise ValueError when `service` would be reachable beyond this machine unguarded.

    `guarded_by` names what protects it (None when nothing does). The message says both ways
    out, so the first start on a server tells its owner what to do.
    """
    if is_loopback(address) or guarded_by is not None or allow_open_access:
        return
    raise ValueError(
        f"PUBLISH_ADDRESS={address} would let anyone who reaches this machine use the {service} "
        f"without a password. Set {_WAY_IN[service]}, or set PUBLISH_ADDRESS=127.0.0.1 (this "
        "machine only), or ALLOW_OPEN_ACCESS=true to serve it open on purpose."
    )


_WAY_IN = {
    "api": "API_KEY (a long random string: clients send `Authorization: Bearer <API_KEY>`)",
    "playground": "PLAYGROUND_USERNAME and PLAYGROUND_PASSWORD (the page then asks for them)",
}
