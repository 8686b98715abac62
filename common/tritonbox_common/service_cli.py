"""The start of the api's and the playground's command lines: `PROG serve [--env-file .env]`,
logging, then the service's settings, or one line on stderr naming the bad key or value."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from pydantic import ValidationError

from tritonbox_common.env_file import EnvFileError, SettingsT, load_service_settings


def serve_settings(
    prog: str, description: str | None, cls: type[SettingsT], argv: Sequence[str] | None
) -> SettingsT | None:
    """The settings `PROG serve` runs with; None (after saying why) when they cannot be loaded."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("command", choices=["serve"])
    parser.add_argument("--env-file", type=Path, default=Path(".env"))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        return load_service_settings(cls, args.env_file)
    except (EnvFileError, ValidationError) as error:
        print(f"{prog} {args.command}: {error}", file=sys.stderr)
        return None
