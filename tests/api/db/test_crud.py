"""crud: ids, the prediction life cycle, keyset pagination (pages) and crash recovery, on a real
SQLite file and a real PostgreSQL server (`database_url`).
"""

from __future__ import annotations

import base64
import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from sqlmodel import Session
from tritonbox_testing.predictions import new_prediction

from tritonbox_api.db import crud
from tritonbox_api.db.models import FinishReason, Prediction, Source, Status
from tritonbox_api.db.pages import list_predictions
from tritonbox_api.db.session import Database


@pytest.fixture
def session(database: Database) -> Iterator[Session]:
    with database.session() as session:
        yield session


def _complete(session: Session, prediction_id: str, **overrides: Any) -> Prediction:
    values: dict[str, Any] = dict(
        id=prediction_id,
        status=Status.SUCCEEDED,
        output="Hi there",
        finish_reason=FinishReason.STOP,
        error=None,
        completion_tokens=5,
        time_to_first_token_s=0.2,
        total_time_s=1.0,
    )
    values.update(overrides)
    return crud.complete_prediction(session=session, **values)


def test_ids_are_long_url_safe_and_unique() -> None:
    ids = [crud.new_prediction_id() for _ in range(1000)]
    assert len(set(ids)) == 1000
    for prediction_id in ids:
        # 32 characters of a 64-letter alphabet: 192 random bits.
        assert re.fullmatch(r"[A-Za-z0-9_-]{32}", prediction_id)
    letters = set("".join(ids))
    assert len(letters) == 64  # every letter of the alphabet shows up: not a narrower one


def test_create_and_get(database: Database, session: Session) -> None:
    before = datetime.now(UTC)
    row = new_prediction(
        session,
        "abc",
        model="tiny",
        input={"prompt": "é <b>"},
        applied={"x": [1, None]},
        prompt_tokens=2,
    )
    assert row.status is Status.PROCESSING
    assert row.created_at == row.started_at
    assert row.created_at.tzinfo is UTC and row.created_at >= before
    assert row.completed_at is None
    with database.session() as other:  # read back from the file, not the identity map
        stored = crud.get_prediction(session=other, id="abc")
    assert stored is not None
    assert stored.created_at == row.created_at and stored.created_at.tzinfo is UTC
    assert stored.started_at is not None and stored.started_at.tzinfo is UTC
    assert (stored.input, stored.applied) == ({"prompt": "é <b>"}, {"x": [1, None]})
    assert (stored.source, stored.model, stored.prompt_tokens) == (Source.API, "tiny", 2)
    assert crud.get_prediction(session=session, id="missing") is None


def test_complete_computes_the_metrics(session: Session) -> None:
    row = new_prediction(session)
    done = _complete(session, row.id)
    assert done.status is Status.SUCCEEDED and done.finish_reason is FinishReason.STOP
    assert done.output == "Hi there" and done.completion_tokens == 5
    assert done.time_per_output_token_s == pytest.approx((1.0 - 0.2) / 4)
    assert done.tokens_per_second == pytest.approx(5.0)
    assert done.completed_at is not None and done.completed_at.tzinfo is UTC
    assert done.completed_at >= done.created_at


def test_complete_edge_metrics(session: Session) -> None:
    one = _complete(session, new_prediction(session).id, completion_tokens=1, total_time_s=0.5)
    assert one.time_per_output_token_s is None and one.tokens_per_second == pytest.approx(2.0)
    failed = _complete(
        session,
        new_prediction(session).id,
        status=Status.FAILED,
        finish_reason=FinishReason.ERROR,
        error="boom",
        output="",
        completion_tokens=0,
        time_to_first_token_s=None,
        total_time_s=0.0,
    )
    assert failed.status is Status.FAILED and failed.error == "boom"
    assert failed.time_per_output_token_s is None and failed.tokens_per_second is None


