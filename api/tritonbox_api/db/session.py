"""The SQLite database: one engine, and the threads every database call runs on.

SQLite calls block, so none runs on the event loop: writes go to one dedicated thread (SQLite
allows one writer at a time; queueing them here instead of in SQLite's busy handler means no
"database is locked" storms under load), reads to a few threads of their own (WAL lets readers
run beside the writer). Each call gets a fresh `Session`; the function it runs commits its own
writes (the `crud` helpers do), anything left uncommitted is rolled back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.exc import DBAPIError
from sqlmodel import Session, SQLModel

from tritonbox_api.db import models  # noqa: F401  (registers the tables with SQLModel.metadata)

log = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_BUSY_TIMEOUT_MS = 5000
DEFAULT_READERS = 4


class DatabaseClosedError(RuntimeError):
    pass


class Database:
    def __init__(
        self,
        path: Path,
        *,
        readers: int = DEFAULT_READERS,
        busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS,
    ) -> None:
        self.path = path
        self._readers = readers
        self._busy_timeout_ms = busy_timeout_ms
        self._engine: Engine | None = None
        self._writer: ThreadPoolExecutor | None = None
        self._reader: ThreadPoolExecutor | None = None

    @property
    def engine(self) -> Engine:
        if self._engine is None:
            raise DatabaseClosedError(f"database {self.path} is not open")
        return self._engine

    def open(self) -> None:
        """Create the file (and its folder) if needed, the engine, the threads and the tables."""
        if self._engine is not None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(
            f"sqlite:///{self.path}",
            # Sessions are made on the executor threads, never shared between two at once.
            connect_args={"check_same_thread": False, "timeout": self._busy_timeout_ms / 1000},
            # A connection for every thread that may hold one: the writer, the readers, the
            # sync `session()` and `is_writable` callers.
            pool_size=self._readers + 2,
        )
        event.listen(engine, "connect", self._configure_connection)
        SQLModel.metadata.create_all(engine)
        self._engine = engine
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="db-write")
        self._reader = ThreadPoolExecutor(max_workers=self._readers, thread_name_prefix="db-read")
        log.info("database %s open", self.path)

    def _configure_connection(self, dbapi_connection: Any, _record: Any) -> None:
        # Per connection, because busy_timeout, synchronous and foreign_keys are not stored in
        # the file (journal_mode is, but setting it again costs nothing).
        cursor = dbapi_connection.cursor()
        try:
            # WAL: readers never block the writer nor the writer them.
            cursor.execute("PRAGMA journal_mode=WAL")
            # Another process (a script, a backup) holding the lock is waited for, not an error.
            cursor.execute(f"PRAGMA busy_timeout={int(self._busy_timeout_ms)}")
            # In WAL mode NORMAL cannot corrupt the file; a power cut may lose the last commits.
            cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.execute("PRAGMA foreign_keys=ON")
        finally:
            cursor.close()

    def close(self) -> None:
        """Finish the queued calls, then close every connection. Safe to call twice."""
        for executor in (self._writer, self._reader):
            if executor is not None:
                executor.shutdown(wait=True)
        self._writer = self._reader = None
        if self._engine is not None:
            # Leaves one self-contained file behind (the WAL folded back into it).
            with contextlib.suppress(DBAPIError), self._engine.connect() as connection:
                connection.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
            self._engine.dispose()
            self._engine = None
            log.info("database %s closed", self.path)

    @contextlib.contextmanager
    def session(self) -> Iterator[Session]:
        """A session on the calling thread, for scripts and tests (never on the event loop)."""
        # expire_on_commit=False: rows stay readable after the session is gone.
        with Session(self.engine, expire_on_commit=False) as session:
            yield session

    def _call(self, fn: Callable[[Session], T]) -> T:
        with self.session() as session:
            return fn(session)

    async def run(self, fn: Callable[[Session], T]) -> T:
        """Run `fn` with a fresh session on the writer thread (writes one after another)."""
        if self._writer is None:
            raise DatabaseClosedError(f"database {self.path} is not open")
        return await asyncio.get_running_loop().run_in_executor(self._writer, self._call, fn)

    async def read(self, fn: Callable[[Session], T]) -> T:
        """Run `fn` with a fresh session on a reader thread; `fn` must not write."""
        if self._reader is None:
            raise DatabaseClosedError(f"database {self.path} is not open")
        return await asyncio.get_running_loop().run_in_executor(self._reader, self._call, fn)

    def is_writable(self) -> bool:
        """Whether a write could be committed now: takes the write lock and writes, then rolls
        back, so nothing changes. False when closed, read-only, or locked past busy_timeout."""
        if self._engine is None:
            return False
        try:
            with self._engine.connect() as connection:
                driver = connection.connection.driver_connection
                assert driver is not None
                try:
                    driver.execute("BEGIN IMMEDIATE")
                    # BEGIN IMMEDIATE alone succeeds on a read-only file; a write does not.
                    version = int(driver.execute("PRAGMA user_version").fetchone()[0])
                    driver.execute(f"PRAGMA user_version={version}")
                finally:
                    if driver.in_transaction:
                        driver.rollback()
        except Exception as error:  # sqlite3 errors come unwrapped from the driver connection
            log.warning("database %s is not writable: %s", self.path, error)
            return False
        return True

    async def check_writable(self) -> bool:
        """`is_writable` on the writer thread: it never competes with the api's own writes."""
        if self._writer is None:
            return False
        return await asyncio.get_running_loop().run_in_executor(self._writer, self.is_writable)
