"""Bring a database's schema to the newest migration: on start, or `python -m
tritonbox_api.db.migrate [--env-file .env]` (DATABASE_URL / DATABASE_PATH as the api reads them).

A database made before migrations existed (release 0.1.0: a `prediction` table, no
`alembic_version`) has exactly the first revision's schema: it is stamped with it, then upgraded
in place like any other. Several api workers starting together migrate one at a time: a file
lock beside an SQLite file, a transaction-scoped advisory lock on PostgreSQL (whose DDL is
transactional: a failed migration leaves nothing half done).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import logging
from collections.abc import Iterator
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine, create_engine, inspect, text

from tritonbox_api.db.url import settings_url
from tritonbox_api.settings import ApiSettings
from tritonbox_common.env_file import load_service_settings

log = logging.getLogger(__name__)

MIGRATIONS = Path(__file__).resolve().parent.parent / "migrations"

BASELINE = "0001"  # the schema of databases made before migrations
# Any constant both sides agree on: the key of PostgreSQL's advisory lock for migrations.
_ADVISORY_LOCK_KEY = 0x7472_6974_6F6E  # "triton"


def alembic_config(connection: Connection | None = None) -> Config:
    config = Config()
    # Inside the installed package (the api image runs migrations without the source tree).
    config.set_main_option("script_location", str(MIGRATIONS))
    config.attributes["connection"] = connection
    return config


def head() -> str:
    revision = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert revision is not None
    return revision


def current(connection: Connection) -> str | None:
    return MigrationContext.configure(connection).get_current_revision()


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{path}.migrate.lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def upgrade(engine: Engine, *, lock_path: Path | None = None) -> str | None:
    """Migrate to the newest revision; the revision the database had before (None: new or
    from before migrations)."""
    lock = _file_lock(lock_path) if lock_path is not None else contextlib.nullcontext()
    with lock, engine.begin() as connection:
        if connection.dialect.name == "postgresql":
            # Released at commit: a worker that waited then finds the schema current.
            connection.execute(
                text("SELECT pg_advisory_xact_lock(:key)"), {"key": _ADVISORY_LOCK_KEY}
            )
        before = current(connection)
        if before == head():
            return before  # the usual start: nothing to do, nothing to log
        config = alembic_config(connection)
        if before is None and inspect(connection).has_table("prediction"):
            log.info("database from before migrations: stamping revision %s", BASELINE)
            command.stamp(config, BASELINE)
        command.upgrade(config, "head")
        after = current(connection)
    if after != before:
        log.info("database schema migrated from %s to %s", before or "nothing", after)
    return before


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tritonbox_api.db.migrate", description=__doc__)
    parser.add_argument("--env-file", type=Path, default=Path(".env"))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    settings = load_service_settings(ApiSettings, args.env_file)
    url = settings_url(settings)
    engine = create_engine(url)
    try:
        database = engine.url.database if engine.url.get_backend_name() == "sqlite" else None
        upgrade(engine, lock_path=Path(database) if database else None)
    finally:
        engine.dispose()
    print(f"database {engine.url.render_as_string(hide_password=True)} at revision {head()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