def test_complete_is_idempotent(database: Database, session: Session) -> None:
    row = new_prediction(session)
    first = _complete(session, row.id)
    # A cancel that lost the race to the normal end changes nothing.
    second = _complete(
        session, row.id, status=Status.CANCELED, finish_reason=FinishReason.CANCELED, output=""
    )
    assert second.status is Status.SUCCEEDED and second.output == "Hi there"
    assert second.completed_at == first.completed_at
    with database.session() as other:
        stored = crud.get_prediction(session=other, id=row.id)
    assert stored is not None and stored.status is Status.SUCCEEDED


def test_complete_checks_its_arguments(session: Session) -> None:
    with pytest.raises(ValueError, match="status"):
        _complete(session, new_prediction(session).id, status=Status.PROCESSING)
    with pytest.raises(LookupError):
        _complete(session, "missing")


def test_end_predictions_in_turn_committed_by_the_caller(
    database: Database, session: Session
) -> None:
    first, second = new_prediction(session), new_prediction(session)
    endings: list[crud.Ending] = [
        dict(id=first.id, status=Status.CANCELED, output="", finish_reason=FinishReason.CANCELED,
             error=None, completion_tokens=0, time_to_first_token_s=None, total_time_s=0.5),
        dict(id=first.id, status=Status.SUCCEEDED, output="late", finish_reason=FinishReason.STOP,
             error=None, completion_tokens=3, time_to_first_token_s=0.1, total_time_s=1.0),
        dict(id=second.id, status=Status.SUCCEEDED, output="b", finish_reason=FinishReason.STOP,
             error=None, completion_tokens=3, time_to_first_token_s=0.1, total_time_s=1.0),
    ]  # fmt: skip
    crud.end_predictions(session=session, endings=endings)
    session.rollback()  # nothing is committed for the caller
    rows = crud.get_predictions(session=session, ids=[first.id, second.id, "missing"])
    assert {row.status for row in rows.values()} == {Status.PROCESSING}
    crud.end_predictions(session=session, endings=endings)
    session.commit()
    with database.session() as other:
        rows = crud.get_predictions(session=other, ids=[first.id, second.id, "missing"])
    assert set(rows) == {first.id, second.id}
    # In turn: the first ending of a prediction stays, the later one finds it ended.
    assert rows[first.id].status is Status.CANCELED and rows[first.id].output == ""
    assert rows[second.id].tokens_per_second == pytest.approx(3.0)


def test_update_output(session: Session) -> None:
    row = new_prediction(session)
    assert crud.update_output(session=session, id=row.id, output="Hi")
    stored = crud.get_prediction(session=session, id=row.id)
    assert stored is not None and stored.output == "Hi" and stored.status is Status.PROCESSING
    _complete(session, row.id)
    assert not crud.update_output(session=session, id=row.id, output="late")
    stored = crud.get_prediction(session=session, id=row.id)
    assert stored is not None and stored.output == "Hi there"


