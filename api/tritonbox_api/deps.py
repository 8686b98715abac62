"""The app's long-lived parts and the `Annotated` dependencies routes declare."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated

from fastapi import Depends, Request

from tritonbox_api.db.session import Database
from tritonbox_api.keys import ApiKey, KeyRing, Role
from tritonbox_api.processes import worker_count
from tritonbox_api.protocol.errors import ApiError
from tritonbox_api.rate_limit import STATE, Metered, RateLimiter
from tritonbox_api.service import batch_context
from tritonbox_api.service.adapters import AdapterService
from tritonbox_api.service.batch_files import FileService
from tritonbox_api.service.batches import BatchService
from tritonbox_api.service.engine_context import EngineContextLoader
from tritonbox_api.service.predictions import PredictionService
from tritonbox_api.settings import ApiSettings
from tritonbox_api.triton_gateway import TritonGateway


@dataclass
class Services:
    settings: ApiSettings
    gateway: TritonGateway
    database: Database
    engine_context: EngineContextLoader  # the tokenizer and limits Triton reports
    predictions: PredictionService
    adapters: AdapterService  # the registered LoRA adapters
    keys: KeyRing  # who may call what (API_KEY, API_KEYS, API_KEYS_FILE)
    files: FileService  # batch files (Files API): inputs uploaded, outputs batches wrote
    batches: BatchService  # the Batch API's batches; its runner runs their lines
    # Every key's requests and tokens per minute (rate_limit.py), this worker's share.
    limiter: RateLimiter = field(init=False)

    def __post_init__(self) -> None:
        settings = self.settings
        self.limiter = RateLimiter(
            rpm=settings.rate_limit_rpm, tpm=settings.rate_limit_tpm, workers=worker_count(settings)
        )


# The dependencies are `async def` though they never wait: FastAPI runs a plain `def` dependency
# in its thread pool, and on a loaded event loop each of those hops costs milliseconds of time
# to first token (two per request here) for microseconds of work.
async def get_services(request: Request) -> Services:
    services: Services = request.app.state.services
    return services


ServicesDep = Annotated[Services, Depends(get_services)]


def _authorization(request: Request) -> str | None:
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    return given.strip() if scheme.lower() == "bearer" else None


async def require_api_key(request: Request, services: ServicesDep) -> None:
    """With keys set, every guarded route needs `Authorization: Bearer <a key>`: any role may
    use. The key's name is left on the request for the prediction's row and the metrics."""
    line = batch_context.current()
    if line is not None:  # a batch line the api runs itself: its batch's key (checked at create)
        request.state.api_key = line.key
        return
    if services.keys.open:
        return
    given = _authorization(request)
    key = services.keys.identify(given) if given is not None else None
    if key is None:
        raise ApiError(
            401,
            "missing or wrong API key: send `Authorization: Bearer <API_KEY>`",
            type="authentication_error",
            headers={"WWW-Authenticate": "Bearer"},
        )
    request.state.api_key = key


async def require_manage(request: Request, services: ServicesDep) -> None:
    """After require_api_key (the router's): 403 unless the key holds the `manage` role."""
    if services.keys.open:
        return
    await require_api_key(request, services)  # idempotent: stands alone if the router's moves
    key: ApiKey = request.state.api_key
    if not key.has(Role.MANAGE):
        raise ApiError(
            403,
            f"the key {key.name} lacks the manage role: registering and deleting adapters "
            "needs a key with role manage (API_KEYS)",
            type="permission_error",
        )


async def limit_requests(request: Request, services: ServicesDep) -> None:
    """After require_api_key, on the generating routes: one of the key's requests per minute
    (429 past it), and the request metered for its tokens and its answer's x-ratelimit-*
    headers. Batch lines are not metered: they run in the room live requests leave."""
    key: ApiKey | None = getattr(request.state, "api_key", None)
    if key is None or batch_context.current() is not None:
        return  # no keys, nothing to tell callers apart by
    setattr(request.state, STATE, Metered(services.limiter, key))  # the headers, even on a 429
    services.limiter.admit_request(key)


def metered(request: Request) -> Metered | None:
    """The request's key and limits, when limit_requests metered it."""
    found = getattr(request.state, STATE, None)
    return found if isinstance(found, Metered) else None


def key_name(request: Request) -> str | None:
    """The name of the key the request came with; None when the api has no keys."""
    key: ApiKey | None = getattr(request.state, "api_key", None)
    return key.name if key is not None else None


Guarded = [Depends(require_api_key)]
Managed = [Depends(require_manage)]
Limited = [Depends(limit_requests)]  # the generating routes' (their router has Guarded first)
