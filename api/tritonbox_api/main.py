"""The FastAPI app: its parts are built in the lifespan, from one ApiSettings."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from tritonbox_api.body_limit import BodyLimitMiddleware
from tritonbox_api.db.session import Database
from tritonbox_api.db.url import settings_url
from tritonbox_api.db.workers import WorkerPresence
from tritonbox_api.deps import Services
from tritonbox_api.errors import install_error_handlers
from tritonbox_api.head import HeadMiddleware
from tritonbox_api.keys import KeyRing
from tritonbox_api.processes import per_worker_limit, worker_count, worker_exited
from tritonbox_api.rate_limit import RateLimitHeadersMiddleware
from tritonbox_api.routes import (
    adapters,
    batches,
    files,
    health,
    limits,
    openai,
    permalink,
    predict,
    predictions,
)
from tritonbox_api.routes import responses as openapi_responses
from tritonbox_api.security_headers import SecurityHeadersMiddleware
from tritonbox_api.service.adapters import AdapterService
from tritonbox_api.service.batch_files import FileService
from tritonbox_api.service.batch_runner import BatchRunner
from tritonbox_api.service.batches import BatchService
from tritonbox_api.service.engine_context import EngineContextLoader
from tritonbox_api.service.predictions import PredictionService
from tritonbox_api.settings import ApiSettings
from tritonbox_api.triton_gateway import TritonGateway

log = logging.getLogger(__name__)


def create_app(settings: ApiSettings | None = None) -> FastAPI:
    settings = settings or ApiSettings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        database = Database(settings_url(settings))
        database.open()
        gateway = TritonGateway(settings.triton_url, timeout_s=settings.triton_timeout_s)
        prediction_service = PredictionService(
            gateway=gateway,
            database=database,
            # With API_WORKERS > 1, this worker's share: together they admit the setting's total.
            max_concurrent=per_worker_limit(settings),
            log_predictions=settings.log_predictions,
        )
        # This process among the api workers sharing the database: it owns the rows it inserts,
        # acts on cancel requests made on other workers, and fails only orphans' rows.
        presence = WorkerPresence(
            database,
            running_ids=lambda: prediction_service.running_ids,
            cancel=prediction_service.cancel,
        )
        interrupted = await presence.start()
        if interrupted:
            log.warning("marked %d interrupted prediction(s) as failed", interrupted)
        gateway.start()
        engine_context = EngineContextLoader(gateway, model_name=settings.model_name)
        warm_up = asyncio.create_task(engine_context.warm_up())
        adapter_service = AdapterService(
            database=database, gateway=gateway, engine_context=engine_context, settings=settings
        )
        # LORA_ADAPTERS, registered once the engine answers (the api may start before Triton).
        configured = asyncio.create_task(adapter_service.register_configured())
        services = Services(
            settings=settings,
            gateway=gateway,
            database=database,
            engine_context=engine_context,
            predictions=prediction_service,
            adapters=adapter_service,
            keys=KeyRing(settings.keys()),
            files=FileService(database=database, settings=settings),
            batches=BatchService(database=database, settings=settings),
        )
        app.state.services = services
        # Batch lines run through this app, beside live requests (docs/batches.md).
        runner = BatchRunner(
            app=app,
            database=database,
            predictions=prediction_service,
            worker=presence.id,
            capacity=per_worker_limit(settings, settings.batch_concurrent_requests),
            beside_live=per_worker_limit(settings, settings.batch_requests_beside_live),
            workers=worker_count(settings),  # they share the pace of line starts
        )
        services.batches.runner = runner  # a batch created or cancelled wakes it
        runner.start()
        try:
            yield
        finally:
            warm_up.cancel()
            configured.cancel()
            # First: the lines it stops go back to pending, not to their output as cancelled.
            await runner.stop()
            await services.predictions.cancel_all()
            await presence.stop()
            await gateway.stop()
            database.close()
            worker_exited()

    app = FastAPI(
        title="TritonBox api",
        summary="Generate with the served LLM; every prediction is logged under a permalink.",
        version="0.1.0",
        lifespan=lifespan,
    )
    install_error_handlers(app)
    app.add_middleware(HeadMiddleware)
    # An upload's limit is MAX_BATCH_FILE_BYTES (routes/files.py), not MAX_BODY_BYTES.
    upload = (settings.max_batch_file_bytes + files.FORM_SLACK_BYTES, "MAX_BATCH_FILE_BYTES")
    app.add_middleware(
        BodyLimitMiddleware, max_bytes=settings.max_body_bytes, paths={"/v1/files": upload}
    )
    app.add_middleware(SecurityHeadersMiddleware)
    app.add_middleware(RateLimitHeadersMiddleware)  # x-ratelimit-* on metered answers
    for module in (health, predict, predictions, limits, openai, adapters, files, batches,
                   permalink):  # fmt: skip
        app.include_router(module.router)
    openapi_responses.install(app)
    return app
