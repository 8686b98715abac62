"""Liveness, readiness and Prometheus metrics: open even when API_KEY is set."""

from __future__ import annotations

from fastapi import APIRouter, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel

from tritonbox_api.deps import ServicesDep
from tritonbox_api.processes import metrics_registry
from tritonbox_api.routes.responses import TEXT, errors

router = APIRouter(tags=["health"])


class Readiness(BaseModel):
    status: str
    triton: str
    database: str
    tokenizer: str


_NOT_READY = errors(503)[503] | {"model": Readiness, "description": "Not ready: the body says why."}


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    """The api process answers (it does not ask Triton)."""
    return {"status": "ok"}


@router.get("/readyz", responses={200: {"model": Readiness}, 503: _NOT_READY})
async def readyz(services: ServicesDep) -> Response:
    """Ready when Triton is live and ready, the database is writable and this process has the
    engine's tokenizer (loaded in the background from its start)."""
    triton = await services.gateway.is_ready()
    database = await services.database.check_writable()
    engine = services.engine_context.loaded is not None
    ready = triton and database and engine
    body = {
        "status": "ready" if ready else "not ready",
        "triton": "ready" if triton else "not ready",
        "database": "writable" if database else "not writable",
        "tokenizer": "loaded" if engine else "loading",
    }
    return JSONResponse(body, status_code=200 if ready else 503,
                        headers={} if ready else {"Retry-After": "5"})  # fmt: skip


@router.get(
    "/metrics",
    response_class=Response,
    responses={
        200: {"description": "Prometheus' text format.", "content": {CONTENT_TYPE_LATEST: TEXT}}
    },
)
async def metrics() -> Response:
    # Summed over every api worker when there are several (processes.py).
    return Response(generate_latest(metrics_registry()), media_type=CONTENT_TYPE_LATEST)
