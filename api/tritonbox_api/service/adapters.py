"""The LoRA adapter registry: named adapters of the served base model, and what a request
sends the engine for one.

Registered adapters live in the database (every api worker and every restart sees the same
ones); their weights stay in their source and are read, checked against the recorded sha256 and
converted to TensorRT-LLM's `lora_weights` / `lora_config` on a worker's first use (in a thread:
a large adapter takes seconds the event loop must not), then kept in an LRU bounded in bytes
(adapter_cache.py). The engine caches adapters by task id, so a worker sends the weights the first
time it uses an adapter and the id alone afterwards; when the engine no longer has them (evicted,
restarted) it says so and the prediction service resends them once (`with_weights`).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from tritonbox_api.db import adapters as crud
from tritonbox_api.db.models import Adapter
from tritonbox_api.db.session import Database
from tritonbox_api.protocol.errors import ApiError, unavailable
from tritonbox_api.service import adapter_files, adapter_sources
from tritonbox_api.service.adapter_cache import ConvertedCache
from tritonbox_api.service.engine_context import EngineContextLoader
from tritonbox_api.settings import ApiSettings
from tritonbox_api.triton_gateway import LoraSupport, TritonGateway, TritonUnavailableError
from tritonbox_common.client import LoraInputs
from tritonbox_common.lora import AdapterError, PeftAdapter, task_id, to_lora_tensors

log = logging.getLogger(__name__)
# What the engine (TensorRT-LLM 0.20's PeftCacheManager, and the cpu engine) says when a task id
# comes without weights and is not in its cache.
NOT_IN_CACHE = "not found in cache"


@dataclass(frozen=True)
class AdapterSelection:
    """The adapter a prediction runs with: what the row records and what the engine gets."""

    name: str
    sha256: str
    lora: LoraInputs  # the id alone once this worker has sent the weights, else with them
    full: LoraInputs  # with the weights, for the one resend after a cache miss


def not_found(name: str) -> ApiError:
    return ApiError(
        404, f"adapter {name!r} is not registered (GET /v1/adapters lists them)",
        type="not_found_error", param="adapter",
    )  # fmt: skip


class AdapterService:
    def __init__(
        self,
        *,
        database: Database,
        gateway: TritonGateway,
        engine_context: EngineContextLoader,
        settings: ApiSettings,
    ) -> None:
        self._database = database
        self._gateway = gateway
        self._engine_context = engine_context
        self._settings = settings
        self._policy = adapter_sources.SourcePolicy.of(settings)
        self._support: LoraSupport | None = None
        self._converted = ConvertedCache(settings.adapter_cache_bytes)  # by sha256
        self._sent: set[int] = set()  # task ids whose weights this worker has sent

    async def support(self) -> LoraSupport:
        if self._support is None:
            try:
                self._support = await self._gateway.lora_support()
            except TritonUnavailableError as error:
                raise unavailable(f"the engine is not available yet: {error}") from None
        return self._support

    async def register(self, name: str, source: str) -> Adapter:
        """Fetch, validate against the base and record; 400 naming the reason, 409 if taken."""
        if await self.get(name) is not None:
            raise ApiError(409, f"adapter {name!r} is already registered", param="name")
        support = await self.support()
        try:
            context = await self._engine_context.get()
        except TritonUnavailableError as error:
            raise unavailable(f"the engine is not available yet: {error}") from None
        if name.lower() == context.model_name.lower():  # one id, two models: /v1/models lists both
            raise ApiError(409, f"adapter {name!r}: the name is the base model's", param="name")

        def load() -> tuple[PeftAdapter, str, LoraInputs]:
            local = adapter_sources.local_folder(source, self._policy)
            folder = local or adapter_sources.fetch(name, source, self._policy)
            adapter = adapter_files.read(name, folder, self._policy.max_bytes)
            adapter_files.check_fits(
                name, adapter, support=support,
                model_dir=context.info.tokenizer_dir, model_name=context.model_name,
            )  # fmt: skip
            recorded = adapter_files.pinned(source, folder, local=local is not None)
            return adapter, recorded, _convert(adapter, support)

        try:
            adapter, recorded, inputs = await asyncio.to_thread(load)
        except AdapterError as error:  # not a malformed field: a well-formed adapter refused
            raise ApiError(400, str(error), param="source") from None
        row = Adapter(
            name=name, source=recorded, base_model=adapter.base_model, rank=adapter.rank,
            alpha=adapter.alpha, target_modules=list(adapter.target_modules),
            sha256=adapter.sha256, size_bytes=adapter.size_bytes,
        )  # fmt: skip
        try:
            created = await self._database.run(
                lambda s: crud.create_adapter(session=s, adapter=row)
            )
        except crud.AdapterExistsError:
            raise ApiError(409, f"adapter {name!r} is already registered", param="name") from None
        self._converted.put(adapter.sha256, inputs)
        log.info("adapter %s registered from %s (rank %d)", name, recorded, adapter.rank)
        return created

    async def get(self, name: str) -> Adapter | None:
        return await self._database.read(lambda s: crud.get_adapter(session=s, name=name))

    async def list(self) -> list[Adapter]:
        return await self._database.read(lambda s: crud.list_adapters(session=s))

    async def delete(self, name: str) -> Adapter:
        """Unregister; predictions already running with it finish, new ones get 404."""
        removed = await self._database.run(lambda s: crud.delete_adapter(session=s, name=name))
        if removed is None:
            raise not_found(name)
        log.info("adapter %s unregistered", name)
        return removed

    async def select(self, name: str) -> AdapterSelection:
        """What a prediction with adapter `name` records and sends; 404 if unknown."""
        row = await self.get(name)
        if row is None:
            raise not_found(name)
        full = await self._converted.get_or_load(row.sha256, lambda: self._load(row))
        lora = full.id_only() if full.task_id in self._sent else full
        self._sent.add(full.task_id)
        return AdapterSelection(name=row.name, sha256=row.sha256, lora=lora, full=full)

    async def _load(self, row: Adapter) -> LoraInputs:
        support = await self.support()

        def load() -> LoraInputs:
            label = self.shown_source(row)
            folder = adapter_sources.fetch(row.name, row.source, self._policy, label)
            adapter = adapter_files.read(row.name, folder, self._policy.max_bytes)
            if adapter.sha256 != row.sha256:
                raise AdapterError(
                    f"adapter {row.name}: its files changed since it was registered (sha256 "
                    f"{adapter.sha256[:12]}…, registered {row.sha256[:12]}…)"
                )
            return _convert(adapter, support)

        try:
            return await asyncio.to_thread(load)
        except AdapterError as error:
            message = f"{error}; unregister it and register it again"
            raise ApiError(409, message, param="adapter") from None

    def shown_source(self, row: Adapter) -> str:
        """The row's source as answers show it: no server folder (adapter_sources.shown)."""
        return adapter_sources.shown(row.source, self._policy)

    async def register_configured(self) -> None:
        """LORA_ADAPTERS at start, once the engine answers: each `name=source` not registered
        yet is registered; one that fails is logged (error level, naming the entry and the
        reason) and left out, and the others are registered all the same."""
        entries = [e.strip() for e in self._settings.lora_adapters.split(",") if e.strip()]
        for entry in entries:
            name, _, source = (part.strip() for part in entry.partition("="))
            if not name or not source:
                log.error("LORA_ADAPTERS entry %r is not name=source: left out", entry)
                continue
            await self._register_entry(entry, name, source)

    async def _register_entry(self, entry: str, name: str, source: str) -> None:
        while True:
            try:
                if await self.get(name) is None:
                    await self.register(name, source)
            except ApiError as error:
                if error.status_code == 503:  # the engine is starting: try again shortly
                    await asyncio.sleep(2)
                    continue
                if await self.get(name) is None:  # not 409 from another worker registering it
                    log.error("LORA_ADAPTERS entry %r left out: %s", entry, error.message)
            except Exception:  # whatever it is, the entries after this one still register
                log.exception("LORA_ADAPTERS entry %r left out: unexpected error", entry)
            return


def _convert(adapter: PeftAdapter, support: LoraSupport) -> LoraInputs:
    """TensorRT-LLM's tensors for `adapter` (seconds for a large one: called in a thread)."""
    weights, config = to_lora_tensors(adapter, "float32")
    return LoraInputs(task_id(adapter.sha256), weights, config, support.weights_datatype)
