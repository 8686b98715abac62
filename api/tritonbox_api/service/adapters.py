"""The LoRA adapter registry: named adapters of the served base model, and what a request
sends the engine for one.

Registered adapters live in the database (every api worker and every restart sees the same
ones); their weights stay in their source and are read, checked against the recorded sha256 and
converted to TensorRT-LLM's `lora_weights` / `lora_config` on a worker's first use, then kept
in a small LRU. The engine caches adapters by task id, so a worker sends the weights the first
time it uses an adapter and the id alone afterwards; when the engine no longer has them (evicted,
restarted) it says so and the prediction service resends them once (`with_weights`).
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from dataclasses import dataclass

from tritonbox_api.db import adapters as crud
from tritonbox_api.db.models import Adapter
from tritonbox_api.db.session import Database
from tritonbox_api.protocol.errors import ApiError, unavailable
from tritonbox_api.service import adapter_files
from tritonbox_api.service.engine_context import EngineContextLoader
from tritonbox_api.settings import ApiSettings
from tritonbox_api.triton_gateway import LoraSupport, TritonGateway, TritonUnavailableError
from tritonbox_common.client import LoraInputs
from tritonbox_common.lora import AdapterError, PeftAdapter, task_id, to_lora_tensors

log = logging.getLogger(__name__)
CONVERTED_KEPT = 16  # adapters whose converted tensors a worker keeps (a few MB each)
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
        self._support: LoraSupport | None = None
        self._converted: OrderedDict[str, LoraInputs] = OrderedDict()  # by sha256
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
        token = self._settings.hf_token.get_secret_value() if self._settings.hf_token else None

        def load() -> tuple[PeftAdapter, str]:
            folder = adapter_files.fetch(
                name, source, cache_dir=self._settings.cache_dir, token=token
            )
            adapter = adapter_files.read(name, folder)
            adapter_files.check_fits(
                name, adapter, support=support,
                model_dir=context.info.tokenizer_dir, model_name=context.model_name,
            )  # fmt: skip
            return adapter, adapter_files.pinned(source, folder)

        try:
            adapter, recorded = await asyncio.to_thread(load)
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
        self._remember(adapter, support)
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
        full = self._converted.get(row.sha256)
        if full is None:
            full = await self._load(row)
        self._converted.move_to_end(row.sha256)
        lora = full.id_only() if full.task_id in self._sent else full
        self._sent.add(full.task_id)
        return AdapterSelection(name=row.name, sha256=row.sha256, lora=lora, full=full)

    async def _load(self, row: Adapter) -> LoraInputs:
        support = await self.support()
        token = self._settings.hf_token.get_secret_value() if self._settings.hf_token else None

        def load() -> PeftAdapter:
            folder = adapter_files.fetch(
                row.name, row.source, cache_dir=self._settings.cache_dir, token=token
            )
            return adapter_files.read(row.name, folder)

        try:
            adapter = await asyncio.to_thread(load)
        except AdapterError as error:
            message = f"{error}; unregister it and register it again"
            raise ApiError(409, message, param="adapter") from None
        if adapter.sha256 != row.sha256:
            raise ApiError(
                409,
                f"adapter {row.name}: its files in {row.source} changed since it was registered "
                f"(sha256 {adapter.sha256[:12]}…, registered {row.sha256[:12]}…); unregister it "
                "and register it again",
                param="adapter",
            )
        return self._remember(adapter, support)

    def _remember(self, adapter: PeftAdapter, support: LoraSupport) -> LoraInputs:
        weights, config = to_lora_tensors(adapter, "float32")
        inputs = LoraInputs(task_id(adapter.sha256), weights, config, support.weights_datatype)
        self._converted[adapter.sha256] = inputs
        while len(self._converted) > CONVERTED_KEPT:
            self._converted.popitem(last=False)
        return inputs

    async def register_configured(self) -> None:
        """LORA_ADAPTERS at start, once the engine answers: each `name=source` not registered
        yet is registered; one that fails is logged with its reason and left out."""
        entries = [e.strip() for e in self._settings.lora_adapters.split(",") if e.strip()]
        for entry in entries:
            name, _, source = (part.strip() for part in entry.partition("="))
            if not name or not source:
                log.error("LORA_ADAPTERS: %r is not name=source; left out", entry)
                continue
            while True:
                try:
                    if await self.get(name) is None:
                        await self.register(name, source)
                except ApiError as error:
                    if error.status_code == 503:  # the engine is starting: try again shortly
                        await asyncio.sleep(2)
                        continue
                    if error.status_code != 409:  # 409: another api worker registered it
                        log.error("LORA_ADAPTERS: adapter %s left out: %s", name, error.message)
                break
