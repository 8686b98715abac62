"""Several api workers on one database (API_WORKERS, or several machines behind one address).

Each api process has an id, the `owner` of every prediction it runs, and a heartbeat in the
`api_worker` table. What one process needs from another goes through the database, never a
per-process registry: `POST .../cancel` on any worker marks the row (`request_cancel`), and the
owner, which watches its running rows for that mark, stops the generation itself (so the engine's
stop and the row's completion stay with the one owner of the prediction). Crash recovery fails
only rows whose owner's heartbeat stopped (or that have none: written before several workers),
at start and then every heartbeat, so a worker that dies under the others has its rows failed
within STALE_AFTER while the live ones keep theirs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
import time
from collections.abc import Callable, Coroutine
from datetime import timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import delete, update
from sqlmodel import Session, col, select

from tritonbox_api.db import crud
from tritonbox_api.db.models import ApiWorker, Prediction, utc_now
from tritonbox_api.db.session import Database

log = logging.getLogger(__name__)

HEARTBEAT_S = 5.0
# Six missed heartbeats: far beyond any pause of a healthy event loop.
STALE_AFTER = timedelta(seconds=30)
# How soon a cancel request made on another worker reaches the owner (one indexed query per
# poll, and only while this worker runs predictions).
CANCEL_POLL_S = 0.2
CANCEL_WAIT_S = 10.0


def _start_ticks(pid: int) -> str | None:
    """When process `pid` started (clock ticks since boot, Linux), or None if there is none."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces: count the fields after its closing ")".
    return stat.rsplit(")", 1)[1].split()[19]


def new_worker_id() -> str:
    """Host, pid, the process's start time and a random part: unique across machines, and a
    restarted container's process reusing an old pid is told apart by its start time."""
    return (
        f"{socket.gethostname()[:32]}-{os.getpid()}-{_start_ticks(os.getpid()) or 0}-"
        f"{secrets.token_hex(4)}"
    )


def gone_from_this_host(worker: str) -> bool:
    """Whether `worker` ran on this host and its process no longer exists: then its rows are
    orphans at once, without waiting for its heartbeat to go stale (an api restarted after a
    crash fails them on start)."""
    try:
        host, pid, ticks, _ = worker.rsplit("-", 3)
        if host != socket.gethostname()[:32] or ticks == "0":
            return False
        return _start_ticks(int(pid)) != ticks
    except ValueError:
        return False


def heartbeat(*, session: Session, worker: str) -> None:
    """Record that api worker `worker` is alive now (registers it on the first call)."""
    now = utc_now()
    found = session.execute(
        update(ApiWorker)
        .where(col(ApiWorker.id) == worker)
        .values(heartbeat_at=now)
        .execution_options(synchronize_session=False)
    )
    if not getattr(found, "rowcount", 0):
        session.add(ApiWorker(id=worker, started_at=now, heartbeat_at=now))
    session.commit()


def live_worker_ids(*, session: Session, within: timedelta) -> list[str]:
    """Workers whose heartbeat is at most `within` old; the others' entries are deleted."""
    session.execute(
        delete(ApiWorker)
        .where(col(ApiWorker.heartbeat_at) < utc_now() - within)
        .execution_options(synchronize_session=False)
    )
    session.commit()
    return list(session.exec(select(ApiWorker.id)))


def forget_worker(*, session: Session, worker: str) -> None:
    """A worker that stopped cleanly (its predictions all ended) leaves the list at once."""
    session.execute(
        delete(ApiWorker)
        .where(col(ApiWorker.id) == worker)
        .execution_options(synchronize_session=False)
    )
    session.commit()


def recover_orphans(*, session: Session, stale_after: timedelta = STALE_AFTER) -> int:
    """Fail the running predictions of workers that are gone; how many."""
    live = live_worker_ids(session=session, within=stale_after)
    gone = [worker for worker in live if gone_from_this_host(worker)]
    for worker in gone:
        forget_worker(session=session, worker=worker)
    live = [worker for worker in live if worker not in gone]
    return crud.recover_interrupted(session=session, live_workers=live)


