"""The playground's "copy as code" with an adapter picked, through gradio_client against the
real stack: each snippet names the adapter and the sha256 the api lists for it, and runs."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from gradio_client import Client
from tritonbox_testing.lora import make_adapter
from tritonbox_testing.playground_process import RunningPlayground

from tritonbox_triton.settings import DEFAULT_MODEL_NAME

MODEL = Path(__file__).resolve().parents[2] / ".cache" / "models" / DEFAULT_MODEL_NAME


@pytest.fixture
def client(playground_server: RunningPlayground) -> Iterator[Client]:
    client = Client(playground_server.url, verbose=False)
    yield client
    client.close()


def test_a_snippet_names_the_picked_adapter_by_its_hash_and_runs_it(
    client: Client, api: httpx.Client, tmp_path: Path
) -> None:
    folder = make_adapter(MODEL, tmp_path / "snippet-lora", 5, r=4, target_modules=["q_proj"])
    registered = api.post("/v1/adapters", json={"name": "snippet-lora", "source": str(folder)})
    assert registered.status_code == 201, registered.text
    sha = registered.json()["sha256"]
    try:
        curl, python, openai = client.predict(
            prompt="The capital of France is", max_tokens=4, temperature=0,
            adapter="snippet-lora", api_name="/snippets",
        )  # fmt: skip
        note = f"# adapter snippet-lora sha256:{sha[:12]}"
        assert [text.splitlines()[0] for text in (curl, python, openai)] == [note] * 3
        assert 'model = "snippet-lora"' in openai and "model=model," in openai
        script = tmp_path / "snippet.py"
        script.write_text(python)
        env = {**os.environ, "PYTHONSAFEPATH": "1"}
        done = subprocess.run(
            [sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=env
        )
        assert done.returncode == 0 and "permalink:" in done.stdout, done.stderr
        latest = api.get("/v1/predictions", params={"limit": 1}).json()["results"][0]
        assert latest["adapter"] == {"name": "snippet-lora", "sha256": sha}
    finally:
        api.delete("/v1/adapters/snippet-lora")
