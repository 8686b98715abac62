"""A real PostgreSQL server for the tests: Debian's `postgresql` package (scripts/install_postgres),
a fresh cluster in a temporary folder, run by the unprivileged `postgres` user when the tests run
as root (PostgreSQL refuses root), listening on 127.0.0.1 on a free port only, stopped after."""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tritonbox_testing.ports import free_ports

DEBIAN_BIN = Path("/usr/lib/postgresql")
USER = "postgres"


def server_bin() -> Path | None:
    """The newest installed server's bin folder (Debian keeps them out of PATH)."""
    versions = sorted(
        (p for p in DEBIAN_BIN.glob("*/bin") if (p / "pg_ctl").is_file()),
        key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0,
    )
    if versions:
        return versions[-1]
    found = shutil.which("pg_ctl")
    return Path(found).parent if found else None


@dataclass
class RunningPostgres:
    host: str
    port: int
    user: str

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://{self.user}@{self.host}:{self.port}/{database}"

    def create_database(self) -> str:
        """A new empty database; its SQLAlchemy URL."""
        import psycopg

        name = f"t_{uuid.uuid4().hex[:16]}"
        with psycopg.connect(
            host=self.host, port=self.port, user=self.user, dbname="postgres", autocommit=True
        ) as connection:
            connection.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)


def _as_server_user(command: list[str]) -> list[str]:
    # PostgreSQL will not run as root: root hands the cluster to the `postgres` user the Debian
    # package creates; anyone else runs it as themselves.
    if os.geteuid() == 0:
        return ["runuser", "-u", USER, "--", *command]
    return command


@contextlib.contextmanager
def run_postgres() -> Iterator[RunningPostgres]:
    """initdb + pg_ctl start in a fresh folder; stopped (fast) and removed at exit."""
    binaries = server_bin()
    if binaries is None:
        raise RuntimeError("PostgreSQL is not installed: run scripts/install_postgres")
    # Not under pytest's tmp folder: that is private to the test user, the server's user must
    # own its data folder.
    folder = Path(tempfile.mkdtemp(prefix="tritonbox-postgres-"))
    owner = os.geteuid()
    if owner == 0:
        account = pwd.getpwnam(USER)
        os.chown(folder, account.pw_uid, account.pw_gid)
        user = USER
    else:
        user = pwd.getpwuid(owner).pw_name
    data, log = folder / "data", folder / "server.log"
    (port,) = free_ports(1)
    subprocess.run(
        _as_server_user(
            [str(binaries / "initdb"), "-D", str(data), "-U", user, "-A", "trust", "-E", "UTF8"]
        ),
        check=True,
        capture_output=True,
    )
    # fsync off: a test cluster that dies with the machine is thrown away anyway; commits still
    # have PostgreSQL's semantics (isolation, locks, constraints), only not its durability.
    options = (
        f"-h 127.0.0.1 -p {port} -k {folder} -c fsync=off -c full_page_writes=off "
        "-c max_connections=200"
    )
    start = [str(binaries / "pg_ctl"), "-D", str(data), "-l", str(log), "-o", options]
    started = subprocess.run(
        _as_server_user([*start, "-w", "-t", "60", "start"]),
        capture_output=True,
        text=True,
    )
    try:
        if started.returncode != 0:
            logged = log.read_text() if log.is_file() else ""
            raise RuntimeError(f"PostgreSQL did not start: {started.stderr}\n{logged}")
        yield RunningPostgres(host="127.0.0.1", port=port, user=user)
    finally:
        subprocess.run(
            _as_server_user([str(binaries / "pg_ctl"), "-D", str(data), "-m", "fast", "stop"]),
            capture_output=True,
        )
        shutil.rmtree(folder, ignore_errors=True)
