"""LoRA adapters through the api, end to end: registering (and every refusal), selecting one
with `adapter` and with the openai SDK's `model`, what the row and its page record, unloading
with a request in flight, a restart, and the engine's cache miss answered by one resend.

The adapters are small random ones made with peft at test time; the engine's exactness against
peft is tests/triton/server/test_lora.py's, here the api must give the same tokens as the engine
gets for that adapter alone.
"""

from __future__ import annotations

import html
import json
import shutil
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai import NotFoundError, OpenAI
from tritonbox_testing.lora import ALL, make_adapter

pytestmark = pytest.mark.server

PROMPT = "The three most important things about gardening are"
GREEDY = {"prompt": PROMPT, "max_tokens": 12, "temperature": 0}


@pytest.fixture(scope="module")
def folders(triton_server: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    model_dir = triton_server.settings.resolved_model_dir
    root = tmp_path_factory.mktemp("adapters")
    made = {
        "qv": make_adapter(model_dir, root / "qv", 1, r=8, lora_alpha=16,
                           target_modules=["q_proj", "v_proj"]),
        "all": make_adapter(model_dir, root / "all", 2, r=4, lora_alpha=8, target_modules=ALL),
        "big": make_adapter(model_dir, root / "big", 3, r=128, lora_alpha=128,
                            target_modules=["q_proj"]),
    }  # fmt: skip
    corrupt = root / "corrupt"
    shutil.copytree(made["qv"], corrupt)
    (corrupt / "adapter_model.safetensors").write_bytes(b"\x10\x00\x00\x00not safetensors")
    other = root / "other-base"
    shutil.copytree(made["qv"], other)
    config = json.loads((other / "adapter_config.json").read_text())
    (other / "adapter_config.json").write_text(
        json.dumps(config | {"base_model_name_or_path": "meta-llama/Llama-3.1-8B"})
    )
    return made | {"corrupt": corrupt, "other": other}


@pytest.fixture
def registered(api: httpx.Client) -> Iterator[Callable[[str, Path], dict[str, Any]]]:
    """Register adapters for one test; each is unregistered after it."""
    names: list[str] = []

    def register(name: str, folder: Path) -> dict[str, Any]:
        response = api.post("/v1/adapters", json={"name": name, "source": str(folder)})
        assert response.status_code == 201, response.text
        names.append(name)
        return dict(response.json())

    yield register
    for name in names:
        api.delete(f"/v1/adapters/{name}")


def _output(api: httpx.Client, **extra: Any) -> dict[str, Any]:
    response = api.post("/v1/predictions", json={"input": GREEDY | extra})
    assert response.status_code == 201, response.text
    body = dict(response.json())
    assert body["status"] == "succeeded", body
    return body


def test_an_adapter_is_a_model_of_its_own(
    api: httpx.Client, api_server: Any, registered: Any, folders: dict[str, Path]
) -> None:
    adapter = registered("gardener", folders["qv"])
    assert adapter["rank"] == 8 and adapter["target_modules"] == ["q_proj", "v_proj"]
    assert len(adapter["sha256"]) == 64 and adapter["task_id"] == int(adapter["sha256"][:15], 16)
    assert api.get("/v1/adapters/gardener").json() == adapter
    # No server folder in any answer: the source is shown relative to its ADAPTER_DIRS root.
    server_folder = str(folders["qv"].parent)
    assert adapter["source"].endswith("/qv") and not adapter["source"].startswith("/")
    for path in ("/v1/adapters", "/v1/models", "/v1/models/gardener"):
        assert server_folder not in api.get(path).text, path
    assert [a["name"] for a in api.get("/v1/adapters").json()["data"]] == ["gardener"]

    client = OpenAI(base_url=f"{api_server.url}/v1", api_key="not needed", max_retries=0)
    models = {m.id: m for m in client.models.list().data}
    base = next(m for m in models.values() if getattr(m, "parent", None) is None)
    assert getattr(models["gardener"], "parent", None) == base.id
    assert client.models.retrieve("gardener").id == "gardener"
    assert client.models.retrieve(base.id).id == base.id
    with pytest.raises(NotFoundError):
        client.models.retrieve("nobody")

    plain = client.completions.create(model=base.id, prompt=PROMPT, max_tokens=12, temperature=0)
    tuned = client.completions.create(model="gardener", prompt=PROMPT, max_tokens=12, temperature=0)
    assert tuned.model == "gardener" and plain.model == base.id
    assert tuned.choices[0].text != plain.choices[0].text  # the adapter changes the answer
    # Again: the engine has it cached now and gets the id alone; the answer is the same.
    again = client.completions.create(model="gardener", prompt=PROMPT, max_tokens=12, temperature=0)
    assert again.choices[0].text == tuned.choices[0].text

    # The native routes, the row and its permalink page say which adapter answered.
    row = _output(api, adapter="gardener")
    assert row["output"] == tuned.choices[0].text
    assert row["adapter"] == {"name": "gardener", "sha256": adapter["sha256"]}
    assert row["input"]["adapter"] == "gardener"
    assert _output(api)["adapter"] is None
    page = html.unescape(httpx.get(row["urls"]["web"]).text)
    assert "Adapter: gardener" in page and adapter["sha256"][:12] in page
    assert '"adapter": "gardener"' in page  # "copy as curl" asks for it again
    predicted = api.post("/predict", json=GREEDY | {"adapter": "gardener", "stream": False})
    assert predicted.status_code == 200 and predicted.json()["output"] == tuned.choices[0].text

    with pytest.raises(NotFoundError) as refused:
        client.completions.create(model="nobody", prompt=PROMPT, max_tokens=2)
    error: Any = refused.value.body
    assert error["param"] == "model" and "nobody" in error["message"]
    unknown = api.post("/v1/predictions", json={"input": GREEDY | {"adapter": "nobody"}})
    assert unknown.status_code == 404 and "nobody" in unknown.json()["error"]["message"]


@pytest.mark.parametrize(
    ("folder", "status", "reason"),
    [
        ("other", 400, "trained for 'meta-llama/Llama-3.1-8B'"),
        ("corrupt", 400, "adapter_model.safetensors is corrupt"),
        ("big", 400, "rank 128 is over this engine's maximum of 64"),
        ("missing", 400, "is not an adapter this server may load"),
        ("outside", 400, "is not an adapter this server may load"),
    ],
)
def test_adapters_that_cannot_be_served_are_refused_by_name(
    api: httpx.Client, folders: dict[str, Path], folder: str, status: int, reason: str
) -> None:
    source = str(folders.get(folder, "/etc" if folder == "outside" else "/nowhere/at all"))
    response = api.post("/v1/adapters", json={"name": f"bad-{folder}", "source": source})
    assert response.status_code == status, response.text
    message = response.json()["error"]["message"]
    assert f"adapter bad-{folder}" in message and reason in message, message
    assert api.get(f"/v1/adapters/bad-{folder}").status_code == 404
    assert _output(api)["status"] == "succeeded"  # and the server serves on


def test_names_are_checked_and_unique(
    api: httpx.Client, registered: Any, folders: dict[str, Path]
) -> None:
    registered("twice", folders["qv"])
    again = api.post("/v1/adapters", json={"name": "twice", "source": str(folders["all"])})
    assert again.status_code == 409 and "already registered" in again.text
    bad = api.post("/v1/adapters", json={"name": "../etc", "source": str(folders["qv"])})
    assert bad.status_code == 422 and "name" in bad.text
    assert api.delete("/v1/adapters/nobody").status_code == 404


def test_unloading_lets_running_requests_finish(
    api: httpx.Client, api_server: Any, registered: Any, folders: dict[str, Path]
) -> None:
    registered("leaving", folders["all"])
    results: list[httpx.Response] = []
    body = {"input": {"prompt": PROMPT, "max_tokens": 200, "min_tokens": 200, "adapter": "leaving"}}
    long = threading.Thread(
        target=lambda: results.append(
            httpx.post(f"{api_server.url}/v1/predictions", json=body, timeout=300)
        )
    )
    long.start()
    threading.Event().wait(1.5)  # it is generating by now
    assert api.delete("/v1/adapters/leaving").status_code == 200
    late = api.post("/v1/predictions", json={"input": GREEDY | {"adapter": "leaving"}})
    assert late.status_code == 404
    long.join(300)
    finished = results[0].json()
    assert finished["status"] == "succeeded" and finished["metrics"]["completion_tokens"] == 200
    assert finished["adapter"]["name"] == "leaving"


def test_registry_survives_a_restart_and_a_cache_miss_is_resent_once(
    launch: Any, triton_server: Any, folders: dict[str, Path], tmp_path: Path
) -> None:
    # LORA_ADAPTERS registers at start; a restart finds it in the database, not twice.
    running = launch(lora_adapters=f"startup={folders['qv']}")
    running.wait_ready()
    url = running.url

    def adapters() -> list[str]:
        return [a["name"] for a in httpx.get(f"{url}/v1/adapters").json()["data"]]

    for _ in range(50):
        if adapters() == ["startup"]:
            break
        threading.Event().wait(0.2)
    assert adapters() == ["startup"]
    body = {"input": GREEDY | {"adapter": "startup"}}
    first = httpx.post(f"{url}/v1/predictions", json=body, timeout=120).json()["output"]

    # Triton restarts: its engine forgets every adapter; this api process sent the weights
    # already, so it sends the id alone, hears "not found in cache", and resends them once.
    triton_server.server.stop()
    triton_server.server.start()
    triton_server.server.wait_ready(300)
    running.wait_ready()
    after = httpx.post(f"{url}/v1/predictions", json=body, timeout=120)
    assert after.status_code == 201 and after.json()["output"] == first, after.text
    assert "not in the engine's cache; sending its weights" in running.log_path.read_text()

    # An adapter registered only through the route is a row like the other: a restart with
    # LORA_ADAPTERS unset still lists both, as models too, and serves the posted one.
    posted = httpx.post(
        f"{url}/v1/adapters", json={"name": "posted", "source": str(folders["all"])}, timeout=120
    )
    assert posted.status_code == 201, posted.text
    posted_body = {"input": GREEDY | {"adapter": "posted"}}
    answer = httpx.post(f"{url}/v1/predictions", json=posted_body, timeout=120).json()["output"]
    running.stop()
    running.start(lora_adapters="")
    running.wait_ready()
    assert adapters() == ["posted", "startup"]
    models = {m["id"]: m for m in httpx.get(f"{url}/v1/models").json()["data"]}
    assert models["posted"]["parent"] is not None and "startup" in models
    served = httpx.post(f"{url}/v1/predictions", json=posted_body, timeout=120)
    assert served.status_code == 201, served.text
    assert served.json()["adapter"] == {"name": "posted", "sha256": posted.json()["sha256"]}
    assert served.json()["output"] == answer

    running.stop()
    running.start()  # LORA_ADAPTERS again: its adapter is found in the database, not twice
    assert adapters() == ["posted", "startup"]
