"""Where an adapter's files come from: a local folder, or a Hugging Face repo id fetched by the
real huggingface_hub into CACHE_DIR/hub. The hub is not reachable from tests: offline mode makes
huggingface_hub answer from its cache, which is laid out here as a download leaves it."""

from __future__ import annotations

import shutil
from pathlib import Path

import huggingface_hub.constants
import pytest
from tritonbox_testing.lora import make_adapter

from tritonbox_api.service.adapter_files import fetch, read
from tritonbox_common.lora import AdapterError
from tritonbox_triton.prepare_model import prepare_default_model

REPO_ROOT = Path(__file__).resolve().parents[3]
MODEL_DIR = REPO_ROOT / ".cache" / "models" / "SmolLM2-135M-Instruct"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture(scope="module")
def adapter(tmp_path_factory: pytest.TempPathFactory) -> Path:
    prepare_default_model(MODEL_DIR)  # once per machine, as the server tests' fixture does
    return make_adapter(MODEL_DIR, tmp_path_factory.mktemp("peft") / "a", 7, r=4,
                        target_modules=["q_proj"])  # fmt: skip


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)


def _cache_repo(cache_dir: Path, repo: str, adapter: Path, ref: str = "main") -> Path:
    storage = cache_dir / "hub" / f"models--{repo.replace('/', '--')}"
    snapshot = storage / "snapshots" / COMMIT
    snapshot.mkdir(parents=True)
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        shutil.copy(adapter / name, snapshot / name)
    (storage / "refs").mkdir()
    (storage / "refs" / ref).write_text(COMMIT)
    return snapshot


def test_a_local_folder_is_used_where_it_is(adapter: Path, tmp_path: Path) -> None:
    assert fetch("local", str(adapter), cache_dir=tmp_path, token=None) == adapter.resolve()


def test_a_repo_id_comes_from_the_hub_cache(adapter: Path, tmp_path: Path, offline: None) -> None:
    snapshot = _cache_repo(tmp_path, "acme/pirate-lora", adapter)
    folder = fetch("pirate", "acme/pirate-lora", cache_dir=tmp_path, token=None)
    assert folder == snapshot
    assert read("pirate", folder).rank == 4


def test_a_revision_after_the_at_sign(adapter: Path, tmp_path: Path, offline: None) -> None:
    snapshot = _cache_repo(tmp_path, "acme/pirate-lora", adapter, ref="v1")
    assert fetch("pirate", "acme/pirate-lora@v1", cache_dir=tmp_path, token=None) == snapshot


def test_what_cannot_be_fetched_names_the_adapter(tmp_path: Path, offline: None) -> None:
    with pytest.raises(AdapterError, match=r"adapter ghost: cannot fetch 'acme/missing'"):
        fetch("ghost", "acme/missing", cache_dir=tmp_path, token=None)
    with pytest.raises(AdapterError, match=r"adapter odd: source 'not a repo' is neither"):
        fetch("odd", "not a repo", cache_dir=tmp_path, token=None)
