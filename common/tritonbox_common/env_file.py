"""Reject unknown keys in `.env`: with `extra="ignore"` a typo would silently keep a default.

Every service's settings class reads the same `.env`, so a key is known when any of them has a
field for it. Each service's distribution registers its class under the `tritonbox.settings`
entry point group (its pyproject.toml), so this shared package imports none of them, and a
service installed alone (one container image) knows its own keys only.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, TypeVar

from dotenv.parser import parse_stream
from pydantic_settings import BaseSettings

from tritonbox_common.shared_settings import env_fields

ENTRY_POINT_GROUP = "tritonbox.settings"
SERVICE_ORDER = ("triton", "api", "playground")
# The same `.env` feeds `docker compose`, whose own variables start with this.
COMPOSE_PREFIX = "COMPOSE_"


def settings_classes() -> tuple[type[BaseSettings], ...]:
    """Every installed service's settings class, in pipeline order (triton, api, playground),
    then any other by name: generated docs list them in that order."""
    found = {point.name: point for point in entry_points(group=ENTRY_POINT_GROUP)}
    order = {name: rank for rank, name in enumerate(SERVICE_ORDER)}
    names = sorted(found, key=lambda name: (order.get(name, len(order)), name))
    return tuple(found[name].load() for name in names)


class EnvFileError(ValueError):
    """`.env` has unknown or malformed lines; the message lists each with its line number."""


def known_env_keys(classes: Iterable[type[BaseSettings]] | None = None) -> frozenset[str]:
    """The upper-case environment names of the classes' fields (env_prefix included)."""
    keys: set[str] = set()
    for cls in settings_classes() if classes is None else classes:
        prefix = str(cls.model_config.get("env_prefix") or "")
        keys.update(f"{prefix}{name}".upper() for name in env_fields(cls))
    return frozenset(keys)


def check_env_file(path: Path, known_keys: Iterable[str]) -> None:
    """Raise EnvFileError listing every unknown key in `path`, with a "did you mean" hint.

    A missing file is fine: every setting has a default or is checked by its settings class.
    Keys are compared case-insensitively, as pydantic-settings reads them.
    """
    if not path.is_file():
        return
    known = sorted({key.upper() for key in known_keys})
    problems: list[str] = []
    with path.open(encoding="utf-8") as stream:
        for binding in parse_stream(stream):
            line = binding.original.line
            if binding.error:
                problems.append(f"  line {line}: cannot parse {binding.original.string.strip()!r}")
                continue
            if binding.key is None or binding.key.upper() in known:
                continue  # comments and blank lines have no key
            if binding.key.upper().startswith(COMPOSE_PREFIX):
                continue  # Docker Compose's own (COMPOSE_FILE, COMPOSE_PROJECT_NAME, …)
            hint = difflib.get_close_matches(binding.key.upper(), known, n=1)
            suggestion = f" (did you mean {hint[0]}?)" if hint else ""
            problems.append(f"  line {line}: unknown key {binding.key}{suggestion}")
    if problems:
        raise EnvFileError(
            f"{path} has {len(problems)} problem(s) (no service reads an unknown key, so a "
            "mistyped setting would silently keep its default):\n" + "\n".join(problems)
        )


SettingsT = TypeVar("SettingsT", bound=BaseSettings)


def load_service_settings(cls: type[SettingsT], env_file: Path) -> SettingsT:
    """A service's settings from the environment and `env_file`, after refusing keys that no
    service knows (EnvFileError); pydantic's ValidationError names a bad or missing value."""
    check_env_file(env_file, known_env_keys())
    factory: Any = cls  # `_env_file` is pydantic-settings' init-only option
    settings: SettingsT = factory(_env_file=env_file)
    return settings
