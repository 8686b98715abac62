"""The api under attack: in front of a tritonserver of its own (cpu engine, default model, the
suite's guide time limit), with the abuse suite's named keys and limits
(tritonbox_testing.abuse.stack), a real SQLite file, and the hostile adapter folders beside it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from tritonbox_testing.abuse import adapters, stack
from tritonbox_testing.abuse.memory import group_of
from tritonbox_testing.abuse.requests import Target, auth
from tritonbox_testing.api_process import RunningApi, launch_api

from tritonbox_api.settings import ApiSettings


@dataclass(frozen=True)
class UnderAttack:
    target: Target
    api: RunningApi
    processes: dict[str, list[int] | int]  # the api's process (and its children); the engine's


@pytest.fixture(scope="module")
def engine(triton_launcher: Callable[..., Any]) -> Iterator[Any]:
    with triton_launcher(**stack.triton_settings()) as triton:
        yield triton


@pytest.fixture(scope="module")
def under_attack(engine: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[UnderAttack]:
    folder = tmp_path_factory.mktemp("abuse")
    max_bytes = int(ApiSettings.model_fields["adapter_max_bytes"].default)
    hostile = adapters.make(folder / "adapters", max_bytes)
    running = launch_api(engine, folder / "api", **stack.api_settings(hostile.root))
    try:
        running.wait_ready()
        assert running.process is not None
        limits = httpx.get(f"{running.url}/v1/limits", headers=auth("people"), timeout=30)
        assert limits.status_code == 200, limits.text
        target = Target(
            url=running.url,
            model=limits.json()["model"],
            max_input_len=limits.json()["max_input_tokens"],
            adapters=hostile,
        )
        group = group_of(f"--grpc-port={engine.settings.triton_grpc_port}")
        yield UnderAttack(target, running, {"api": running.process.pid, "engine": group})
    finally:
        running.stop()
