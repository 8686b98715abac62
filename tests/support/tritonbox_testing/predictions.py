"""Prediction rows for the database tests (tests/api/db), inserted through crud as the api
inserts them: one, or many at once through a Database. Here rather than in that folder's
conftest.py: with `--import-mode=importlib` a conftest's functions cannot be imported, and a
fixture would have to be threaded through every helper that inserts."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any, NamedTuple

from sqlmodel import Session, func, select

from tritonbox_api.db import crud
from tritonbox_api.db.models import Prediction, Source
from tritonbox_api.db.session import Database


def new_prediction(session: Session, prediction_id: str | None = None, **values: Any) -> Prediction:
    """Inserts a processing prediction, a new id unless one is given. `values` replace the plain
    ones: from the api, model "m", its id as the prompt, nothing applied, one prompt token."""
    prediction_id = prediction_id or crud.new_prediction_id()
    plain: dict[str, Any] = dict(
        source=Source.API,
        model="m",
        input={"prompt": prediction_id},
        applied={},
        prompt_tokens=1,
    )
    return crud.create_prediction(session=session, id=prediction_id, **(plain | values))


def count(session: Session) -> int:
    """How many predictions the table holds."""
    return session.exec(select(func.count()).select_from(Prediction)).one()


class Writes(NamedTuple):
    rows: list[Prediction]
    counts: list[int]  # what the reads among the writes counted
    threads: set[int]  # the threads the inserts ran on
    loop_thread: int  # the event loop's


def write_concurrently(database: Database, writes: int, reads: int = 50) -> Writes:
    """`writes` new predictions inserted at once through `database.run`, with `reads` counts
    through `database.read` going on among them."""
    threads: set[int] = set()

    def insert(prediction_id: str) -> Callable[[Session], Prediction]:
        def work(session: Session) -> Prediction:
            threads.add(threading.get_ident())
            return new_prediction(session, prediction_id)

        return work

    async def main() -> Writes:
        ids = [crud.new_prediction_id() for _ in range(writes)]
        inserts = [asyncio.create_task(database.run(insert(i))) for i in ids]
        # Reads go on in parallel with the writes, on their own threads.
        counts = await asyncio.gather(*(database.read(count) for _ in range(reads)))
        rows = await asyncio.gather(*inserts)
        return Writes(list(rows), list(counts), threads, threading.get_ident())

    return asyncio.run(main())
