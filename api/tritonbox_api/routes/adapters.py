"""Register, list and unregister LoRA adapters of the served base model."""

from __future__ import annotations

from fastapi import APIRouter, Path

from tritonbox_api.deps import Guarded, Managed, ServicesDep
from tritonbox_api.protocol.adapters import AdapterCreate, AdapterList, AdapterObject
from tritonbox_api.routes.responses import GUARDED, errors
from tritonbox_api.service.adapters import not_found
from tritonbox_common import parameters as p

router = APIRouter(
    prefix="/v1/adapters", tags=["adapters"], dependencies=Guarded, responses=GUARDED
)
REFUSED = (
    "The body could not be read, or the adapter does not fit the base model or the engine "
    "(`error.message` says why)."
)
Name = Path(pattern=p.ADAPTER_NAME_PATTERN, description="The adapter's name.")


@router.post(
    "",
    status_code=201,
    response_model=AdapterObject,
    dependencies=Managed,
    responses=errors(400, 403, 409, 413, 422, 503, notes={400: REFUSED}),
)
async def register(body: AdapterCreate, services: ServicesDep) -> AdapterObject:
    """Fetch the adapter, check it against the base model and the engine, and register it."""
    row = await services.adapters.register(body.name, body.source)
    return AdapterObject.of(row, services.adapters.shown_source(row))


@router.get("", response_model=AdapterList)
async def list_adapters(services: ServicesDep) -> AdapterList:
    rows = await services.adapters.list()
    shown = services.adapters.shown_source
    return AdapterList(data=[AdapterObject.of(row, shown(row)) for row in rows])


@router.get("/{name}", response_model=AdapterObject, responses=errors(404, 422))
async def get_adapter(services: ServicesDep, name: str = Name) -> AdapterObject:
    row = await services.adapters.get(name)
    if row is None:
        raise not_found(name)
    return AdapterObject.of(row, services.adapters.shown_source(row))


@router.delete(
    "/{name}", response_model=AdapterObject, dependencies=Managed, responses=errors(403, 404, 422)
)
async def unregister(services: ServicesDep, name: str = Name) -> AdapterObject:
    """Predictions already running with it finish; new ones get 404."""
    row = await services.adapters.delete(name)
    return AdapterObject.of(row, services.adapters.shown_source(row))
