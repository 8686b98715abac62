"""`tritonbox-triton`: prepare the model, render the repository, serve it with tritonserver."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import time
from pathlib import Path
from types import FrameType

from pydantic import ValidationError

from .env_file import EnvFileError, check_env_file, known_env_keys
from .prepare_model import ModelPreparationError, prepare_default_model
from .render import RenderError, render_repository
from .server import TritonServer, TritonServerError
from .settings import EngineFlavour, TritonSettings

log = logging.getLogger("tritonbox_triton")


def load_settings(env_file: Path) -> TritonSettings:
    """Settings from the environment and `env_file`, refusing keys that no service knows."""
    check_env_file(env_file, known_env_keys())
    factory: type[TritonSettings] = TritonSettings
    return factory(_env_file=env_file)  # type: ignore[call-arg]


def prepare(settings: TritonSettings) -> None:
    """Build the default model once, unless MODEL_DIR names another (trtllm needs neither)."""
    if settings.engine is EngineFlavour.TRTLLM:
        return
    if settings.model_dir is None:
        prepare_default_model(settings.default_model_dir.resolve())
    elif not settings.resolved_model_dir.is_dir():
        raise ModelPreparationError(f"MODEL_DIR {settings.resolved_model_dir} is not a directory")


def _interrupt(signum: int, frame: FrameType | None) -> None:
    # SIGTERM (docker stop, systemd, CI) takes the same path as Ctrl-C: the server is stopped.
    raise KeyboardInterrupt


def serve(settings: TritonSettings) -> None:
    """Prepare, render and serve until Ctrl-C or SIGTERM; raise when the server fails."""
    signal.signal(signal.SIGTERM, _interrupt)
    prepare(settings)
    repository = render_repository(settings)
    with TritonServer(settings, model_repository=repository) as server:
        server.wait_ready(settings.triton_ready_timeout_s)
        metrics = f"http://{settings.triton_host}:{settings.triton_metrics_port}/metrics"
        print(f"Triton is ready ({settings.engine.value} engine, model repository {repository})")
        print(f"  gRPC     {settings.grpc_url}")
        print(f"  HTTP     {settings.http_url}")
        print(f"  metrics  {metrics}")
        # Later issues start the api and the playground here, against settings.grpc_url.
        print("Press Ctrl-C to stop.", flush=True)
        try:
            while server.is_alive():
                time.sleep(1.0)
        except KeyboardInterrupt:
            log.info("stopping")
            return
        raise TritonServerError(
            f"tritonserver exited with code {server.returncode}; "
            f"the end of {server.log_path}:\n{server.log_tail()}"
        )


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
        OSError,  # a disk, permission or path problem: its message names the file
    ) as error:
        print(f"tritonbox-triton {args.command}: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"tritonbox-triton {args.command}: interrupted", file=sys.stderr)
        return 130
    return 0
