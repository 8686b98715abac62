"""Several api workers on one database, on SQLite and PostgreSQL: ownership, heartbeats, crash
recovery that leaves live workers' rows alone, and cancel requests that reach the owner."""

from __future__ import annotations

import asyncio
import os
import socket
from datetime import timedelta
from typing import Any

from sqlmodel import Session
from tritonbox_testing.predictions import new_prediction

from tritonbox_api.db import crud, workers
from tritonbox_api.db.models import ApiWorker, Status, utc_now
from tritonbox_api.db.session import Database


def _status(database: Database, prediction_id: str) -> Status:
    with database.session() as session:
        row = crud.get_prediction(session=session, id=prediction_id)
        assert row is not None
        return row.status


def test_rows_name_the_worker_that_inserts_them(database: Database) -> None:
    database.owner = "worker-a"

    def insert(session: Session) -> Any:
        new_prediction(session, "p1", owner=None)
        return crud.get_prediction(session=session, id="p1")

    row = asyncio.run(database.run(insert))
    assert row.owner == "worker-a"


def test_recovery_fails_only_the_rows_of_workers_that_are_gone(database: Database) -> None:
    here = socket.gethostname()[:32]
    with database.session() as session:
        workers.heartbeat(session=session, worker="live")
        workers.heartbeat(session=session, worker="stale")
        stale = session.get(ApiWorker, "stale")
        assert stale is not None
        stale.heartbeat_at = utc_now() - timedelta(minutes=5)
        session.add(stale)
        # Fresh heartbeat, but its process on this host is gone (a crash, then a restart).
        workers.heartbeat(session=session, worker=f"{here}-999999999-12345-abcd")
        session.commit()
        new_prediction(session, "of-live", owner="live")
        new_prediction(session, "of-stale", owner="stale")
        new_prediction(session, "of-crashed", owner=f"{here}-999999999-12345-abcd")
        new_prediction(session, "of-nobody", owner=None)  # from before several workers
        new_prediction(session, "of-unknown", owner="never-registered")
        assert workers.recover_orphans(session=session, stale_after=timedelta(seconds=30)) == 4
        assert workers.live_worker_ids(session=session, within=timedelta(seconds=30)) == ["live"]
    assert _status(database, "of-live") is Status.PROCESSING
    for orphan in ("of-stale", "of-crashed", "of-nobody", "of-unknown"):
        assert _status(database, orphan) is Status.FAILED


def test_a_live_process_on_this_host_is_not_gone() -> None:
    me = workers.new_worker_id()
    assert not workers.gone_from_this_host(me)
    host, pid, ticks, tail = me.rsplit("-", 3)
    assert pid == str(os.getpid())
    # The same pid started at another time (pid reuse after a restart): gone.
    assert workers.gone_from_this_host(f"{host}-{pid}-{int(ticks) + 1}-{tail}")
    assert not workers.gone_from_this_host(f"another-host-{pid}-1-{tail}")
    assert not workers.gone_from_this_host("not an id")


def test_cancel_requests_reach_the_owner_only_while_running(database: Database) -> None:
    with database.session() as session:
        new_prediction(session, "mine", owner="a")
        new_prediction(session, "theirs", owner="b")
        assert crud.request_cancel(session=session, id="mine")
        assert crud.request_cancel(session=session, id="theirs")
        assert not crud.request_cancel(session=session, id="missing")
        assert crud.cancel_requests(session=session, owner="a") == ["mine"]
        crud.complete_prediction(
            session=session, id="mine", status=Status.CANCELED, output="", finish_reason=None,
            error=None, completion_tokens=0, time_to_first_token_s=None, total_time_s=0.1,
        )  # fmt: skip
        assert crud.cancel_requests(session=session, owner="a") == []
        assert not crud.request_cancel(session=session, id="mine")  # finished: nothing to do


def test_presence_cancels_what_another_worker_asked_for(database: Database) -> None:
    """Two workers' presences on one database: B's request reaches A, which cancels; B's
    request_cancel returns once A has completed the row."""
    other = Database(database.url)
    other.open(migrate_schema=False)
    cancelled: list[tuple[str, str]] = []

    async def main() -> None:
        running = ["p1"]

        async def cancel(prediction_id: str, reason: str) -> bool:
            cancelled.append((prediction_id, reason))

            def complete(session: Session) -> None:
                crud.complete_prediction(
                    session=session, id=prediction_id, status=Status.CANCELED, output="",
                    finish_reason=None, error=None, completion_tokens=0,
                    time_to_first_token_s=None, total_time_s=0.1,
                )  # fmt: skip

            await database.run(complete)
            running.clear()
            return True

        owner = workers.WorkerPresence(
            database, running_ids=lambda: list(running), cancel=cancel, poll_s=0.05
        )
        peer = workers.WorkerPresence(
            other, running_ids=list, cancel=cancel, poll_s=0.05, heartbeat_s=0.1
        )
        assert await owner.start() == 0
        assert await peer.start() == 0
        await database.run(lambda s: new_prediction(s, "p1", owner=None))  # owner: database.owner
        await asyncio.wait_for(workers.request_cancel(other, "p1", wait_s=10), 15)
        await asyncio.sleep(0.3)  # the peer's heartbeats and sweeps leave A's rows alone
        await peer.stop()
        await owner.stop()

    try:
        asyncio.run(main())
    finally:
        other.close()
    assert cancelled == [("p1", "cancel requested")]
    assert _status(database, "p1") is Status.CANCELED
    with database.session() as session:  # both left the list when they stopped
        assert workers.live_worker_ids(session=session, within=timedelta(minutes=1)) == []
