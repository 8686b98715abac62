"""The playground's settings: one typed object read from the environment and the shared `.env`.

`API_KEY`, `PUBLIC_URL` and `API_PORT` are the api's keys too, defined once in
tritonbox_common.shared_settings: one `.env` line feeds both services, so the secret the api
checks is the one the playground sends, and the address shown in "copy as curl" is the one the
api puts in its permalinks.
"""

from __future__ import annotations

from typing import Any, Self

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings

from tritonbox_common.shared_settings import (
    API_PORT,
    PLAYGROUND_PORT,
    PUBLISH_ADDRESS,
    SERVICE_SETTINGS_CONFIG,
    AllowOpenAccess,
    ApiKey,
    ApiPort,
    PlaygroundPort,
    PublicUrl,
    PublishAddress,
    refuse_open_access,
    with_derived_url,
)


class PlaygroundSettings(BaseSettings):
    """playground: the Gradio web page in front of the api."""

    model_config = SERVICE_SETTINGS_CONFIG

    publish_address: PublishAddress = PUBLISH_ADDRESS
    allow_open_access: AllowOpenAccess = False
    playground_port: PlaygroundPort = PLAYGROUND_PORT
    api_port: ApiPort = API_PORT
    api_url: str = Field(
        default="",
        description="Where the playground reaches the api (every run goes through it); unset = "
        "http://127.0.0.1:API_PORT (compose names the api service).",
    )
    api_key: ApiKey = None
    playground_api_key: SecretStr | None = Field(
        default=None,
        description="The key the playground's server sends the api for its users: a `use` key "
        "of API_KEYS, so that a playground login can generate and read but not register or "
        "delete adapters, and its predictions carry that key's name; unset = API_KEY.",
    )
    public_url: PublicUrl = ""
    playground_api_timeout_s: float = Field(
        default=60.0,
        gt=0,
        description="Seconds the playground waits for the api (to connect, or between two "
        "pieces of a streamed answer) before telling the user it does not answer.",
    )
    playground_concurrency: int = Field(
        default=32,
        ge=1,
        le=4096,
        description="Runs the playground streams at once (Gradio's default_concurrency_limit); "
        "more wait in its queue. Keep it at most MAX_CONCURRENT_REQUESTS.",
    )
    playground_username: str | None = Field(
        default=None,
        description="With PLAYGROUND_PASSWORD: the playground asks for this login.",
    )
    playground_password: SecretStr | None = Field(
        default=None, description="With PLAYGROUND_USERNAME: the playground login's password."
    )

    @model_validator(mode="before")
    @classmethod
    def _derived_addresses(cls, data: Any) -> Any:
        for key in ("api_url", "public_url"):
            data = with_derived_url(
                data,
                key,
                port_key="api_port",
                default_port=API_PORT,
            )
        return data

    @model_validator(mode="after")
    def _login_needs_both(self) -> Self:
        if (self.playground_username is None) != (self.playground_password is None):
            raise ValueError(
                "set both PLAYGROUND_USERNAME and PLAYGROUND_PASSWORD for a login, or neither"
            )
        return self

    @model_validator(mode="after")
    def _closed_unless_opened(self) -> Self:
        refuse_open_access(
            service="playground",
            address=self.publish_address,
            guarded_by="a login" if self.playground_username is not None else None,
            allow_open_access=self.allow_open_access,
        )
        return self

    @property
    def sent_api_key(self) -> str | None:
        """The key every call to the api carries (PLAYGROUND_API_KEY, else API_KEY)."""
        key = self.playground_api_key or self.api_key
        return key.get_secret_value() if key is not None else None

    @property
    def shown_api_url(self) -> str:
        """The api's address as users reach it, for snippets."""
        return self.public_url.rstrip("/")
