"""Group commit for prediction rows: the inserts and completions that queue up behind a busy
writer thread are written in one transaction, with one commit.

Why: when many streams end together (a load client's requests all of one length), each row's
completion was a commit of its own (about 1 ms on an idle machine, several while the engine
takes the cores) on SQLite's one writer, and a stream's last event waits for its row: the last of
16 streams ended up to 88 ms after its last token (17 ms without the write), which spread the
clients' next requests and split the engine's next prefill in two. Grouped, 16 completions at once
take about 2 ms of the writer instead of 15 (idle machine).

How: a write that finds no drain waiting queues one on a writer thread at the end of the event
loop's current pass (no timer: a lone write goes as soon as the writer is free), so the writes of
one pass share it. The writes that come while that drain waits join it;
when it starts it takes all of them: the inserts added, the completions as one executemany UPDATE
(in the order they came, each conditional on the row still running: the first ending wins), one
commit, and the completed rows read back in one query. Should that transaction fail, each of its
writes is done again on its own, so one bad write fails its own caller only. On PostgreSQL (several
writer threads) a new drain is queued as soon as the previous one has started: groups form per
writer, and they still overlap.

A write may so run before `Database.run` calls queued ahead of it (it joins an earlier drain).
Nothing depends on that order: an insert is awaited before its completion is queued, and the
other writes of a running prediction (`update_output`, `request_cancel`) check that it runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Generic, TypeVar, Unpack

from sqlmodel import Session

from tritonbox_api.db import crud
from tritonbox_api.db.models import Prediction
from tritonbox_api.db.session import Database

log = logging.getLogger(__name__)

W = TypeVar("W", crud.NewPrediction, crud.Ending)


@dataclass
class _Queued(Generic[W]):
    write: W
    future: Future[Prediction] = field(default_factory=Future)


@dataclass
class _Group:
    new: list[_Queued[crud.NewPrediction]]
    endings: list[_Queued[crud.Ending]]

    @property
    def futures(self) -> list[Future[Prediction]]:
        return [each.future for each in self.new] + [each.future for each in self.endings]


class PredictionWrites:
    """`crud.create_prediction` and `crud.complete_prediction` on `database`'s writer threads,
    grouped when they queue up."""

    def __init__(self, database: Database) -> None:
        self._database = database
        # Taken by the event loop (queueing) and the writer threads (a drain taking the queue).
        self._lock = threading.Lock()
        self._queued = _Group([], [])
        self._drain_waiting = False

    async def create(self, **new: Unpack[crud.NewPrediction]) -> Prediction:
        queued = _Queued(new)
        with self._lock:
            self._queued.new.append(queued)
            first = self._claim_drain()
        return await self._settled(queued.future, first)

    async def complete(self, **ending: Unpack[crud.Ending]) -> Prediction:
        """The completed row, or the row unchanged if it had already ended; LookupError if
        there is no such prediction."""
        queued = _Queued(ending)
        with self._lock:
            self._queued.endings.append(queued)
            first = self._claim_drain()
        return await self._settled(queued.future, first)

    def _claim_drain(self) -> bool:
        """Under the lock, for a write just queued: whether it must queue a drain (none waits
        yet to take it)."""
        first, self._drain_waiting = not self._drain_waiting, True
        return first

    async def _settled(self, future: Future[Prediction], queue_drain: bool) -> Prediction:
        if queue_drain:
            # At the end of the event loop's current pass, not at once: the writes queued in
            # the same pass (a wave's streams that ended in one engine step) share the drain,
            # rather than the first going alone with the rest waiting for it.
            asyncio.get_running_loop().call_soon(self._queue_drain)
        # Cancelling this waiter before the drain starts drops the write (as cancelling a
        # `Database.run` call drops a call not started yet); once started, it is written.
        return await asyncio.wrap_future(future)

    def _queue_drain(self) -> None:
        try:
            self._database.submit(self._drain)
        except Exception as error:  # closed: nothing will take what waits
            for waiting in self._take().futures:
                waiting.set_exception(error)

    def _take(self) -> _Group:
        """Everything queued, less the writes whose waiter gave up; the next write queues a
        new drain."""
        with self._lock:
            group, self._queued, self._drain_waiting = self._queued, _Group([], []), False
        return _Group(
            [each for each in group.new if each.future.set_running_or_notify_cancel()],
            [each for each in group.endings if each.future.set_running_or_notify_cancel()],
        )

    def _drain(self, session: Session) -> None:
        """On a writer thread: every queued write, together if there are several."""
        group = self._take()
        try:
            if len(group.futures) > 1:
                try:
                    self._together(session, group)
                except Exception:
                    log.warning(
                        "group commit of %d prediction writes failed: writing each on its own",
                        len(group.futures),
                        exc_info=True,
                    )
                    session.rollback()
            # Alone: a lone write, or what the group left unsettled (a completion written
            # again finds its row ended, and reads it back).
            for new in _unsettled(group.new):
                with _settling(session, new.future):
                    new.future.set_result(crud.create_prediction(session=session, **new.write))
            for ending in _unsettled(group.endings):
                with _settling(session, ending.future):
                    row = crud.complete_prediction(session=session, **ending.write)
                    ending.future.set_result(row)
        except BaseException as error:  # no waiter is left hanging, whatever happened
            for future in group.futures:
                if not future.done():
                    future.set_exception(error)
            raise

    @staticmethod
    def _together(session: Session, group: _Group) -> None:
        rows = [crud.add_prediction(session=session, **new.write) for new in group.new]
        crud.end_predictions(session=session, endings=[ending.write for ending in group.endings])
        session.commit()
        for new, row in zip(group.new, rows, strict=True):
            new.future.set_result(row)
        ids = [ending.write["id"] for ending in group.endings]
        found = crud.get_predictions(session=session, ids=ids) if ids else {}
        for ending in group.endings:
            completed = found.get(ending.write["id"])
            if completed is None:
                ending.future.set_exception(
                    LookupError(f"prediction {ending.write['id']} not found")
                )
            else:
                ending.future.set_result(completed)


def _unsettled(queued: list[_Queued[W]]) -> list[_Queued[W]]:
    return [each for each in queued if not each.future.done()]


@contextlib.contextmanager
def _settling(session: Session, future: Future[Prediction]) -> Iterator[None]:
    """A write of its own: its failure is its caller's, and is rolled back."""
    try:
        yield
    except Exception as error:
        session.rollback()
        future.set_exception(error)
