"""Runs batch lines: each api worker claims pending lines from the database, sends each through
the app (batch_dispatch.py), records how it ended, and finishes batches whose lines all ended.

Live traffic first (batch_room.py): as a live request is admitted, lines over its bound stop
(newest first, as a client leaving stops its request) and go back to pending; live requests keep
all MAX_CONCURRENT_REQUESTS slots (a line's are counted apart, service/admission.py).

Nothing lost, nothing twice: a line is claimed and ended by conditional UPDATEs
(db/batch_claims.py). A line the engine could not take (503: Triton down or restarting, 429: its
queue full), that shutdown interrupted or that made room for live traffic goes back to pending
and runs again; a worker that stops gives its lines back, and the lines of one that died are
taken back by the others (its heartbeat stopped, db/workers.py): every line ends exactly once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field

from sqlmodel import Session, col, select
from starlette.types import ASGIApp

from tritonbox_api import metrics
from tritonbox_api.db import batch_claims, batch_finalize, batch_store, workers
from tritonbox_api.db.batches import Batch, BatchLine, LineOutcome
from tritonbox_api.db.session import Database
from tritonbox_api.keys import ApiKey, Role
from tritonbox_api.protocol.batch_lines import CANCELLED, EXPIRED, answered, error_body
from tritonbox_api.service import batch_room
from tritonbox_api.service.batch_context import LineContext
from tritonbox_api.service.batch_dispatch import Answer, dispatch, line_slots
from tritonbox_api.service.predictions import PredictionService

log = logging.getLogger(__name__)

POLL_S = 0.25  # while batches are open: how soon a new line starts after a slot frees
IDLE_POLL_S = 1.0  # while none is
RETRY_AFTER_S = 1.0  # after the engine refused a line for now (503, 429)
RECOVER_EVERY_S = 5.0  # lines of workers that are gone back to pending
STOP_WAIT_S = 10.0


@dataclass(eq=False)
class _Run:
    line: BatchLine
    slots: int
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    why: LineOutcome | None = None  # set when the batch stops it (cancelled, expired)
    yielded: bool = False  # stopped to make room for live requests: it runs again
    started: float = field(default_factory=time.monotonic)  # the newest make room first
    task: asyncio.Task[None] | None = None


class BatchRunner:
    def __init__(
        self,
        *,
        app: ASGIApp,
        database: Database,
        predictions: PredictionService,
        worker: str,
        capacity: int,
        beside_live: int,
    ) -> None:
        self._app = app
        self._database = database
        self._predictions = predictions
        self._worker = worker
        self._capacity = capacity  # engine requests, live and batch, with no live traffic
        self._beside_live = beside_live  # batch engine requests while live traffic is present
        self._runs: dict[int, _Run] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._paused_until = 0.0
        self._recovered_at = 0.0

    def start(self) -> None:
        self._predictions.on_live(self._make_room)
        self._task = asyncio.create_task(self._loop(), name="batch-runner")

    def wake(self) -> None:
        """Look at the database now (a batch was created or cancelled here)."""
        self._wake.set()

    async def stop(self) -> None:
        """Stop the lines running here and give them back (they run again after a restart)."""
        self._stopping = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for run in self._runs.values():
            run.stop.set()
        tasks = [run.task for run in self._runs.values() if run.task is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=STOP_WAIT_S)
        with contextlib.suppress(Exception):  # the database gone: the others recover them
            await self._database.run(lambda s: batch_claims.release(s, worker=self._worker))

    async def _loop(self) -> None:
        while True:
            busy = False
            try:
                busy = await self._tick()
            except Exception:  # a database hiccup: the next round tries again
                log.exception("batch runner: a round failed")
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(POLL_S if busy else IDLE_POLL_S):
                    await self._wake.wait()
            self._wake.clear()

    async def _tick(self) -> bool:
        """One round; whether any batch is open."""
        database = self._database
        if time.monotonic() - self._recovered_at >= RECOVER_EVERY_S:
            self._recovered_at = time.monotonic()
            recovered = await database.run(self._recover)
            if recovered:
                log.warning("batch lines of stopped api workers back to pending: %d", recovered)
        if not self._runs and not await database.read(_any_open):
            metrics.BATCH_LINES_WAITING.set(0)
            return False
        await database.run(batch_store.begin_batches)
        await database.run(batch_store.expire_due)
        if self._runs:
            ids = {run.line.batch_id for run in self._runs.values()}
            stop = await database.read(lambda s: batch_claims.stopping(s, ids))
            for run in self._runs.values():
                if run.line.batch_id in stop and run.why is None:
                    run.why = stop[run.line.batch_id]
                    run.stop.set()  # as a client leaving: the engine's request stops
        await self._claim()
        for batch_id in await database.read(batch_finalize.ready):
            await self._finalize(batch_id)
        metrics.BATCH_LINES_WAITING.set(await database.read(batch_store.waiting))
        return True

    def _recover(self, session: Session) -> int:
        live = workers.live_worker_ids(session=session, within=workers.STALE_AFTER)
        live = [each for each in live if not workers.gone_from_this_host(each)]
        return batch_claims.recover(session, live_workers=[*live, self._worker])

    def _limit(self) -> int:
        live, ended = self._predictions.live_slots, self._predictions.live_ended_at
        return batch_room.limit(self._capacity, self._beside_live, live, ended, time.monotonic())

    def _make_room(self) -> None:
        """A live request was admitted: it finds room in the engine's batch at once instead of
        waiting for lines to end. The stopped lines go back to pending (_record)."""
        going = [run for run in self._runs.values() if not run.stop.is_set()]
        for run in batch_room.to_stop(going, self._limit()):
            run.yielded = True
            run.stop.set()

    async def _claim(self) -> None:
        if self._stopping or time.monotonic() < self._paused_until:
            return
        free = self._limit() - sum(run.slots for run in self._runs.values())
        if free <= 0:
            return
        postgres = not self._database.is_sqlite
        lines = await self._database.run(
            lambda s: batch_claims.claim(s, worker=self._worker, limit=free, postgres=postgres)
        )
        if not lines:
            return
        keys = await self._database.read(lambda s: _key_names(s, {x.batch_id for x in lines}))
        for line in lines:
            run = _Run(line=line, slots=line_slots(line.body or "{}"))
            self._runs[line.id or 0] = run
            run.task = asyncio.create_task(self._run(run, keys.get(line.batch_id)))

    async def _run(self, run: _Run, key_name: str | None) -> None:
        line = run.line
        key = ApiKey(key_name, frozenset({Role.USE}), b"") if key_name else None
        context = LineContext(batch_id=line.batch_id, custom_id=line.custom_id, key=key)
        try:
            try:
                answer = await dispatch(
                    self._app, context, line.url or "", line.body or "", run.stop
                )
            except Exception:
                log.exception("batch %s line %d: the api failed it", line.batch_id, line.line)
                body = error_body(
                    "internal error (logged on the server)", param=None, type="server_error"
                )
                answer = Answer(500, body, None)
            await self._record(run, answer)
        except Exception:
            log.exception("batch %s line %d: could not record it", line.batch_id, line.line)
        finally:
            self._runs.pop(line.id or 0, None)
            self.wake()

    async def _record(self, run: _Run, answer: Answer) -> None:
        line = run.line
        code = None
        if 200 <= answer.status < 300:
            outcome = LineOutcome.COMPLETED
        elif run.why is not None:
            outcome = run.why
            code = EXPIRED if run.why is LineOutcome.EXPIRED else CANCELLED
        elif run.yielded:  # made room for live traffic: it runs again once there is room
            await self._database.run(
                lambda s: batch_claims.release(s, worker=self._worker, line_ids=[line.id or 0])
            )
            return
        elif self._stopping or answer.status in (429, 503):
            # Not this line's answer: the engine (or this worker) could not take it now.
            self._paused_until = time.monotonic() + RETRY_AFTER_S
            await self._database.run(
                lambda s: batch_claims.release(s, worker=self._worker, line_ids=[line.id or 0])
            )
            return
        else:
            outcome = LineOutcome.FAILED
        result = answered(line.custom_id, answer.status, answer.prediction_id, answer.body, code)
        ended = await self._database.run(
            lambda s: batch_claims.end_line(
                s,
                line_id=line.id or 0,
                worker=self._worker,
                outcome=outcome,
                result=result,
                prediction_id=answer.prediction_id,
            )
        )
        if ended:
            metrics.BATCH_LINES.labels(outcome.value).inc()

    async def _finalize(self, batch_id: str) -> None:
        done = await self._database.run(lambda s: batch_finalize.finalize(s, batch_id))
        if done is not None:
            log.info("batch %s: %s", batch_id, done[0].status.value)
            for outcome, count in done[1].items():
                metrics.BATCH_LINES.labels(outcome.value).inc(count)


def _any_open(session: Session) -> bool:
    query = select(Batch.id).where(col(Batch.status).in_(batch_store.LIVE)).limit(1)
    return session.exec(query).first() is not None


def _key_names(session: Session, batch_ids: set[str]) -> dict[str, str | None]:
    query = select(Batch.id, Batch.api_key_name).where(col(Batch.id).in_(batch_ids))
    return dict(session.exec(query).all())
