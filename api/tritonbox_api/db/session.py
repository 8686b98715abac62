"""The database: one engine, and the threads every database call runs on.

Database calls block, so none runs on the event loop. On SQLite (the embedded default) writes
go to one dedicated thread (SQLite allows one writer at a time; queueing them here instead of in
SQLite's busy handler means no "database is locked" storms under load) and reads to a few
threads of their own (WAL lets readers run beside the writer). PostgreSQL takes concurrent
writers, so there writes get several threads too: commits then overlap instead of queueing
behind one another's round trips. Each call gets a fresh `Session`; the function it runs commits
its own writes (the `crud` helpers do), anything left uncommitted is rolled back.

The schema is brought to the newest migration when the database opens (`migrate`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from sqlalchemy import URL, Engine, create_engine, event, make_url
from sqlmodel import Session

from tritonbox_api.db import dialects, migrate
from tritonbox_api.db.batches import Batch, BatchFile, BatchLine  # noqa: F401  (the tables)
from tritonbox_api.db.models import Adapter, ApiWorker, Prediction  # noqa: F401  (the tables)

log = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_BUSY_TIMEOUT_MS = 5000
DEFAULT_READERS = 4
POSTGRES_WRITERS = 4


class DatabaseClosedError(RuntimeError):
    pass


class Database:
    def __init__(
        self,
        target: str | URL | Path,
        *,
        readers: int = DEFAULT_READERS,
        busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS,
    ) -> None:
        """`target`: an SQLAlchemy URL (`sqlite:///file`, `postgresql+psycopg://...`), or the
        path of an SQLite file."""
        self.url = make_url(f"sqlite:///{target}" if isinstance(target, Path) else target)
        self.dialect = self.url.get_backend_name()
        if self.dialect not in ("sqlite", "postgresql"):
            raise ValueError(f"database: SQLite or PostgreSQL, not {self.dialect}")
        self.is_sqlite = self.dialect == "sqlite"
        # The SQLite file, for the file-level steps (its folder, the migration lock).
        self.path: Path | None = Path(self.url.database or "") if self.is_sqlite else None
        if self.is_sqlite and not self.url.database:
            raise ValueError("database: an SQLite URL needs a file (sqlite:///path)")
        self._readers = readers
        self._busy_timeout_ms = busy_timeout_ms
        # The api worker this process is (db.workers): the owner of the predictions it inserts.
        self.owner: str | None = None
        self._engine: Engine | None = None
        self._writer: ThreadPoolExecutor | None = None
        self._reader: ThreadPoolExecutor | None = None

    @property
    def name(self) -> str:
        """The URL without its password, for logs and errors."""
        return self.url.render_as_string(hide_password=True)

    @property
    def engine(self) -> Engine:
        if self._engine is None:
            raise DatabaseClosedError(f"database {self.name} is not open")
        return self._engine

    def open(self, *, migrate_schema: bool = True) -> None:
        """Create the engine and the threads, and bring the schema to the newest migration (an
        SQLite file and its folder are created if needed)."""
        if self._engine is not None:
            return
        writers = 1 if self.is_sqlite else POSTGRES_WRITERS
        if self.is_sqlite:
            assert self.path is not None
            self.path.parent.mkdir(parents=True, exist_ok=True)
            engine = create_engine(
                self.url,
                # Sessions are made on the executor threads, never shared between two at once.
                connect_args={
                    "check_same_thread": False,
                    "timeout": self._busy_timeout_ms / 1000,
                },
                # A connection for every thread that may hold one: the writer, the readers, the
                # sync `session()` and `is_writable` callers.
                pool_size=self._readers + 2,
            )
            event.listen(engine, "connect", self._configure_sqlite)
        else:
            engine = create_engine(
                self.url,
                pool_size=self._readers + writers + 2,
                # A server restarted under the api: stale connections are replaced, not served.
                pool_pre_ping=True,
            )
        if migrate_schema:
            migrate.upgrade(engine, lock_path=self.path)
        self._engine = engine
        self._writer = ThreadPoolExecutor(max_workers=writers, thread_name_prefix="db-write")
        self._reader = ThreadPoolExecutor(max_workers=self._readers, thread_name_prefix="db-read")
        log.info("database %s open", self.name)

    def _configure_sqlite(self, dbapi_connection: object, _record: object) -> None:
        dialects.configure_sqlite(dbapi_connection, self._busy_timeout_ms)

    def close(self) -> None:
        """Finish the queued calls, then close every connection. Safe to call twice."""
        for executor in (self._writer, self._reader):
            if executor is not None:
                executor.shutdown(wait=True)
        self._writer = self._reader = None
        if self._engine is not None:
            if self.is_sqlite:
                dialects.checkpoint_sqlite(self._engine)
            self._engine.dispose()
            self._engine = None
            log.info("database %s closed", self.name)

    @contextlib.contextmanager
    def session(self) -> Iterator[Session]:
        """A session on the calling thread, for scripts and tests (never on the event loop)."""
        # expire_on_commit=False: rows stay readable after the session is gone.
        with Session(self.engine, expire_on_commit=False) as session:
            yield session

    def _call(self, fn: Callable[[Session], T]) -> T:
        with self.session() as session:
            session.info["owner"] = self.owner
            return fn(session)

    async def run(self, fn: Callable[[Session], T]) -> T:
        """Run `fn` with a fresh session on a writer thread (on SQLite, the one writer: writes
        one after another)."""
        return await asyncio.wrap_future(self.submit(fn))

    def submit(self, fn: Callable[[Session], T]) -> Future[T]:
        """`run` without waiting: `fn` is queued on a writer thread and runs whether or not
        anyone awaits it (the group commit's drains, db.group_commit)."""
        if self._writer is None:
            raise DatabaseClosedError(f"database {self.name} is not open")
        return self._writer.submit(self._call, fn)

    async def read(self, fn: Callable[[Session], T]) -> T:
        """Run `fn` with a fresh session on a reader thread; `fn` must not write."""
        if self._reader is None:
            raise DatabaseClosedError(f"database {self.name} is not open")
        return await asyncio.get_running_loop().run_in_executor(self._reader, self._call, fn)

    def is_writable(self) -> bool:
        """Whether a write could be committed now, changing nothing. False when closed,
        read-only, locked past busy_timeout (SQLite), or unreachable / a standby (PostgreSQL)."""
        if self._engine is None:
            return False
        try:
            if self.is_sqlite:
                dialects.check_sqlite_writable(self._engine)
            else:
                dialects.check_postgres_writable(self._engine)
        except Exception as error:  # sqlite3 errors come unwrapped from the driver connection
            log.warning("database %s is not writable: %s", self.name, error)
            return False
        return True

    async def check_writable(self) -> bool:
        """`is_writable` on a writer thread: on SQLite it never competes with the api's own
        writes."""
        if self._writer is None:
            return False
        return await asyncio.get_running_loop().run_in_executor(self._writer, self.is_writable)
