"""Run predictions: one producer task per prediction owns it from its start to its end.

`start` admits a prediction (its concurrency slots, service/admission.py), builds its row
(service/recording.py) and starts its producer (service/producer.py), which streams from Triton
(service/generation.py: exact text, stop words, log-probs) and then, whatever ended the stream,
runs the clean-up once: the engine's `stop`, the row's completion, the slots and the in-flight
gauge. `cancel` only asks the producer to stop and waits for it; nobody else ends a prediction.
The saved predictions are read here too (`get`, `page`), so no route queries their rows itself.

A prediction of several choices (OpenAI's `n`) runs one engine stream per choice side by side in
that same producer; the clean-up stops each choice's engine request, and the row keeps every
choice (`choices`; `output` is the first's).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from tritonbox_api import metrics
from tritonbox_api.db import crud, pages
from tritonbox_api.db.models import Prediction, Source, Status
from tritonbox_api.db.session import Database
from tritonbox_api.db.workers import request_cancel
from tritonbox_api.service import batch_context, recording
from tritonbox_api.service.admission import Admission
from tritonbox_api.service.batch_context import LineContext
from tritonbox_api.service.prepare import PreparedGeneration
from tritonbox_api.service.producer import ENGINE_STOP_TIMEOUT_S, produce
from tritonbox_api.service.recording import Recorder
from tritonbox_api.service.running import Ended, Event, RunningPrediction
from tritonbox_api.triton_gateway import TritonGateway

__all__ = ["Ended", "Event", "PredictionService", "RunningPrediction"]

# Longer than any prediction id (crud.new_prediction_id): such an id is not looked up.
MAX_ID_CHARS = 64


class PredictionService:
    def __init__(
        self,
        *,
        gateway: TritonGateway,
        database: Database,
        max_concurrent: int,
        log_predictions: bool = True,
    ) -> None:
        self._gateway = gateway
        self._database = database
        self._recorder = Recorder(database, log_predictions=log_predictions)
        self._admission = Admission(max_concurrent)
        self._stopping: set[asyncio.Task[bool]] = set()  # lines' stops on their way
        self._on_line_end: Callable[[Prediction], None] | None = None

    @property
    def live_slots(self) -> int:
        """Slots live requests hold now (batch lines' are not among them)."""
        return self._admission.live_slots

    @property
    def live_ended_at(self) -> float:
        """time.monotonic() when the last live request ended (-inf: none yet)."""
        return self._admission.live_ended_at

    def on_live(self, callback: Callable[[], list[LineContext]]) -> None:
        """Call `callback` as each live request is admitted, before it reaches the engine; it
        answers the batch lines that stop to make room for it (their engine requests are
        stopped at once, ahead of the live request's)."""
        self._admission.on_live = callback

    def on_line_end(self, callback: Callable[[Prediction], None]) -> None:
        """Call `callback` with each batch line's row as its prediction ends (the runner paces
        its lines by their time per token: service/batch_pace.py)."""
        self._on_line_end = callback

    @property
    def running_ids(self) -> list[str]:
        """The predictions running now (until their producer has cleaned up)."""
        return list(self._admission.running)

    def running(self, prediction_id: str) -> RunningPrediction | None:
        """The running prediction of that id; None once it has ended (or never ran here)."""
        return self._admission.running.get(prediction_id)

    def start(
        self,
        prepared: PreparedGeneration,
        *,
        tokenizer: Any,
        source: Source,
        model: str,
        sent: dict[str, Any],
        extra: list[PreparedGeneration] | None = None,
        key_name: str | None = None,
    ) -> RunningPrediction:
        """Start generating; 429 when its slots (one per choice) would take the engine requests
        running past MAX_CONCURRENT_REQUESTS. `extra`: the other choices (`n` > 1), generated
        side by side under this one prediction. Alone, a prediction runs whatever its `n`
        (never more than the routes' limit on `n`): else it could never run at all."""
        line = batch_context.current()
        self._admission.check(1 + len(extra or ()), line)
        record = recording.new_record(
            prepared, source=source, model=model, sent=sent, key_name=key_name, line=line
        )
        running = RunningPrediction(id=record.id, prepared=prepared, extra=extra or [])
        # The slots and the gauge are taken here and given back once, by the producer.
        self._stop_lines(self._admission.admit(running, line))
        # A live request goes once the lines' stops on their way have been answered (or after
        # producer.STOPS_AHEAD_S).
        after = list(self._stopping) if line is None else []
        metrics.IN_FLIGHT.inc()
        running.producer = asyncio.create_task(
            produce(
                running,
                record,
                tokenizer,
                gateway=self._gateway,
                recorder=self._recorder,
                release=self._admission.release,
                after=after,
            )
        )
        if line is not None:
            running.producer.add_done_callback(lambda _: self._line_ended(running))
        return running

    def _line_ended(self, running: RunningPrediction) -> None:
        if self._on_line_end is not None and running.ended is not None:
            self._on_line_end(running.ended.prediction)

    def _stop_lines(self, lines: list[RunningPrediction]) -> None:
        """Stop these batch lines' engine requests now, all at once, for the live request being
        admitted, which is sent once they are answered (`produce`'s `after`): the engine has
        dropped the lines still in its queue by then instead of serving them ahead of it. Each
        line's prediction is cancelled too (it ends canceled, and runs again later:
        service/batch_runner.py); its producer sends no second stop."""
        ids = []
        for line in lines:
            if line.ended is None and not line.engine_stopped:
                line.engine_stopped = True
                ids += line.engine_request_ids
                line.cancel("stopped for a live request")
        for request_id in ids:
            stop = self._gateway.stop_request(request_id, timeout_s=ENGINE_STOP_TIMEOUT_S)
            task = asyncio.create_task(stop)
            self._stopping.add(task)
            task.add_done_callback(self._stopping.discard)

    async def cancel(self, prediction_id: str, reason: str = "cancel requested") -> bool:
        """Ask a running prediction to stop and wait until it has ended; False if not running."""
        running = self._admission.running.get(prediction_id)
        if running is None:
            return False
        running.cancel(reason)
        await running.wait()
        return True

    async def cancel_anywhere(self, prediction_id: str) -> None:
        """Cancel it here when it runs here; else ask the api worker that runs it (it acts on
        the row's mark), and wait a while for the row to end. Nothing when it runs nowhere."""
        # The running registry first: a just-started prediction's row may not be written yet.
        if not await self.cancel(prediction_id) and len(prediction_id) <= MAX_ID_CHARS:
            await request_cancel(self._database, prediction_id)

    async def get(self, prediction_id: str) -> Prediction | None:
        """The saved prediction of that id, None when there is none."""
        if len(prediction_id) > MAX_ID_CHARS:  # no id is that long: not worth a query
            return None
        return await self._database.read(
            lambda session: crud.get_prediction(session=session, id=prediction_id)
        )

    async def page(
        self, *, limit: int, cursor: str | None, status: Status | None, source: Source | None
    ) -> tuple[list[Prediction], str | None]:
        """Saved predictions, newest first, and the next page's cursor (db/pages.py);
        ValueError for a cursor that is not one."""
        return await self._database.read(
            lambda session: pages.list_predictions(
                session=session, limit=limit, cursor=cursor, status=status, source=source
            )
        )

    async def cancel_all(self) -> None:
        """Shutdown: ask every running prediction to stop, and wait for each to end."""
        runs = list(self._admission.running.values())
        for running in runs:
            running.cancel("the api is shutting down")
        await asyncio.gather(*(running.wait() for running in runs), return_exceptions=True)
