"""Runs batch lines: each api worker claims pending lines from the database, sends each through
the app (batch_dispatch.py), records how it ended, and finishes batches whose lines all ended.

Live traffic first (batch_room.py): as a live request is admitted, lines over its bound stop
(newest first, as a client leaving stops its request) and go back to pending; live requests keep
all MAX_CONCURRENT_REQUESTS slots (a line's are counted apart, service/admission.py). Lines start
one at a time, spaced by the engine's step (batch_pace.py), so none reaches it as a burst.

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

from starlette.types import ASGIApp

from tritonbox_api import metrics
from tritonbox_api.db import batch_claims, batch_finalize, batch_store
from tritonbox_api.db.batches import BatchLine, LineOutcome
from tritonbox_api.db.session import Database
from tritonbox_api.protocol.batch_lines import CANCELLED, EXPIRED, answered, error_body
from tritonbox_api.service import batch_context, batch_room
from tritonbox_api.service.batch_context import LineContext
from tritonbox_api.service.batch_dispatch import Answer, dispatch, line_slots
from tritonbox_api.service.batch_pace import Pace
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
    context: LineContext  # the line's, for the task that runs it (batch_context.py)
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
        workers: int = 1,
    ) -> None:
        self._app = app
        self._database = database
        self._predictions = predictions
        self._worker = worker
        self._capacity = capacity  # engine requests, live and batch, with no live traffic
        self._beside_live = beside_live  # batch engine requests while live traffic is present
        self._runs: dict[int, _Run] = {}
        self._pace = Pace(workers)  # when the next line may start
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._paused_until = self._recovered_at = 0.0
        self._next_round_s = POLL_S  # sooner when the pace lets the next line start sooner

    def start(self) -> None:
        self._predictions.on_live(self._make_room)
        self._predictions.on_line_end(lambda row: self._pace.observe(row.time_per_output_token_s))
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
                async with asyncio.timeout(self._next_round_s if busy else IDLE_POLL_S):
                    await self._wake.wait()
            self._wake.clear()

    async def _tick(self) -> bool:
        """One round; whether any batch is open."""
        database = self._database
        if time.monotonic() - self._recovered_at >= RECOVER_EVERY_S:
            self._recovered_at = time.monotonic()
            recovered = await database.run(lambda s: batch_claims.recover_gone(s, self._worker))
            if recovered:
                log.warning("batch lines of stopped api workers back to pending: %d", recovered)
        if not self._runs and not await database.read(batch_store.any_open):
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

    def _limit(self) -> int:
        live, ended = self._predictions.live_slots, self._predictions.live_ended_at
        return batch_room.limit(self._capacity, self._beside_live, live, ended, time.monotonic())

    def _make_room(self) -> list[LineContext]:
        """A live request was admitted: the lines answered stop to make room for it in the
        engine's batch (their engine requests stopped before it is sent) and run again later."""
        going = [run for run in self._runs.values() if not run.stop.is_set()]
        stopping = batch_room.to_stop(going, self._limit())
        for run in stopping:
            run.yielded = True
            run.stop.set()
        return [run.context for run in stopping]

    async def _claim(self) -> None:
        """Start lines while there is room: one at a time, at the pace's spacing, for POLL_S at
        most (the round's other checks, a batch's cancel among them, wait no longer)."""
        self._next_round_s, until = POLL_S, time.monotonic() + POLL_S
        while not self._stopping and time.monotonic() >= self._paused_until:
            if (limit := self._limit()) <= sum(run.slots for run in self._runs.values()):
                return
            if (wait := self._pace.wait_s(time.monotonic())) == 0:
                if not await self._start_one(limit):
                    return  # none pending
            elif time.monotonic() + wait < until:
                await asyncio.sleep(wait)
            else:
                self._next_round_s = wait  # the next round starts the next line
                return

    async def _start_one(self, limit: int) -> bool:
        """Claim the next pending line and start it; whether one was claimed. Should a live
        request lower the limit while the claim is written, the line goes back to pending at
        once (it would reach the engine just after the live request, and queue ahead of it)."""
        postgres, me = not self._database.is_sqlite, self._worker
        lines = await self._database.run(
            lambda s: batch_claims.claim(s, worker=me, limit=1, postgres=postgres)
        )
        if lines and self._limit() < limit:
            await self._give_back(lines)
        elif lines:
            line = lines[0]
            keys = await self._database.read(lambda s: batch_store.key_names(s, {line.batch_id}))
            context = batch_context.of_line(line.batch_id, line.custom_id, keys.get(line.batch_id))
            run = _Run(line=line, slots=line_slots(line.body or "{}"), context=context)
            self._pace.started(run.slots, run.started)
            self._runs[line.id or 0] = run
            run.task = asyncio.create_task(self._run(run))
        return bool(lines)

    async def _give_back(self, lines: list[BatchLine]) -> None:
        """These lines of this worker back to pending: they run again."""
        ids, me = [line.id or 0 for line in lines], self._worker
        await self._database.run(lambda s: batch_claims.release(s, worker=me, line_ids=ids))

    async def _run(self, run: _Run) -> None:
        line = run.line
        url, body = line.url or "", line.body or ""
        try:
            try:
                answer = await dispatch(self._app, run.context, url, body, run.stop)
            except Exception:
                log.exception("batch %s line %d: the api failed it", line.batch_id, line.line)
                message = "internal error (logged on the server)"
                answer = Answer(500, error_body(message, param=None, type="server_error"), None)
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
            return await self._give_back([line])
        elif self._stopping or answer.status in (429, 503):
            # Not this line's answer: the engine (or this worker) could not take it now.
            self._paused_until = time.monotonic() + RETRY_AFTER_S
            return await self._give_back([line])
        else:
            outcome = LineOutcome.FAILED
        result = answered(line.custom_id, answer.status, answer.prediction_id, answer.body, code)
        line_id, me, pid = line.id or 0, self._worker, answer.prediction_id
        ended = await self._database.run(
            lambda s: batch_claims.end_line(
                s, line_id=line_id, worker=me, outcome=outcome, result=result, prediction_id=pid
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
