"""The app's long-lived parts and the `Annotated` dependencies routes declare."""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request

from tritonbox_api.db.session import Database
from tritonbox_api.protocol.errors import ApiError
from tritonbox_api.service.adapters import AdapterService
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


# The dependencies are `async def` though they never wait: FastAPI runs a plain `def` dependency
# in its thread pool, and on a loaded event loop each of those hops costs milliseconds of time
# to first token (two per request here) for microseconds of work.
async def get_services(request: Request) -> Services:
    services: Services = request.app.state.services
    return services


ServicesDep = Annotated[Services, Depends(get_services)]


async def require_api_key(request: Request, services: ServicesDep) -> None:
    """With API_KEY set, every guarded route needs `Authorization: Bearer <API_KEY>`."""
    expected = services.settings.api_key
    if expected is None:
        return
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    # compare_digest: the time taken must not tell how much of a guessed key was right.
    if scheme.lower() != "bearer" or not secrets.compare_digest(
        given.strip().encode(), expected.get_secret_value().encode()
    ):
        raise ApiError(
            401,
            "missing or wrong API key: send `Authorization: Bearer <API_KEY>`",
            type="authentication_error",
            headers={"WWW-Authenticate": "Bearer"},
        )


Guarded = [Depends(require_api_key)]
