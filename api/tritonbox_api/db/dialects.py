"""What differs between SQLite and PostgreSQL: connection settings and the writability probe."""

from __future__ import annotations

import contextlib
from typing import Any

from sqlalchemy import Engine, text
from sqlalchemy.exc import DBAPIError


def configure_sqlite(dbapi_connection: Any, busy_timeout_ms: int) -> None:
    # Per connection, because busy_timeout, synchronous and foreign_keys are not stored in
    # the file (journal_mode is, but setting it again costs nothing).
    cursor = dbapi_connection.cursor()
    try:
        # WAL: readers never block the writer nor the writer them.
        cursor.execute("PRAGMA journal_mode=WAL")
        # Another process (a script, a backup, another api worker) holding the lock is waited
        # for, not an error.
        cursor.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
        # In WAL mode NORMAL cannot corrupt the file; a power cut may lose the last commits.
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA foreign_keys=ON")
    finally:
        cursor.close()


def checkpoint_sqlite(engine: Engine) -> None:
    """Leave one self-contained file behind (the WAL folded back into it)."""
    with contextlib.suppress(DBAPIError), engine.connect() as connection:
        connection.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")


def check_sqlite_writable(engine: Engine) -> None:
    """Takes the write lock and writes, then rolls back; raises when that fails."""
    with engine.connect() as connection:
        driver: Any = connection.connection.driver_connection
        assert driver is not None
        try:
            driver.execute("BEGIN IMMEDIATE")
            # BEGIN IMMEDIATE alone succeeds on a read-only file; a write does not.
            version = int(driver.execute("PRAGMA user_version").fetchone()[0])
            driver.execute(f"PRAGMA user_version={version}")
        finally:
            if driver.in_transaction:
                driver.rollback()


class NotWritableError(RuntimeError):
    pass


def check_postgres_writable(engine: Engine) -> None:
    """Raises unless the server is reachable and takes writes (not a read-only standby, not a
    read-only default transaction)."""
    with engine.connect() as connection:
        writable = connection.execute(
            text(
                "SELECT NOT pg_is_in_recovery() "
                "AND current_setting('transaction_read_only') = 'off'"
            )
        ).scalar()
        connection.rollback()
    if not writable:
        raise NotWritableError("the server is read-only (a standby, or read-only transactions)")
