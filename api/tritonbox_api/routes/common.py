"""What the generation routes share: starting a prediction, watching its client, and the
headers that point to it."""

from __future__ import annotations

import asyncio
import logging

from fastapi import Request
from starlette.types import Receive

from tritonbox_api.deps import Services, key_name, metered
from tritonbox_api.service.options import GenerationOptions
from tritonbox_api.service.runner import Started, begin
from tritonbox_api.service.running import RunningPrediction

log = logging.getLogger(__name__)


class DisconnectWatcher:
    """Cancels a request's prediction as soon as its client disconnects.

    Started when the request is accepted, not once the first token is out: a client that leaves
    while its prompt is prefilled or its request waits in the engine's queue must stop it too.
    Starlette's responses only notice a gone client when a write fails, which for a slow
    generation can be long after; the body is read by now, so the next message from the server
    is the disconnect itself (uvicorn wakes every reader of `receive` with it).
    """

    def __init__(self, receive: Receive) -> None:
        self._running: RunningPrediction | None = None
        self.disconnected = False
        self._task = asyncio.create_task(self._watch(receive))

    async def _watch(self, receive: Receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        self.disconnected = True
        if self._running is not None:
            self._running.cancel("its client disconnected")

    def attach(self, running: RunningPrediction) -> None:
        self._running = running
        if self.disconnected:
            running.cancel("its client disconnected")
        if running.producer is not None:
            running.producer.add_done_callback(lambda _: self.close())

    def close(self) -> None:
        self._task.cancel()


async def start(services: Services, request: Request, options: GenerationOptions) -> Started:
    """Begin a prediction that is cancelled as soon as its client disconnects."""
    watcher = DisconnectWatcher(request.receive)
    meter = metered(request)  # the key's tokens per minute, when it has a limit (Limited)
    try:
        return await begin(
            options,
            loader=services.engine_context,
            predictions=services.predictions,
            adapters=services.adapters,
            max_beam_width=services.settings.max_beam_width,
            echo_max_prompt_tokens=services.settings.echo_max_prompt_tokens,
            on_start=watcher.attach,
            key_name=key_name(request),
            reserve=meter.reserve if meter is not None else None,
        )
    except BaseException:
        watcher.close()
        raise


def prediction_headers(services: Services, prediction_id: str) -> dict[str, str]:
    web = f"{services.settings.public_url}/p/{prediction_id}"
    return {"X-Prediction-Id": prediction_id, "Link": f'<{web}>; rel="alternate"'}