def _seed_rows(session: Session, count: int) -> list[Prediction]:
    """Rows with some equal created_at (as concurrent inserts get) so the id breaks the ties."""
    base = datetime(2025, 1, 1, tzinfo=UTC)
    rows = []
    for index in range(count):
        row = new_prediction(
            session, f"id{index:03d}", source=Source.OPENAI if index % 3 else Source.API
        )
        row.created_at = base + timedelta(seconds=index // 4)
        if index % 2:
            _complete(session, row.id)
        rows.append(row)
    session.add_all(rows)
    session.commit()
    return rows


def _key(row: Prediction) -> tuple[datetime, str]:
    return crud.as_utc(row.created_at), row.id


def _all_pages(session: Session, limit: int, **filters: Any) -> list[list[Prediction]]:
    pages, cursor = [], None
    while True:
        page, cursor = list_predictions(session=session, limit=limit, cursor=cursor, **filters)
        pages.append(page)
        if cursor is None:
            return pages


def test_pagination_is_newest_first_without_repeats_or_gaps(session: Session) -> None:
    rows = _seed_rows(session, 25)
    pages = _all_pages(session, 10)
    assert [len(page) for page in pages] == [10, 10, 5]
    listed = [row.id for page in pages for row in page]
    expected = [row.id for row in sorted(rows, key=_key, reverse=True)]
    assert listed == expected
    assert all(row.created_at.tzinfo is UTC for page in pages for row in page)


def test_a_full_last_page_has_no_next(session: Session) -> None:
    _seed_rows(session, 20)
    assert [len(page) for page in _all_pages(session, 10)] == [10, 10]
    only_page, cursor = list_predictions(session=session, limit=50)
    assert len(only_page) == 20 and cursor is None and only_page[0].id == "id019"


def test_new_rows_do_not_shift_later_pages(session: Session) -> None:
    _seed_rows(session, 12)
    first, cursor = list_predictions(session=session, limit=5)
    new_prediction(session, "newest")  # created now: newer than every seeded row
    second, _ = list_predictions(session=session, limit=5, cursor=cursor)
    assert {row.id for row in first}.isdisjoint(row.id for row in second)
    assert second[0].id == "id006"


def test_filters(session: Session) -> None:
    rows = _seed_rows(session, 25)
    by_status = [r.id for p in _all_pages(session, 4, status=Status.SUCCEEDED) for r in p]
    assert sorted(by_status) == sorted(r.id for r in rows if int(r.id[2:]) % 2)
    by_source = [r.id for p in _all_pages(session, 4, source=Source.API) for r in p]
    assert sorted(by_source) == sorted(r.id for r in rows if int(r.id[2:]) % 3 == 0)
    both = [
        r.id
        for p in _all_pages(session, 4, status=Status.PROCESSING, source=Source.OPENAI)
        for r in p
    ]
    indexes = [int(i[2:]) for i in both]
    assert indexes and all(i % 2 == 0 and i % 3 for i in indexes)
    assert len(both) == sum(1 for i in range(25) if i % 2 == 0 and i % 3)


@pytest.mark.parametrize(
    "cursor",
    [
        "not base64 !",
        base64.urlsafe_b64encode(b"no separator").decode(),
        base64.urlsafe_b64encode(b"yesterday|id1").decode(),
        base64.urlsafe_b64encode(b"2025-01-01T00:00:00+00:00|").decode(),
        base64.urlsafe_b64encode(b"\xff\xfe").decode(),
    ],
)
def test_a_bad_cursor_is_a_value_error(session: Session, cursor: str) -> None:
    with pytest.raises(ValueError, match=r"^cursor: "):
        list_predictions(session=session, limit=10, cursor=cursor)


def test_an_empty_table_lists_nothing(session: Session) -> None:
    assert list_predictions(session=session, limit=10) == ([], None)


def test_a_bad_limit_is_a_value_error(session: Session) -> None:
    with pytest.raises(ValueError, match=r"^limit: "):
        list_predictions(session=session, limit=0)


def test_recover_interrupted(database: Database, session: Session) -> None:
    starting = new_prediction(session)
    starting.status = Status.STARTING
    session.add(starting)
    session.commit()
    processing = new_prediction(session)
    finished = new_prediction(session)
    _complete(session, finished.id)

    assert crud.recover_interrupted(session=session) == 2
    with database.session() as other:
        for prediction_id in (starting.id, processing.id):
            row = crud.get_prediction(session=other, id=prediction_id)
            assert row is not None and row.status is Status.FAILED
            assert row.finish_reason is FinishReason.ERROR
            assert row.error == crud.INTERRUPTED_ERROR
            assert row.completed_at is not None and row.completed_at.tzinfo is UTC
        untouched = crud.get_prediction(session=other, id=finished.id)
        assert untouched is not None and untouched.status is Status.SUCCEEDED
        assert untouched.error is None
    assert crud.recover_interrupted(session=session) == 0


def test_as_utc() -> None:
    naive = datetime(2025, 1, 2, 3, 4, 5)
    assert crud.as_utc(naive) == datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)
    paris = datetime(2025, 1, 2, 4, 4, 5, tzinfo=timezone(timedelta(hours=1)))
    assert crud.as_utc(paris).tzinfo is UTC and crud.as_utc(paris) == naive.replace(tzinfo=UTC)
    assert crud.as_utc(None) is None
