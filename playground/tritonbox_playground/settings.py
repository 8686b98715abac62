"""The playground's settings: one typed object read from the environment and the shared `.env`.

`API_KEY` and `PUBLIC_URL` are the api's keys too, on purpose: one `.env` line feeds both
services, so the secret the api checks is the one the playground sends, and the address shown in
"copy as curl" is the one the api puts in its permalinks.
"""

from __future__ import annotations

from typing import Self

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class PlaygroundSettings(BaseSettings):
    """playground: the Gradio web page in front of the api."""

    model_config = SettingsConfigDict(
        env_file=".env", extra="ignore", frozen=True, env_ignore_empty=True
    )

    playground_host: str = Field(
        default="127.0.0.1", description="Address the playground listens on."
    )
    playground_port: int = Field(
        default=7860, ge=1, le=65535, description="The playground's HTTP port."
    )
    api_url: str = Field(
        default="http://127.0.0.1:8080",
        description="Where the playground reaches the api (every run goes through it).",
    )
    api_key: SecretStr | None = Field(
        default=None,
        description="The api's API_KEY (one line feeds both): the playground's server sends it "
        "as `Authorization: Bearer …`; it never reaches the browser.",
    )
    public_url: str | None = Field(
        default=None,
        description="The api's PUBLIC_URL (one line feeds both): the address shown in 'copy as "
        "curl / Python / openai'; unset = API_URL.",
    )
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

    @model_validator(mode="after")
    def _login_needs_both(self) -> Self:
        if (self.playground_username is None) != (self.playground_password is None):
            raise ValueError(
                "set both PLAYGROUND_USERNAME and PLAYGROUND_PASSWORD for a login, or neither"
            )
        return self

    @property
    def shown_api_url(self) -> str:
        """The api's address as users reach it, for snippets."""
        return (self.public_url or self.api_url).rstrip("/")
