"""Schema migrations: a database of release 0.1.0 upgrades in place losing nothing, the
migrations build exactly the models' schema on SQLite and PostgreSQL, and workers starting
together migrate once."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlmodel import SQLModel
from tritonbox_testing.predictions import new_prediction

from tritonbox_api.db import crud, migrate, pages
from tritonbox_api.db.models import FinishReason, Source, Status
from tritonbox_api.db.session import Database

LEGACY = Path(__file__).parent / "data" / "tritonbox-0.1.0.db"
REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def legacy_copy(tmp_path: Path) -> Path:
    """A copy of the database release 0.1.0's own code wrote (data/make_legacy_db.py)."""
    target = tmp_path / "data" / "tritonbox.db"
    target.parent.mkdir()
    shutil.copyfile(LEGACY, target)
    return target


def _rows(path: Path) -> list[dict[str, Any]]:
    with sqlite3.connect(path) as connection:
        connection.row_factory = sqlite3.Row
        return [dict(row) for row in connection.execute("SELECT * FROM prediction ORDER BY id")]


def _version(path: Path) -> list[tuple[str]]:
    with sqlite3.connect(path) as connection:
        return connection.execute("SELECT version_num FROM alembic_version").fetchall()


def test_the_legacy_file_is_what_release_0_1_0_made() -> None:
    with sqlite3.connect(LEGACY) as connection:
        tables = {r[0] for r in connection.execute("SELECT name FROM sqlite_master")}
    assert "prediction" in tables and "alembic_version" not in tables
    statuses = sorted({row["status"] for row in _rows(LEGACY)})
    assert statuses == ["canceled", "failed", "processing", "succeeded"]


def test_a_0_1_0_database_upgrades_in_place_losing_nothing(legacy_copy: Path) -> None:
    before = _rows(legacy_copy)
    assert len(before) == 30
    database = Database(legacy_copy)
    database.open()
    try:
        assert _version(legacy_copy) == [(migrate.head(),)]
        after = _rows(legacy_copy)
        # Every column of every row as it was; the new ones empty.
        assert [{k: row[k] for k in before[0]} for row in after] == before
        assert all(row["owner"] is None and row["cancel_requested_at"] is None for row in after)
        with database.session() as session:
            page, cursor = pages.list_predictions(session=session, limit=20)
            rest, last = pages.list_predictions(session=session, limit=20, cursor=cursor)
            assert last is None and len(page) + len(rest) == 30
            listed = [row.id for row in page + rest]
            assert listed == sorted(listed, key=lambda i: (int(i[6:]) // 2, i), reverse=True)
            old = crud.get_prediction(session=session, id="legacy003")
            assert old is not None and old.status is Status.SUCCEEDED
            assert old.source is Source.PLAYGROUND and old.finish_reason is FinishReason.STOP
            assert old.created_at == datetime(2026, 11, 1, 12, 0, 1, tzinfo=UTC)
            assert old.input == {"prompt": "Bonjour é 3", "max_tokens": 8}
            # The rows release 0.1.0 left running (no owner) are failed like after any crash.
            assert crud.recover_interrupted(session=session) == 6
            new_prediction(session, "new", input={})
    finally:
        database.close()
    with sqlite3.connect(legacy_copy) as connection:
        assert connection.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    assert len(_rows(legacy_copy)) == 31
    # A second start finds the schema current and changes nothing.
    database.open()
    database.close()
    assert _version(legacy_copy) == [(migrate.head(),)]


def test_the_documented_command_upgrades_too(legacy_copy: Path, tmp_path: Path) -> None:
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("DATABASE_", "API_"))}
    environment |= {"DATABASE_PATH": str(legacy_copy), "PYTHONSAFEPATH": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "tritonbox_api.db.migrate", "--env-file", str(tmp_path / "none")],
        env=environment,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert f"at revision {migrate.head()}" in done.stdout
    assert _version(legacy_copy) == [(migrate.head(),)]
    assert len(_rows(legacy_copy)) == 30


