"""Closed unless opened on purpose: the api and the playground refuse to be reachable beyond this
machine without a key (a login), unless ALLOW_OPEN_ACCESS says so; the message says both ways."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from tritonbox_api.cli import main as api_main
from tritonbox_api.settings import ApiSettings
from tritonbox_common.shared_settings import is_loopback
from tritonbox_playground.settings import PlaygroundSettings

API: Any = ApiSettings
PLAYGROUND: Any = PlaygroundSettings


@pytest.mark.parametrize("address", ["127.0.0.1", "127.0.0.2", "localhost", "::1", "[::1]"])
def test_loopback_addresses(address: str) -> None:
    assert is_loopback(address)


@pytest.mark.parametrize("address", ["0.0.0.0", "::", "192.168.1.5", "server.example"])
def test_other_addresses(address: str) -> None:
    assert not is_loopback(address)


def test_the_default_is_this_machine_only() -> None:
    assert API(_env_file=None).publish_address == "127.0.0.1"
    assert PLAYGROUND(_env_file=None).publish_address == "127.0.0.1"


def test_the_api_refuses_to_serve_others_without_a_key() -> None:
    with pytest.raises(ValidationError) as refused:
        API(_env_file=None, publish_address="0.0.0.0")
    message = str(refused.value)
    assert "PUBLISH_ADDRESS=0.0.0.0" in message
    assert "API_KEY" in message and "ALLOW_OPEN_ACCESS=true" in message
    assert API(_env_file=None, publish_address="0.0.0.0", api_key="k").api_key is not None
    assert API(_env_file=None, publish_address="0.0.0.0", allow_open_access=True)


def test_the_playground_refuses_to_serve_others_without_a_login() -> None:
    with pytest.raises(ValidationError, match="PLAYGROUND_USERNAME and PLAYGROUND_PASSWORD"):
        PLAYGROUND(_env_file=None, publish_address="0.0.0.0")
    # The api's key does not guard the playground: it would use the model on anyone's behalf.
    with pytest.raises(ValidationError, match="PLAYGROUND_USERNAME"):
        PLAYGROUND(_env_file=None, publish_address="0.0.0.0", api_key="k")
    assert PLAYGROUND(
        _env_file=None,
        publish_address="0.0.0.0",
        playground_username="ann",
        playground_password="pw",
    )
    assert PLAYGROUND(_env_file=None, publish_address="0.0.0.0", allow_open_access=True)


def test_the_refusal_is_one_line_at_start(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    env = tmp_path / ".env"
    env.write_text("PUBLISH_ADDRESS=0.0.0.0\n")
    assert api_main(["serve", "--env-file", str(env)]) == 1
    err = capsys.readouterr().err
    assert "tritonbox-api serve:" in err and "set PUBLISH_ADDRESS=127.0.0.1" in err
