"""The second phase of scripts/test_compose: compose.postgres.yaml on top of compose.cpu.yaml.

It follows the first phase on the same project, its images and its still-running stack, the
way docs/scaling.md tells a user to switch: POSTGRES_PASSWORD and API_WORKERS=4 in the
project's `.env` (a copy of it in a private folder, given as `--env-file`, so that a developer's
own `.env` is neither needed nor touched), then `docker compose -f compose.cpu.yaml -f
compose.postgres.yaml up`. The postgres image is the pinned official one, pulled, or a stand-in
built from the Debian archive when no registry answers (tests/compose/standins/postgres).
Checked from outside: every service healthy, four api worker processes, predictions in
PostgreSQL and not in the SQLite file, a cancel through another worker stopping the engine,
50 concurrent requests -> 50 rows, rows kept across `restart api` and `down`/`up`, PostgreSQL
reusing its data after a clean shutdown, and the password in no command line or log.
"""

from __future__ import annotations

import secrets
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import yaml
from tests.compose.deployment_table import Measured
from tests.compose.docker_engine import base_image, docker
from tests.compose.postgres_checks import (
    cancel_across_workers,
    concurrent_rows,
    psql,
    rows,
    sqlite_rows,
    workers,
)
from tests.compose.stack import REPO, Checks, Stack, found, predict, stored

OVERLAY = "compose.postgres.yaml"
WORKERS = 4
CONCURRENT = 50
SERVICES = ("triton", "api", "playground", "postgres")


@contextmanager
def postgres_overlay(stack: Stack) -> Iterator[Stack]:
    """`stack` with the overlay, and as its `.env` the project's own plus a fresh password and
    API_WORKERS (in a private folder, removed after)."""
    own = REPO / ".env"
    text = own.read_text() if own.is_file() else ""
    password = secrets.token_urlsafe(24)
    with tempfile.TemporaryDirectory(prefix="tritonbox-e2e-") as folder:
        env_file = Path(folder) / ".env"
        env_file.write_text(
            f"{text.rstrip()}\nPOSTGRES_PASSWORD={password}\nAPI_WORKERS={WORKERS}\n"
        )
        env_file.chmod(0o600)
        # From the file only: a password in this shell would prove nothing about `.env`.
        yield stack.overlaid(OVERLAY, env_file, drop=("POSTGRES_PASSWORD", "API_WORKERS"))


def _password(stack: Stack) -> str:
    assert stack.env_file is not None
    for line in stack.env_file.read_text().splitlines():
        if line.startswith("POSTGRES_PASSWORD="):
            return line.split("=", 1)[1]
    raise RuntimeError("no POSTGRES_PASSWORD in the test's .env")


def postgres_image() -> str:
    image: str = yaml.safe_load((REPO / OVERLAY).read_text())["services"]["postgres"]["image"]
    return image


def postgres_phase(checks: Checks, measured: Measured, stack: Stack) -> None:
    began = time.monotonic()
    image = postgres_image()
    if not checks.check("postgres image", lambda: _image(measured, image)):
        return
    before = sqlite_rows(stack)  # what the first phase left in the SQLite file
    up = checks.check("up (PostgreSQL, 4 workers): all healthy", lambda: _up(stack, measured))
    if not up:
        _explain(stack)
        measured.postgres_s = time.monotonic() - began
        return
    checks.check(
        "postgres initialised from .env", lambda: found("init process complete", _logs(stack))
    )
    checks.check(f"api runs {WORKERS} workers", lambda: workers(stack, WORKERS))
    ids: list[str] = []
    checks.check("prediction in PostgreSQL", lambda: _in_postgres(stack, ids))
    checks.check("not in the SQLite file", lambda: _not_in_sqlite(stack, before))
    checks.check("cancel across workers stops the engine", lambda: cancel_across_workers(stack))
    checks.check(f"{CONCURRENT} concurrent requests", lambda: concurrent_rows(stack, CONCURRENT))
    measured.postgres_memory = stack.memory(SERVICES)
    count = rows(stack)
    checks.check("restart api", lambda: stack.compose("restart", "api") and stack.up() and None)
    checks.check("rows kept across restart api", lambda: _kept(stack, count, ids))
    checks.check("down (volumes kept)", lambda: stack.compose("down") and None)
    if not checks.check("up again: all healthy", lambda: f"{stack.up():.0f} s"):
        _explain(stack)
    checks.check("PostgreSQL reused its data", lambda: _reused(stack))
    checks.check("rows kept across down/up", lambda: _kept(stack, count, ids))
    checks.check("password hidden", lambda: stack.secret_hidden(_password(stack)))
    measured.postgres_s = time.monotonic() - began
    print(f"PostgreSQL phase: {measured.postgres_s:.0f} s", flush=True)


def _image(measured: Measured, image: str) -> str:
    started = time.monotonic()
    note = base_image(image, "tests/compose/standins/postgres")
    size = int(docker("image", "inspect", "-f", "{{.Size}}", image)) / 1e6
    measured.postgres_image = f"{note}, {size:.0f} MB"
    return f"{measured.postgres_image} ({time.monotonic() - started:.0f} s)"


def _up(stack: Stack, measured: Measured) -> str:
    measured.postgres_up_s = stack.up()
    states = stack.compose("ps", "--format", "{{.Service}} {{.Health}}").split("\n")
    healthy = sorted(line.split()[0] for line in states if line.endswith(" healthy"))
    assert healthy == sorted(SERVICES), states
    return f"{', '.join(healthy)} healthy in {measured.postgres_up_s:.0f} s"


def _explain(stack: Stack) -> None:
    """What a failed `up` left: each service's state and the end of its log."""
    print(stack.compose("ps", "--all", "--format", "{{.Service}}: {{.Status}}"), flush=True)
    print(stack.compose("logs", "--tail", "40", "--timestamps"), flush=True)


def _logs(stack: Stack) -> str:
    return stack.compose("logs", "postgres")


def _in_postgres(stack: Stack, ids: list[str]) -> str:
    prediction_id = predict(stack)
    ids.append(prediction_id)
    query = f"SELECT status, output FROM prediction WHERE id = '{prediction_id}'"
    assert psql(stack, query) == [["succeeded", " Paris."]], psql(stack, query)
    return f"' Paris.' ({prediction_id}) read back with psql"


def _not_in_sqlite(stack: Stack, before: int) -> str:
    assert sqlite_rows(stack) == before, f"{sqlite_rows(stack)} rows, {before} before"
    return f"still the first phase's {before} rows"


def _kept(stack: Stack, count: int, ids: list[str]) -> str:
    assert rows(stack) == count, f"{rows(stack)} rows, {count} before"
    if ids:
        stored(stack, ids[0])  # through the api too
    return f"{count} rows"


def _reused(stack: Stack) -> str:
    log = _logs(stack)
    found("Skipping initialization", log)
    # A clean shutdown before: no crash recovery on this start.
    assert "not properly shut down" not in log and "recovery" not in log, log[-2000:]
    return "no initialisation, no recovery"