async def request_cancel(
    database: Database, prediction_id: str, *, wait_s: float = CANCEL_WAIT_S
) -> None:
    """Ask the worker running `prediction_id` to cancel it, and wait (at most `wait_s`) until its
    row has ended, so the caller can answer with the final row. Nothing if it is not running."""

    def ask(session: Session) -> bool:
        return crud.request_cancel(session=session, id=prediction_id)

    def read(session: Session) -> Prediction | None:
        return crud.get_prediction(session=session, id=prediction_id)

    if not await database.run(ask):
        return
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        await asyncio.sleep(CANCEL_POLL_S / 2)
        row = await database.read(read)
        if row is None or row.status.finished:
            return


class WorkerPresence:
    """This process among the api workers: registration, heartbeat, orphan recovery and the
    watch for cancel requests made elsewhere."""

    def __init__(
        self,
        database: Database,
        *,
        running_ids: Callable[[], list[str]],
        cancel: Callable[[str, str], Coroutine[Any, Any, bool]],
        heartbeat_s: float = HEARTBEAT_S,
        stale_after: timedelta = STALE_AFTER,
        poll_s: float = CANCEL_POLL_S,
    ) -> None:
        self.id = new_worker_id()
        self._database = database
        self._running_ids = running_ids
        self._cancel = cancel
        self._heartbeat_s = heartbeat_s
        self._stale_after = stale_after
        self._poll_s = poll_s
        self._task: asyncio.Task[None] | None = None
        self._cancelling: dict[str, asyncio.Task[bool]] = {}
        # Every row this process inserts names it as the owner (crud.create_prediction).
        database.owner = self.id

    async def start(self) -> int:
        """Register, fail the rows of workers that are gone; how many. Then watch."""
        await self._database.run(self._beat)
        recovered = await self._database.run(self._recover)
        self._task = asyncio.create_task(self._watch(), name="api-worker-presence")
        return recovered

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        with contextlib.suppress(Exception):  # the database may be gone: the row then goes stale
            await self._database.run(lambda s: forget_worker(session=s, worker=self.id))

    def _beat(self, session: Session) -> None:
        heartbeat(session=session, worker=self.id)

    def _recover(self, session: Session) -> int:
        return recover_orphans(session=session, stale_after=self._stale_after)

    async def _watch(self) -> None:
        log.info("api worker %s: heartbeat and cancel watch started", self.id)
        next_beat = time.monotonic() + self._heartbeat_s
        while True:
            await asyncio.sleep(self._poll_s)
            try:
                if self._running_ids():
                    await self._cancel_requested()
                if time.monotonic() >= next_beat:
                    next_beat = time.monotonic() + self._heartbeat_s
                    await self._database.run(self._beat)
                    recovered = await self._database.run(self._recover)
                    if recovered:
                        log.warning("failed %d prediction(s) of stopped api worker(s)", recovered)
            except Exception:  # a database hiccup: the next round tries again
                log.exception("api worker %s: heartbeat or cancel watch failed", self.id)

    async def _cancel_requested(self) -> None:
        def requested(session: Session) -> list[str]:
            return crud.cancel_requests(session=session, owner=self.id)

        for prediction_id in await self._database.read(requested):
            if prediction_id in self._cancelling:
                continue
            log.info("prediction %s: cancel requested through another worker", prediction_id)
            task = asyncio.create_task(self._cancel(prediction_id, "cancel requested"))
            self._cancelling[prediction_id] = task
            task.add_done_callback(self._forget(prediction_id))

    def _forget(self, prediction_id: str) -> Callable[[asyncio.Task[bool]], None]:
        def forget(_: asyncio.Task[bool]) -> None:
            self._cancelling.pop(prediction_id, None)

        return forget
