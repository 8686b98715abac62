"""`tritonbox-triton`: fetch or prepare the model, check it, render the repository, serve it.

The same entrypoint runs natively (`scripts/up`) and in both container images.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import time
from pathlib import Path
from types import FrameType

from pydantic import ValidationError

from tritonbox_common.env_file import EnvFileError, load_service_settings

from .chat_template import ChatTemplateError, read_chat_template, with_chat_template
from .engine_check import EngineCheckError, check_gpus, visible_gpus
from .fetch import FetchError, fetch, parse_source
from .prepare_model import ModelPreparationError, prepare_default_model
from .render import RenderError, render_repository
from .server import TritonServer, TritonServerError
from .settings import EngineFlavour, TritonSettings

log = logging.getLogger("tritonbox_triton")


def load_settings(env_file: Path) -> TritonSettings:
    return load_service_settings(TritonSettings, env_file)


def resolve_sources(settings: TritonSettings) -> TritonSettings:
    """The settings with ENGINE_REPOSITORY / TOKENIZER_REPOSITORY fetched into local folders.

    trtllm: the repository is the engine (engine_dir); cpu: a checkpoint (model_dir).
    """
    update: dict[str, Path] = {}
    if settings.engine_repository:
        source = parse_source("ENGINE_REPOSITORY", settings.engine_repository)
        if source.is_gguf and settings.engine is EngineFlavour.TRTLLM:
            raise FetchError(
                "ENGINE_REPOSITORY: a GGUF is a checkpoint for ENGINE=cpu; ENGINE=trtllm needs a "
                "TensorRT-LLM engine (scripts/build_engine.py, docs/gpu.md)"
            )
        folder = fetch(source, settings.cache_dir, settings.hf_token)
        update["engine_dir" if settings.engine is EngineFlavour.TRTLLM else "model_dir"] = folder
    if settings.tokenizer_repository:
        source = parse_source("TOKENIZER_REPOSITORY", settings.tokenizer_repository)
        update["tokenizer_dir"] = fetch(source, settings.cache_dir, settings.hf_token)
    return settings.model_copy(update=update) if update else settings


def apply_chat_template(settings: TritonSettings) -> TritonSettings:
    """With CHAT_TEMPLATE, the settings serving a copy of the tokenizer that carries it (every
    step and the api load the tokenizer from that folder: chat_template.py)."""
    if not settings.chat_template:
        return settings
    template = read_chat_template(settings.chat_template)
    folder = with_chat_template(settings.resolved_tokenizer_dir, template, settings.cache_dir)
    log.info("CHAT_TEMPLATE: serving the tokenizer from %s", folder)
    return settings.model_copy(update={"tokenizer_dir": folder})


def prepare(settings: TritonSettings) -> TritonSettings:
    """Fetch what the repositories name, or build the default model once; the settings to use."""
    settings = resolve_sources(settings)
    if settings.engine is EngineFlavour.TRTLLM:
        return apply_chat_template(settings)
    if settings.model_dir is None:
        prepare_default_model(settings.default_model_dir.resolve())
    elif not settings.resolved_model_dir.is_dir():
        raise ModelPreparationError(
            f"ENGINE_REPOSITORY: {settings.resolved_model_dir} is not a directory"
        )
    return apply_chat_template(settings)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    # SIGTERM (docker stop, systemd, CI) takes the same path as Ctrl-C: the server is stopped.
    raise KeyboardInterrupt


def _announce(settings: TritonSettings, repository: Path) -> None:
    metrics = f"http://{settings.triton_host}:{settings.triton_metrics_port}/metrics"
    print(f"Triton is ready ({settings.engine.value} engine, model repository {repository})")
    print(f"  gRPC     {settings.grpc_url}")
    print(f"  HTTP     {settings.http_url}")
    print(f"  metrics  {metrics}")
    print("Press Ctrl-C to stop.", flush=True)


def serve(settings: TritonSettings) -> None:
    """Prepare, render and serve until Ctrl-C or SIGTERM; raise when the server fails."""
    signal.signal(signal.SIGTERM, _interrupt)
    settings = prepare(settings)
    if settings.engine is EngineFlavour.TRTLLM:
        check_gpus(settings, visible_gpus())
    # Rendering checks the engine's build against the settings before anything starts.
    repository = render_repository(settings)
    with TritonServer(settings, model_repository=repository) as server:
        server.wait_ready(settings.triton_ready_timeout_s)
        try:
            # Ready from here on: a stop (even mid-print) is the normal end, not an interruption.
            _announce(settings, repository)
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
    parser.add_argument(
        "command",
        choices=["prepare", "render", "serve"],
        help="prepare: fetch the engine/tokenizer or build the default model; render: also "
        "check the engine and render the model repository; serve: all of it, then tritonserver",
    )
    parser.add_argument("--env-file", type=Path, default=Path(".env"))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        settings = load_settings(args.env_file)
        if args.command == "prepare":
            prepare(settings)
        elif args.command == "render":
            print(render_repository(apply_chat_template(resolve_sources(settings))))
        else:
            serve(settings)
    except (
        EnvFileError,
        ValidationError,
        FetchError,
        ChatTemplateError,
        EngineCheckError,
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
