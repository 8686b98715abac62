"""`tritonbox-triton`: prepare the model, render the repository, serve it with tritonserver."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from pathlib import Path

from pydantic import ValidationError

from .env_file import EnvFileError, check_env_file, known_env_keys
from .prepare_model import ModelPreparationError, prepare_default_model
from .render import RenderError, render_repository
from .server import TritonServer, TritonServerError
from .settings import TritonSettings

log = logging.getLogger("tritonbox_triton")


def load_settings(env_file: Path) -> TritonSettings:
    """Settings from the environment and `env_file`, refusing keys that no service knows."""
    check_env_file(env_file, known_env_keys())
    factory: type[TritonSettings] = TritonSettings
    return factory(_env_file=env_file)  # type: ignore[call-arg]


def prepare(settings: TritonSettings) -> None:
    if settings.model_dir is None:
        prepare_default_model(settings.default_model_dir.resolve())
    elif not settings.resolved_model_dir.is_dir():
        raise ModelPreparationError(f"MODEL_DIR {settings.resolved_model_dir} is not a directory")


def serve(settings: TritonSettings) -> None:
    prepare(settings)
    repository = render_repository(settings)
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    with TritonServer(settings, model_repository=repository) as server:
        server.wait_ready(settings.triton_ready_timeout_s)
        print(f"Triton is ready ({settings.engine.value} engine, model repository {repository})")
        print(f"  gRPC     {settings.grpc_url}")
        print(f"  HTTP     {settings.http_url}")
        print(f"  metrics  http://{settings.triton_host}:{settings.triton_metrics_port}/metrics")
        print("Press Ctrl-C to stop.", flush=True)
        while not stop.wait(1.0):
            if not server.is_alive():
                raise TritonServerError(f"tritonserver exited:\n{server.log_tail()}")
        log.info("stopping tritonserver")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tritonbox-triton", description=__doc__)
    parser.add_argument("command", choices=["prepare", "render", "serve"])
    parser.add_argument("--env-file", type=Path, default=Path(".env"))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        settings = load_settings(args.env_file)
        if args.command == "prepare":
            prepare(settings)
        elif args.command == "render":
            print(render_repository(settings))
        else:
            serve(settings)
    except (
        EnvFileError,
        ValidationError,
        ModelPreparationError,
        RenderError,
        TritonServerError,
    ) as error:
        print(f"tritonbox-triton {args.command}: {error}", file=sys.stderr)
        return 1
    return 0
