"""PredictionWrites: the prediction writes that queue up behind busy writers share one
transaction, on a real SQLite file and a real PostgreSQL server (`database_url`); a bad write
fails its own caller only, and the first ending of a prediction stays.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from sqlalchemy import event
from sqlalchemy.exc import IntegrityError
from tritonbox_testing.predictions import new_prediction

from tritonbox_api.db import crud
from tritonbox_api.db.group_commit import PredictionWrites
from tritonbox_api.db.models import FinishReason, Prediction, Source, Status
from tritonbox_api.db.session import POSTGRES_WRITERS, Database, DatabaseClosedError


@dataclass
class Statements:
    commits: int = 0
    updates: int = 0  # UPDATE executions (an executemany counts once)
    reads: int = 0  # SELECTs of predictions


@pytest.fixture
def statements(database: Database) -> Iterator[Statements]:
    """What the engine runs from now on."""
    seen = Statements()

    def on_commit(_connection: Any) -> None:
        seen.commits += 1

    def on_execute(_connection: Any, _cursor: Any, statement: str, *_: Any) -> None:
        seen.updates += statement.startswith("UPDATE prediction")
        seen.reads += statement.startswith("SELECT prediction.")

    event.listen(database.engine, "commit", on_commit)
    event.listen(database.engine, "before_cursor_execute", on_execute)
    yield seen
    event.remove(database.engine, "commit", on_commit)
    event.remove(database.engine, "before_cursor_execute", on_execute)


def _inserted(database: Database, count: int) -> list[str]:
    with database.session() as session:
        return [new_prediction(session).id for _ in range(count)]


def _ending(
    prediction_id: str,
    status: Status = Status.SUCCEEDED,
    *,
    finish_reason: FinishReason = FinishReason.LENGTH,
    output: str | None = None,
    error: str | None = None,
) -> crud.Ending:
    return {
        "id": prediction_id,
        "status": status,
        "output": f"the end of {prediction_id}" if output is None else output,
        "finish_reason": finish_reason,
        "error": error,
        "completion_tokens": 128,
        "time_to_first_token_s": 0.05,
        "total_time_s": 1.32,
    }


def _new(prediction_id: str) -> crud.NewPrediction:
    return {
        "id": prediction_id,
        "source": Source.OPENAI,
        "model": "m",
        "input": {"prompt": prediction_id},
        "applied": {},
        "prompt_tokens": 3,
    }


async def _queued_together(
    database: Database, writes: list[Coroutine[Any, Any, Prediction]]
) -> list[Prediction | BaseException]:
    """The writes' results, every one of them queued while each writer thread is busy."""
    gate = threading.Event()
    busy = [database.submit(lambda _: gate.wait(10)) for _ in range(POSTGRES_WRITERS)]
    tasks = [asyncio.create_task(write) for write in writes]
    await asyncio.sleep(0)  # each task queues its write
    gate.set()
    await asyncio.gather(*(asyncio.wrap_future(each) for each in busy))
    return await asyncio.gather(*tasks, return_exceptions=True)


def _stored(database: Database, prediction_id: str) -> Prediction:
    with database.session() as session:
        row = crud.get_prediction(session=session, id=prediction_id)
    assert row is not None
    return row


def test_queued_completions_share_one_commit(database: Database, statements: Statements) -> None:
    ids = _inserted(database, 16)
    statements.commits = 0
    writes = PredictionWrites(database)
    results = asyncio.run(_queued_together(database, [writes.complete(**_ending(i)) for i in ids]))
    assert statements.commits == 1
    assert statements.updates == 1  # one executemany
    assert statements.reads == 1  # the rows read back in one query
    for prediction_id, result in zip(ids, results, strict=True):
        assert isinstance(result, Prediction) and result.id == prediction_id
        assert result.status is Status.SUCCEEDED and result.output == f"the end of {result.id}"
        assert result.time_per_output_token_s == pytest.approx((1.32 - 0.05) / 127)
        assert result.completed_at is not None
        assert _stored(database, prediction_id).status is Status.SUCCEEDED


def test_inserts_join_the_completions(database: Database, statements: Statements) -> None:
    ids = _inserted(database, 3)
    statements.commits = 0
    database.owner = "worker-a"
    writes = PredictionWrites(database)
    new = [writes.create(**_new(f"new{index}")) for index in range(3)]
    ended = [writes.complete(**_ending(i)) for i in ids]
    results = asyncio.run(_queued_together(database, [*new, *ended]))
    assert statements.commits == 1
    for index, result in enumerate(results[:3]):
        assert isinstance(result, Prediction) and result.status is Status.PROCESSING
        stored = _stored(database, f"new{index}")
        assert stored.owner == "worker-a" and stored.input == {"prompt": f"new{index}"}
    assert all(isinstance(r, Prediction) and r.status is Status.SUCCEEDED for r in results[3:])


