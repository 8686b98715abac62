"""`tritonbox-api serve`: run the api with uvicorn, after checking `.env` for unknown keys.

With API_WORKERS > 1, uvicorn's supervisor runs that many worker processes on the one port;
this process migrates the database first (once, before any worker opens it), and each worker
builds its app from the same `.env` (`worker_app`).
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import FastAPI

from tritonbox_api.db.session import Database
from tritonbox_api.db.url import settings_url
from tritonbox_api.main import create_app
from tritonbox_api.processes import prepare_multiprocess_metrics, worker_count
from tritonbox_api.settings import ApiSettings
from tritonbox_common.env_file import load_service_settings
from tritonbox_common.service_cli import serve_settings

# How the supervisor tells its workers which `.env` it read (they start as fresh interpreters).
ENV_FILE_VARIABLE = "TRITONBOX_API_ENV_FILE"
LOG_FORMAT = "%(levelname)s %(name)s: %(message)s"

# Probed every few seconds by compose healthchecks, scripts/up and Prometheus: their access lines
# would bury the requests people make.
PROBE_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})


class ProbeAccessFilter(logging.Filter):
    """Drops uvicorn's access-log lines for health, readiness and metrics probes, failing ones
    too: a launcher polls /readyz every second or two while Triton loads, and /readyz's body
    (not its access line) says what is not ready."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        # uvicorn.access records: (client, method, path with query, http version, status).
        if not isinstance(args, tuple) or len(args) != 5:
            return True
        return str(args[2]).split("?", 1)[0] not in PROBE_PATHS


def worker_app() -> FastAPI:
    """One worker's app (uvicorn calls this in each worker process)."""
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
    logging.getLogger("uvicorn.access").addFilter(ProbeAccessFilter())
    return create_app(load_service_settings(ApiSettings, Path(os.environ[ENV_FILE_VARIABLE])))


def main(argv: list[str] | None = None) -> int:
    serve = serve_settings("tritonbox-api", __doc__, ApiSettings, argv)
    if serve is None:
        return 1
    settings = serve.settings
    logging.getLogger("uvicorn.access").addFilter(ProbeAccessFilter())
    workers = worker_count(settings)
    app: Any = create_app(settings) if workers == 1 else "tritonbox_api.cli:worker_app"
    metrics_folder: Path | None = None
    if workers > 1:
        # Migrated here, once: N workers starting together would otherwise queue on the lock.
        database = Database(settings_url(settings))
        database.open()
        database.close()
        metrics_folder = prepare_multiprocess_metrics()
        os.environ[ENV_FILE_VARIABLE] = str(serve.env_file.resolve())
        logging.getLogger(__name__).info("starting %d api workers", workers)
    uvicorn.run(
        app,
        factory=workers > 1,
        workers=workers if workers > 1 else None,
        # The supervisor kills a worker that does not answer its ping in time, and a worker
        # answers only once its imports are done (the tokenizer stack: seconds, many more on busy
        # cores): at uvicorn's 5 s default, workers were killed and restarted forever under load.
        timeout_worker_healthcheck=60,
        host=serve.host,
        port=settings.api_port,
        log_level="info",
        # uvloop and httptools (requirements/api.txt) when installed, else asyncio and h11: the
        # same behaviour, at a lower CPU cost per streamed token.
        loop="auto",
        http="auto",
        # Streams must end promptly on Ctrl-C; running predictions are saved as canceled.
        timeout_graceful_shutdown=5,
    )
    if metrics_folder is not None:  # the workers are gone: their samples with them
        shutil.rmtree(metrics_folder, ignore_errors=True)
    return 0
