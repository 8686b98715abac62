"""PlaygroundSettings and `tritonbox-playground serve`'s checks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr, ValidationError

from tritonbox_api.settings import ApiSettings
from tritonbox_common.env_file import EnvFileError, load_service_settings
from tritonbox_playground.cli import launch_options, main
from tritonbox_playground.settings import PlaygroundSettings

FACTORY: Any = PlaygroundSettings


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in set(PlaygroundSettings.model_fields) | set(ApiSettings.model_fields):
        monkeypatch.delenv(name.upper(), raising=False)


def test_one_env_line_feeds_the_api_and_the_playground(tmp_path: Path) -> None:
    env = tmp_path / ".env"
    env.write_text("API_KEY=s3cret\nPUBLIC_URL=https://llm.example\nPLAYGROUND_CONCURRENCY=8\n")
    settings = load_service_settings(PlaygroundSettings, env)
    api: ApiSettings = ApiSettings(_env_file=env)  # type: ignore[call-arg]
    assert settings.api_key is not None and api.api_key is not None
    assert settings.api_key.get_secret_value() == api.api_key.get_secret_value() == "s3cret"
    assert settings.shown_api_url == "https://llm.example"
    assert settings.playground_concurrency == 8
    assert "s3cret" not in repr(settings)


def test_addresses_are_derived_from_the_api_port_unless_named(tmp_path: Path) -> None:
    env = tmp_path / ".env"
    env.write_text("API_PORT=9090\n")
    settings = load_service_settings(PlaygroundSettings, env)
    api: ApiSettings = ApiSettings(_env_file=env)  # type: ignore[call-arg]
    # One line moves the api, and both services follow it.
    assert settings.api_url == "http://127.0.0.1:9090" == api.public_url
    # Inside compose the playground reaches the api by service name, while people (and so the
    # snippets) reach it on the published loopback port.
    inside = FACTORY(_env_file=env, api_url="http://api:8080/")
    assert inside.api_url == "http://api:8080/"
    assert inside.shown_api_url == "http://127.0.0.1:9090"


def test_the_api_dials_triton_on_its_grpc_port(tmp_path: Path) -> None:
    env = tmp_path / ".env"
    env.write_text("TRITON_GRPC_PORT=9001\nPLAYGROUND_PORT=9860\n")
    api: ApiSettings = ApiSettings(_env_file=env)  # type: ignore[call-arg]
    assert api.triton_url == "127.0.0.1:9001"
    assert api.playground_url == "http://127.0.0.1:9860"
    named: ApiSettings = ApiSettings(_env_file=env, triton_url="triton:8001")  # type: ignore[call-arg]
    assert named.triton_url == "triton:8001"


def test_an_unknown_env_key_is_refused(tmp_path: Path) -> None:
    env = tmp_path / ".env"
    env.write_text("PLAYGROUND_CONCURENCY=8\n")
    with pytest.raises(EnvFileError, match="did you mean PLAYGROUND_CONCURRENCY"):
        load_service_settings(PlaygroundSettings, env)
    assert main(["serve", "--env-file", str(env)]) == 1


def test_a_login_needs_a_username_and_a_password() -> None:
    with pytest.raises(ValidationError, match="PLAYGROUND_USERNAME and PLAYGROUND_PASSWORD"):
        FACTORY(_env_file=None, playground_username="ann")
    settings = FACTORY(_env_file=None, playground_username="ann", playground_password="pw")
    assert launch_options(settings, "127.0.0.1")["auth"] == ("ann", "pw")
    assert launch_options(FACTORY(_env_file=None), "127.0.0.1")["auth"] is None


def test_launch_listens_where_configured_without_server_side_rendering() -> None:
    options = launch_options(FACTORY(_env_file=None, playground_port=7999), "127.0.0.1")
    assert options["server_port"] == 7999 and options["server_name"] == "127.0.0.1"
    assert options["ssr_mode"] is False and options["share"] is False


def test_the_playground_sends_its_use_key_else_api_key() -> None:
    login = {"playground_username": "team", "playground_password": "pw"}
    shared = FACTORY(_env_file=None, api_key="root", **login)
    assert shared.sent_api_key == "root"
    own = FACTORY(
        _env_file=None, api_key=SecretStr("root"), playground_api_key="team-use-key", **login
    )
    assert own.sent_api_key == "team-use-key"
    assert FACTORY(_env_file=None).sent_api_key is None