def test_the_migrations_build_the_models_schema(database: Database) -> None:
    with database.engine.connect() as connection:
        differences = compare_metadata(MigrationContext.configure(connection), SQLModel.metadata)
    assert differences == []


def test_downgrade_then_upgrade_keeps_the_rows(database: Database) -> None:
    with database.session() as session:
        new_prediction(session, "a", input={}, prompt_tokens=None)
    with database.engine.begin() as connection:
        config = migrate.alembic_config(connection)
        command.downgrade(config, migrate.BASELINE)
        assert migrate.current(connection) == migrate.BASELINE
        command.upgrade(config, "head")
        assert migrate.current(connection) == migrate.head()
    with database.session() as session:
        row = crud.get_prediction(session=session, id="a")
        assert row is not None and row.owner is None


def test_workers_starting_together_migrate_once(database_url: str) -> None:
    databases = [Database(database_url) for _ in range(4)]
    errors: list[BaseException] = []
    barrier = threading.Barrier(len(databases))

    def start(database: Database) -> None:
        barrier.wait()
        try:
            database.open()
        except BaseException as error:  # reported below
            errors.append(error)

    threads = [threading.Thread(target=start, args=(d,)) for d in databases]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    try:
        assert errors == []
        with databases[0].engine.connect() as connection:
            assert migrate.current(connection) == migrate.head()
    finally:
        for database in databases:
            database.close()


def test_choices_survive_a_round_trip_and_0004_rows_read_null(database: Database) -> None:
    """Revision 0005 adds `prediction.choices` (OpenAI's n > 1); older rows read NULL."""
    with database.engine.begin() as connection:
        config = migrate.alembic_config(connection)
        command.downgrade(config, "0004")
        connection.exec_driver_sql(
            "INSERT INTO prediction (id, status, source, model, input, applied, output, "
            "created_at) VALUES ('old', 'succeeded', 'api', 'm', '{}', '{}', 'x', "
            "'2026-11-24 00:00:00')"
        )
        command.upgrade(config, "head")
    every = [{"index": 0, "output": "a", "finish_reason": "stop", "stop_word": None,
              "completion_tokens": 2}, {"index": 1, "output": "b", "finish_reason": "length",
              "stop_word": None, "completion_tokens": 3}]  # fmt: skip
    with database.session() as session:
        crud.create_prediction(
            session=session, id="n2", source=Source.OPENAI, model="m", input={}, applied={},
            prompt_tokens=1,
        )  # fmt: skip
        crud.complete_prediction(
            session=session, id="n2", status=Status.SUCCEEDED, output="a",
            finish_reason=FinishReason.STOP, error=None, completion_tokens=5,
            time_to_first_token_s=0.1, total_time_s=1.0, choices=every,
        )  # fmt: skip
    with database.session() as session:
        old = crud.get_prediction(session=session, id="old")
        new = crud.get_prediction(session=session, id="n2")
        assert old is not None and old.choices is None
        assert new is not None and new.choices == every and new.completion_tokens == 5


def test_the_key_name_is_kept_and_0005_rows_read_null(database: Database) -> None:
    """Revision 0006 adds `prediction.api_key_name` (which named key asked); older rows: NULL."""
    with database.engine.begin() as connection:
        config = migrate.alembic_config(connection)
        command.downgrade(config, "0005")
        connection.exec_driver_sql(
            "INSERT INTO prediction (id, status, source, model, input, applied, output, "
            "created_at) VALUES ('old', 'succeeded', 'api', 'm', '{}', '{}', 'x', "
            "'2026-11-26 00:00:00')"
        )
        command.upgrade(config, "head")
    with database.session() as session:
        crud.create_prediction(
            session=session, id="keyed", source=Source.API, model="m", input={}, applied={},
            prompt_tokens=1, api_key_name="ci-script",
        )  # fmt: skip
    with database.session() as session:
        old = crud.get_prediction(session=session, id="old")
        new = crud.get_prediction(session=session, id="keyed")
        assert old is not None and old.api_key_name is None
        assert new is not None and new.api_key_name == "ci-script"
