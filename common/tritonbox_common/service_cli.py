"""The start of the api's and the playground's command lines:
`PROG serve [--env-file .env] [--host ADDRESS]`, logging, then the service's settings, or one
line on stderr naming the bad key or value."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Generic

from pydantic import ValidationError

from tritonbox_common.env_file import EnvFileError, SettingsT, load_service_settings
from tritonbox_common.shared_settings import PUBLISH_ADDRESS


@dataclass(frozen=True)
class Serve(Generic[SettingsT]):
    """What `PROG serve` runs with."""

    settings: SettingsT
    env_file: Path
    # The address to listen on: --host when given, else PUBLISH_ADDRESS. The images pass
    # --host 0.0.0.0: inside a container that is the container's own network, and what the host
    # exposes is decided where compose publishes the port (on PUBLISH_ADDRESS).
    host: str


def serve_settings(
    prog: str, description: str | None, cls: type[SettingsT], argv: Sequence[str] | None
) -> Serve[SettingsT] | None:
    """The settings `PROG serve` runs with; None (after saying why) when they cannot be loaded."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("command", choices=["serve"])
    parser.add_argument("--env-file", type=Path, default=Path(".env"))
    parser.add_argument(
        "--host", help="listen on this address instead of PUBLISH_ADDRESS (containers: 0.0.0.0)"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        settings = load_service_settings(cls, args.env_file)
    except (EnvFileError, ValidationError) as error:
        print(f"{prog} {args.command}: {error}", file=sys.stderr)
        return None
    host = args.host or str(getattr(settings, "publish_address", PUBLISH_ADDRESS))
    return Serve(settings=settings, env_file=args.env_file, host=host)
