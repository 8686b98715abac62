"""compose.postgres.yaml on top of either flavour, checked with the real Compose CLI: the
official postgres image with a named volume and a healthcheck, credentials from `.env`, the api
on PostgreSQL with several workers, and nothing added to the default path."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from tritonbox_testing.deploy import (
    REPO,
    compose_config,
    interpolated_names,
    project_copy,
    resolved,
)

from tritonbox_common.env_file import known_env_keys

OVERLAY = "compose.postgres.yaml"


@pytest.fixture
def project(tmp_path: Path) -> Path:
    project = project_copy(tmp_path, env_file="POSTGRES_PASSWORD=from-dotenv\n")
    shutil.copy2(REPO / OVERLAY, project / OVERLAY)
    return project


@pytest.mark.parametrize("flavour", ["compose.yaml", "compose.cpu.yaml"])
def test_postgres_and_workers_on_either_flavour(project: Path, flavour: str) -> None:
    env = {"ENGINE_REPOSITORY": "my-org/engine"}
    model: dict[str, Any] = resolved(project, flavour, OVERLAY, env=env)
    postgres, api = model["services"]["postgres"], model["services"]["api"]
    assert postgres["image"].startswith("postgres:17.")
    assert postgres["environment"]["POSTGRES_PASSWORD"] == "from-dotenv"
    assert postgres["healthcheck"]["test"][1] == "pg_isready"
    assert postgres["volumes"] == [
        {"type": "volume", "source": "postgres", "target": "/var/lib/postgresql/data", "volume": {}}
    ]
    assert "ports" not in postgres  # only the api reaches it
    assert "postgres" in model["volumes"]
    environment = api["environment"]
    assert environment["DATABASE_URL"] == "postgresql+psycopg://tritonbox@postgres:5432/tritonbox"
    assert environment["POSTGRES_PASSWORD"] == "from-dotenv"
    assert environment["API_WORKERS"] == "4"
    assert api["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert api["depends_on"]["triton"]["condition"] == "service_healthy"


def test_workers_from_dotenv(tmp_path: Path) -> None:
    project = project_copy(tmp_path, env_file="POSTGRES_PASSWORD=x\nAPI_WORKERS=2\n")
    shutil.copy2(REPO / OVERLAY, project / OVERLAY)
    api = resolved(project, "compose.cpu.yaml", OVERLAY)["services"]["api"]
    assert api["environment"]["API_WORKERS"] == "2"


def test_a_password_is_required(tmp_path: Path) -> None:
    project = project_copy(tmp_path)
    shutil.copy2(REPO / OVERLAY, project / OVERLAY)
    result = compose_config(project, "compose.cpu.yaml", OVERLAY)
    assert result.returncode != 0 and "set POSTGRES_PASSWORD in .env" in result.stderr


def test_the_default_path_has_no_postgres(tmp_path: Path) -> None:
    model = resolved(project_copy(tmp_path), "compose.cpu.yaml")
    assert "postgres" not in model["services"]
    assert model["services"]["api"]["environment"]["DATABASE_URL"] == ""  # SQLite, /data


def test_every_variable_is_a_documented_setting() -> None:
    known = known_env_keys()
    example = (REPO / ".env.example").read_text()
    for variable in interpolated_names((REPO / OVERLAY).read_text()):
        assert variable in known and f"{variable}=" in example, variable


def test_the_standin_is_built_for_the_pinned_image() -> None:
    """scripts/test_compose builds tests/compose/standins/postgres under the overlay's pin when
    it cannot be pulled; the script's own default must follow a bump of that pin."""
    pinned = yaml.safe_load((REPO / OVERLAY).read_text())["services"]["postgres"]["image"]
    script = (REPO / "tests/compose/standins/postgres").read_text()
    (default,) = re.findall(r"^TAG=\$\{1:-(\S+)\}$", script, re.MULTILINE)
    assert default == pinned
