"""The registry pins an adapter registered from a Hugging Face repo id: the row records the
commit its files came from, so a later load (another worker, a restart) reads the files that
were checked and hashed, even after the repo's main branch moved on.

The real AdapterService on a real SQLite database and the real huggingface_hub (offline, from
CACHE_DIR/hub); the engine is a stand-in that answers what the cpu engine supports."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from tritonbox_testing.lora import ALL, hub_snapshot, make_adapter

from tritonbox_api.db.session import Database
from tritonbox_api.service.adapters import AdapterService
from tritonbox_api.settings import ApiSettings
from tritonbox_api.triton_gateway import LoraSupport
from tritonbox_triton.prepare_model import prepare_default_model

MODEL_DIR = Path(__file__).resolve().parents[3] / ".cache" / "models" / "SmolLM2-135M-Instruct"
FIRST = "0123456789abcdef0123456789abcdef01234567"
LATER = "89abcdef0123456789abcdef0123456789abcdef"


class Engine:
    """What the service asks the engine: the LoRA support, and the served base's folder."""

    async def lora_support(self) -> LoraSupport:
        return LoraSupport(max_rank=64, target_modules=tuple(ALL), weights_datatype="FP32")

    async def get(self) -> Any:
        return SimpleNamespace(
            info=SimpleNamespace(tokenizer_dir=MODEL_DIR), model_name=MODEL_DIR.name
        )


@pytest.fixture
def database(tmp_path: Path) -> Iterator[Database]:
    database = Database(tmp_path / "tritonbox.db")
    database.open()
    yield database
    database.close()


def _service(database: Database, cache_dir: Path) -> AdapterService:
    """A fresh service, as an api worker starts (nothing converted, nothing sent)."""
    settings = ApiSettings(_env_file=None, cache_dir=cache_dir)  # type: ignore[call-arg]
    engine: Any = Engine()
    return AdapterService(
        database=database, gateway=engine, engine_context=engine, settings=settings
    )


def test_a_repo_id_is_recorded_at_its_commit_and_loads_it_after_main_moved(
    database: Database, tmp_path: Path, offline: None
) -> None:
    prepare_default_model(MODEL_DIR)
    first = make_adapter(MODEL_DIR, tmp_path / "first", 3, r=4, target_modules=["q_proj"])
    later = make_adapter(MODEL_DIR, tmp_path / "later", 4, r=4, target_modules=["q_proj"])
    cache = tmp_path / "cache"
    hub_snapshot(cache, "acme/pirate-lora", first, FIRST)

    async def scenario() -> None:
        row = await _service(database, cache).register("pirate", "acme/pirate-lora")
        assert row.source == f"acme/pirate-lora@{FIRST}"
        assert [a.source for a in await _service(database, cache).list()] == [row.source]
        registered = await _service(database, cache).select("pirate")

        hub_snapshot(cache, "acme/pirate-lora", later, LATER)  # the owner pushed other weights
        restarted = await _service(database, cache).select("pirate")  # not 409 "changed"
        assert restarted.sha256 == row.sha256
        assert np.array_equal(restarted.full.weights, registered.full.weights)

    asyncio.run(scenario())
