"""What the generation routes share: starting a prediction and the headers that point to it."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from fastapi import Request

from tritonbox_api.db.models import Source
from tritonbox_api.deps import Services
from tritonbox_api.protocol.generation import GenerationInput
from tritonbox_api.service.runner import Started, begin

log = logging.getLogger(__name__)


async def start(
    services: Services,
    request: Request,
    params: GenerationInput,
    *,
    source: Source,
    sent: dict[str, Any],
    stream: bool,
) -> Started:
    """Begin a prediction that is cancelled as soon as its client disconnects."""
    started = await begin(
        params,
        loader=services.engine,
        predictions=services.predictions,
        max_beam_width=services.settings.max_beam_width,
        source=source,
        sent=sent,
        stream=stream,
    )
    _cancel_on_disconnect(request, started)
    return started


def _cancel_on_disconnect(request: Request, started: Started) -> None:
    # Starlette's responses only notice a gone client when a write fails, which for a slow
    # generation can be long after; the body is read by now, so the next message from the
    # server is the disconnect itself.
    producer = started.running.task
    if producer is None or producer.done():
        return

    async def watch() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass
        log.info("client of prediction %s went away: cancelling it", started.id)
        producer.cancel()

    watcher = asyncio.create_task(watch())
    producer.add_done_callback(lambda _: watcher.cancel())


def prediction_headers(services: Services, prediction_id: str) -> dict[str, str]:
    web = f"{services.settings.public_url}/p/{prediction_id}"
    return {"X-Prediction-Id": prediction_id, "Link": f'<{web}>; rel="alternate"'}
