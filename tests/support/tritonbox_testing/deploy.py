"""Helpers for tests/deploy: the real Compose CLI (no Docker engine needed for `config`)
and the Compose Specification schema."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[3]
SCHEMA = REPO / "tests" / "data" / "compose-spec.json"
COMPOSE_FILES = ("compose.yaml", "compose.cpu.yaml", "compose.common.yaml")
COMPOSE_BIN = Path(sys.executable).parent / "docker-compose"
HADOLINT_BIN = Path(sys.executable).parent / "hadolint"
# Everything compose reads from the caller's environment, cleared so a developer's shell (or a
# .env of theirs) cannot change what the tests see.
_INTERPOLATED = re.compile(r"\$\{([A-Z_][A-Z0-9_]*)")


def interpolated_names(text: str) -> set[str]:
    return set(_INTERPOLATED.findall(text))


def project_copy(tmp_path: Path, env_file: str | None = None) -> Path:
    """The compose files in a fresh folder (no developer `.env` next to them)."""
    project = tmp_path / "project"
    project.mkdir()
    for name in COMPOSE_FILES:
        shutil.copy2(REPO / name, project / name)
    if env_file is not None:
        (project / ".env").write_text(env_file)
    return project


def compose_config(
    project: Path, *files: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`docker-compose [-f FILE…] config --format json` in `project`, with only `env` set."""
    names = {
        name for text in COMPOSE_FILES for name in interpolated_names((REPO / text).read_text())
    }
    environment = {k: v for k, v in os.environ.items() if k not in names}
    environment = {k: v for k, v in environment.items() if not k.startswith("COMPOSE_")}
    environment |= env or {}
    command = [str(COMPOSE_BIN)]
    for name in files:
        command += ["-f", name]
    command += ["config", "--format", "json"]
    return subprocess.run(
        command, cwd=project, env=environment, capture_output=True, text=True, timeout=60
    )


def resolved(project: Path, *files: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    result = compose_config(project, *files, env=env)
    assert result.returncode == 0, result.stderr
    model: dict[str, Any] = json.loads(result.stdout)
    return model


def embedded_schema(binary: Path) -> bytes:
    """The Compose Specification schema compose-go embeds in the `docker-compose` binary."""
    data = binary.read_bytes()
    marker = data.find(b'"$id": "compose_spec.json"')
    assert marker > 0, f"no compose_spec.json schema inside {binary}"
    start = data.rfind(b"{", 0, marker)
    depth, index, in_string, escaped = 0, start, False, False
    while True:
        char = data[index : index + 1]
        if in_string:
            if escaped:
                escaped = False
            elif char == b"\\":
                escaped = True
            elif char == b'"':
                in_string = False
        elif char == b'"':
            in_string = True
        elif char == b"{":
            depth += 1
        elif char == b"}":
            depth -= 1
            if depth == 0:
                return data[start : index + 1]
        index += 1
