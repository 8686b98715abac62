"""API_WORKERS: how many api processes serve the port, what each one's share of the limits is,
and Prometheus metrics that add up across them.

uvicorn's supervisor starts the workers; they share the listening socket (the kernel hands each
connection to one of them) and the database (db.workers: ownership, heartbeats, cross-worker
cancel). Metrics use prometheus_client's multiprocess mode: each worker writes its samples to
files in PROMETHEUS_MULTIPROC_DIR, and /metrics on any worker sums them.
"""

from __future__ import annotations

import math
import os
import shutil
import tempfile
from pathlib import Path

from prometheus_client import REGISTRY, CollectorRegistry, multiprocess

from tritonbox_api.settings import ApiSettings

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
AUTO_MAX_WORKERS = 8


def worker_count(settings: ApiSettings) -> int:
    """API_WORKERS, with 0 = one per CPU core this process may use (at most 8)."""
    if settings.api_workers:
        return settings.api_workers
    return max(1, min(AUTO_MAX_WORKERS, len(os.sched_getaffinity(0))))


def per_worker_limit(settings: ApiSettings, total: int | None = None) -> int:
    """Each worker's share of MAX_CONCURRENT_REQUESTS (or of `total`), so that together they
    admit as many as one process would (a worker refuses with 429 once its share runs; rounded
    up)."""
    limit = settings.max_concurrent_requests if total is None else total
    return math.ceil(limit / worker_count(settings))


def prepare_multiprocess_metrics() -> Path:
    """In the supervisor, before any worker starts: a fresh folder for the workers' metric files
    (stale files of an earlier run would be summed in)."""
    folder = os.environ.get(MULTIPROC_ENV)
    if folder:
        path = Path(folder)
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(parents=True)
    else:
        path = Path(tempfile.mkdtemp(prefix="tritonbox-metrics-"))
        os.environ[MULTIPROC_ENV] = str(path)
    return path


def metrics_registry() -> CollectorRegistry:
    """The registry /metrics serves: every worker's samples summed in multiprocess mode."""
    if not os.environ.get(MULTIPROC_ENV):
        return REGISTRY
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)
    return registry


def worker_exited() -> None:
    """A worker that stops: its live gauges (predictions in flight) leave the sums."""
    if os.environ.get(MULTIPROC_ENV):
        multiprocess.mark_process_dead(os.getpid())
