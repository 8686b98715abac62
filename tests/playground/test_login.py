"""PLAYGROUND_USERNAME/PLAYGROUND_PASSWORD put a login in front of the whole playground."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest
from gradio_client import Client
from tritonbox_testing.playground_process import RunningPlayground
from tritonbox_testing.ports import free_port


def test_the_playground_asks_for_its_login(launch: Callable[..., RunningPlayground]) -> None:
    # No api needed: the login and the snippets are the playground's own.
    playground = launch(
        f"http://127.0.0.1:{free_port()}",
        playground_username="ann",
        playground_password="correct horse",
    )
    assert httpx.get(f"{playground.url}/config", timeout=10).status_code == 401
    with pytest.raises(Exception, match=r"(?i)login|auth|401"):
        Client(playground.url, verbose=False)
    wrong = httpx.post(
        f"{playground.url}/login", data={"username": "ann", "password": "wrong"}, timeout=10
    )
    assert wrong.status_code >= 400

    client = Client(playground.url, auth=("ann", "correct horse"), verbose=False)
    curl, _, _ = client.predict(prompt="Hi", api_name="/snippets")
    assert '"prompt": "Hi"' in curl
    client.close()
