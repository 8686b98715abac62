"""The database every test here opens: `database_url`'s (SQLite, then PostgreSQL), migrated."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tritonbox_api.db.session import Database


@pytest.fixture
def database(database_url: str) -> Iterator[Database]:
    database = Database(database_url)
    database.open()
    yield database
    database.close()
