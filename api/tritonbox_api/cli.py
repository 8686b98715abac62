"""`tritonbox-api serve`: run the api with uvicorn, after checking `.env` for unknown keys."""

from __future__ import annotations

import logging

import uvicorn

from tritonbox_api.main import create_app
from tritonbox_api.settings import ApiSettings
from tritonbox_common.service_cli import serve_settings

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


def main(argv: list[str] | None = None) -> int:
    settings = serve_settings("tritonbox-api", __doc__, ApiSettings, argv)
    if settings is None:
        return 1
    logging.getLogger("uvicorn.access").addFilter(ProbeAccessFilter())
    uvicorn.run(
        create_app(settings),
        host=settings.api_host,
        port=settings.api_port,
        log_level="info",
        # uvloop and httptools (requirements/api.txt) when installed, else asyncio and h11: the
        # same behaviour, at a lower CPU cost per streamed token.
        loop="auto",
        http="auto",
        # Streams must end promptly on Ctrl-C; running predictions are saved as canceled.
        timeout_graceful_shutdown=5,
    )
    return 0
