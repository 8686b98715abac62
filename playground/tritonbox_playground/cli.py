"""`tritonbox-playground serve`: run the playground, after checking `.env` for unknown keys."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from tritonbox_playground.settings import PlaygroundSettings
from tritonbox_triton.env_file import EnvFileError, load_service_settings


def load_settings(env_file: Path) -> PlaygroundSettings:
    return load_service_settings(PlaygroundSettings, env_file)


def launch_options(settings: PlaygroundSettings) -> dict[str, Any]:
    """Gradio's launch() arguments: address, login, and nothing that reaches the internet."""
    auth = None
    if settings.playground_username and settings.playground_password:
        auth = (settings.playground_username, settings.playground_password.get_secret_value())
    return {
        "server_name": settings.playground_host,
        "server_port": settings.playground_port,
        "auth": auth,
        "auth_message": "TritonBox playground: sign in with the login you were given.",
        # Sync handlers (none today) would share this pool with every queued run.
        "max_threads": max(40, settings.playground_concurrency),
        "ssr_mode": False,  # server-side rendering needs Node; the page renders in the browser
        "share": False,
        "show_error": True,
        "footer_links": ["api"],
        "quiet": False,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tritonbox-playground", description=__doc__)
    parser.add_argument("command", choices=["serve"])
    parser.add_argument("--env-file", type=Path, default=Path(".env"))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        settings = load_settings(args.env_file)
    except (EnvFileError, ValidationError) as error:
        print(f"tritonbox-playground {args.command}: {error}", file=sys.stderr)
        return 1
    # Imported late: gradio takes seconds to import, and a bad .env should fail at once.
    from tritonbox_playground.app import create_app

    create_app(settings).launch(**launch_options(settings))
    return 0
