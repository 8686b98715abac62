"""The registry pins an adapter registered from a Hugging Face repo id: the row records the
commit its files came from, so a later load (another worker, a restart) reads the files that
were checked and hashed, even after the repo's main branch moved on. It refuses a malformed
adapter and the base model's own name by the adapter's name, records a local source as its
absolute folder, registers LORA_ADAPTERS past a bad entry, converts in a thread once however
many requests ask, and keeps converted adapters within ADAPTER_CACHE_BYTES.

The real AdapterService on a real SQLite database and the real huggingface_hub (offline, from
CACHE_DIR/hub); the engine is a stand-in that answers what the cpu engine supports."""

from __future__ import annotations

import asyncio
import shutil
import struct
import threading
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from tritonbox_testing.lora import ALL, hub_snapshot, make_adapter

from tritonbox_api.db.session import Database
from tritonbox_api.protocol.errors import ApiError
from tritonbox_api.service import adapters as adapters_module
from tritonbox_api.service.adapters import AdapterService
from tritonbox_api.settings import ApiSettings
from tritonbox_api.triton_gateway import LoraSupport
from tritonbox_common.lora import to_lora_tensors
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


def _service(database: Database, cache_dir: Path, **options: Any) -> AdapterService:
    """A fresh service, as an api worker starts (nothing converted, nothing sent); acme/* and
    pytest's folders of this session (the test's and the module's) allowed."""
    settings = ApiSettings(  # type: ignore[call-arg]
        _env_file=None, cache_dir=cache_dir, adapter_hub_repos="acme/*",
        adapter_dirs=str(cache_dir.parent.parent), **options,
    )  # fmt: skip
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


@pytest.fixture(scope="module")
def qv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    prepare_default_model(MODEL_DIR)
    folder = tmp_path_factory.mktemp("qv") / "qv"
    return make_adapter(MODEL_DIR, folder, 5, r=4, target_modules=["q_proj", "v_proj"])


def _refused(service: AdapterService, name: str, source: str) -> ApiError:
    with pytest.raises(ApiError) as refused:
        asyncio.run(service.register(name, source))
    return refused.value


def test_a_malformed_header_and_the_bases_name_are_refused_by_name(
    database: Database, tmp_path: Path, qv: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bad = tmp_path / "adapters" / "bad"
    shutil.copytree(qv, bad)
    header = b'{"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": {"dtype": ' \
        b'"F32", "shape": [-4, 576], "data_offsets": [0, 16]}}'  # fmt: skip
    (bad / "adapter_model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header)
    service = _service(database, tmp_path / "cache")
    error = _refused(service, "negative", str(bad))
    assert error.status_code == 400 and error.message.startswith("adapter negative: ")
    assert str(tmp_path) not in error.message  # no server folder in the answer
    base = _refused(service, MODEL_DIR.name.upper(), str(qv))
    assert base.status_code == 409 and "the name is the base model's" in base.message

    monkeypatch.chdir(tmp_path)  # a relative source is recorded as the absolute folder
    (tmp_path / "adapters" / "qv").symlink_to(qv)
    row = asyncio.run(service.register("rel", "adapters/qv"))
    assert row.source == str(qv.resolve())
    assert service.shown_source(row) == f"{qv.parent.name}/{qv.name}"  # no server folder

    gone = shutil.copytree(qv, tmp_path / "adapters" / "gone")  # registered, then removed
    asyncio.run(service.register("gone", str(gone)))
    shutil.rmtree(gone)
    with pytest.raises(ApiError) as missing:
        asyncio.run(_service(database, tmp_path / "cache").select("gone"))
    assert missing.value.status_code == 409 and "unregister it" in missing.value.message
    assert str(tmp_path) not in missing.value.message


def test_a_bad_lora_adapters_entry_is_logged_and_the_others_register(
    database: Database, tmp_path: Path, qv: Path, caplog: pytest.LogCaptureFixture
) -> None:
    bad = tmp_path / "adapters" / "broken"
    shutil.copytree(qv, bad)
    (bad / "adapter_model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00[-1,2,3]")
    entries = f"first=/nowhere,broken={bad},nameless,good={qv}"
    service = _service(database, tmp_path / "cache", lora_adapters=entries)
    asyncio.run(service.register_configured())
    assert [row.name for row in asyncio.run(service.list())] == ["good"]
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 3, errors
    assert "'first=/nowhere'" in errors[0] and "'nameless'" in errors[2]
    assert f"'broken={bad}'" in errors[1] and "adapter broken:" in errors[1]


def test_converted_adapters_are_kept_within_the_byte_bound_and_loaded_once(
    database: Database, tmp_path: Path, qv: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    other = make_adapter(MODEL_DIR, tmp_path / "adapters" / "o", 6, r=4, target_modules=["q_proj"])
    threads: list[str] = []
    real = to_lora_tensors

    def convert(*args: Any) -> Any:
        threads.append(threading.current_thread().name)
        return real(*args)

    monkeypatch.setattr(adapters_module, "to_lora_tensors", convert)

    async def scenario() -> None:
        registry = _service(database, tmp_path / "cache")
        qv_row = await registry.register("qv", str(qv))
        await registry.register("o", str(other))
        one = (await registry.select("qv")).full.weights.nbytes
        # A worker whose cache holds one of them: a burst of requests loads each once.
        worker = _service(database, tmp_path / "cache", adapter_cache_bytes=one + 1000)
        threads.clear()
        picked = await asyncio.gather(*(worker.select("qv") for _ in range(8)))
        assert len(threads) == 1 and {p.sha256 for p in picked} == {qv_row.sha256}
        await worker.select("o")  # evicts qv: both do not fit
        assert worker._converted.held_bytes <= one + 1000
        assert qv_row.sha256 not in worker._converted
        await worker.select("qv")
        assert len(threads) == 3

    asyncio.run(scenario())
    assert threading.main_thread().name not in threads  # converted off the event loop
