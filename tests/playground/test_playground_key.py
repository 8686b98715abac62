"""The playground login maps to a `use` key: the playground's server sends PLAYGROUND_API_KEY
(not API_KEY, which may manage), and the api records that key's name on its predictions."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gradio_client import Client
from tritonbox_testing.api_process import launch_api
from tritonbox_testing.playground_process import RunningPlayground

ROOT, USE = "root-key-for-the-playground-test", "playground-use-key-2c9e"


def test_the_playground_sends_its_use_key(
    triton_server: Any, tmp_path: Path, launch: Callable[..., RunningPlayground]
) -> None:
    keyed = launch_api(
        triton_server, tmp_path / "keyed-api", api_key=ROOT, api_keys=f"playground:use:{USE}"
    )
    try:
        playground = launch(keyed.url, api_key=ROOT, playground_api_key=USE)
        client = Client(playground.url, verbose=False)
        answer, result, prediction_id = client.predict(
            prompt="The capital of France is", max_tokens=4, temperature=0, api_name="/run"
        )
        client.close()
        assert answer and "Done" in str(result)
        with sqlite3.connect(keyed.database_path) as connection:
            (name,) = connection.execute(
                "SELECT api_key_name FROM prediction WHERE id = ?", (str(prediction_id),)
            ).fetchone()
        assert name == "playground"
    finally:
        keyed.stop()