def test_the_writes_of_one_pass_of_the_event_loop_share_a_drain(
    database: Database, statements: Statements
) -> None:
    """A wave's streams end in one engine step: their completions come in one pass of the
    event loop, with every writer idle, and still share one commit (the first does not go
    alone with the rest behind it)."""
    ids = _inserted(database, 8)
    statements.commits = 0
    writes = PredictionWrites(database)

    async def main() -> list[Prediction]:
        return await asyncio.gather(*(writes.complete(**_ending(i)) for i in ids))

    assert all(row.status is Status.SUCCEEDED for row in asyncio.run(main()))
    assert statements.commits == 1


def test_a_lone_write_goes_alone(database: Database, statements: Statements) -> None:
    writes = PredictionWrites(database)
    created = asyncio.run(writes.create(**_new("p")))
    completed = asyncio.run(writes.complete(**_ending("p")))
    assert created.status is Status.PROCESSING and completed.status is Status.SUCCEEDED
    assert statements.commits == 2


def test_the_first_ending_stays(database: Database, statements: Statements) -> None:
    racing, ended = _inserted(database, 2)
    with database.session() as session:
        first = crud.complete_prediction(session=session, **_ending(ended))
    statements.commits = 0
    writes = PredictionWrites(database)
    cancel = _ending(racing, Status.CANCELED, finish_reason=FinishReason.CANCELED, output="")
    results = asyncio.run(
        _queued_together(
            database,
            [
                writes.complete(**cancel),
                writes.complete(**_ending(racing)),  # the normal end, just after the cancel
                writes.complete(**_ending(ended, Status.FAILED, error="late")),
            ],
        )
    )
    assert statements.commits == 1
    for result in results[:2]:
        assert isinstance(result, Prediction) and result.status is Status.CANCELED
        assert result.output == ""
    assert _stored(database, racing).status is Status.CANCELED
    unchanged = results[2]
    assert isinstance(unchanged, Prediction) and unchanged.status is Status.SUCCEEDED
    assert unchanged.error is None and unchanged.completed_at == first.completed_at


def test_a_missing_prediction_fails_its_caller_only(
    database: Database, statements: Statements
) -> None:
    (present,) = _inserted(database, 1)
    statements.commits = 0
    writes = PredictionWrites(database)
    missing, found = asyncio.run(
        _queued_together(
            database, [writes.complete(**_ending("missing")), writes.complete(**_ending(present))]
        )
    )
    assert statements.commits == 1  # not a failed group: nothing is written again
    assert isinstance(missing, LookupError)
    assert isinstance(found, Prediction) and found.status is Status.SUCCEEDED


@pytest.mark.parametrize("bad", ["insert", "ending"])
def test_a_bad_write_fails_its_caller_only(database: Database, bad: str) -> None:
    ids = _inserted(database, 3)
    writes = PredictionWrites(database)
    failing = (
        writes.create(**_new(ids[0]))  # that id is taken
        if bad == "insert"
        else writes.complete(**_ending(ids[0], Status.PROCESSING))  # not an ending
    )
    results = asyncio.run(
        _queued_together(
            database,
            [
                writes.complete(**_ending(ids[1])),
                failing,
                writes.create(**_new("fresh")),
                writes.complete(**_ending(ids[2])),
            ],
        )
    )
    assert isinstance(results[1], IntegrityError if bad == "insert" else ValueError)
    for index in (0, 2, 3):
        assert isinstance(results[index], Prediction)
    assert _stored(database, ids[1]).status is Status.SUCCEEDED
    assert _stored(database, ids[2]).status is Status.SUCCEEDED
    assert _stored(database, "fresh").status is Status.PROCESSING
    assert _stored(database, ids[0]).status is Status.PROCESSING  # the bad write changed nothing


def test_a_closed_database_fails_the_write(database: Database) -> None:
    writes = PredictionWrites(database)
    database.close()
    with pytest.raises(DatabaseClosedError):
        asyncio.run(writes.complete(**_ending("p")))
    database.open()
    # Nothing was left waiting for a drain: the next write queues one.
    assert asyncio.run(writes.create(**_new("p"))).id == "p"


def test_a_write_given_up_before_its_drain_is_dropped(database: Database) -> None:
    given_up, kept = _inserted(database, 2)
    writes = PredictionWrites(database)

    async def main() -> Prediction:
        gate = threading.Event()
        busy = [database.submit(lambda _: gate.wait(10)) for _ in range(POSTGRES_WRITERS)]
        dropped = asyncio.create_task(writes.complete(**_ending(given_up)))
        written = asyncio.create_task(writes.complete(**_ending(kept)))
        await asyncio.sleep(0)
        dropped.cancel()  # as cancelling a `Database.run` call that has not started
        await asyncio.wait([dropped])
        gate.set()
        await asyncio.gather(*(asyncio.wrap_future(each) for each in busy))
        return await written

    assert asyncio.run(main()).status is Status.SUCCEEDED
    assert _stored(database, given_up).status is Status.PROCESSING
