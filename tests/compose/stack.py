"""The compose project scripts/test_compose drives, and what its checks share.

`Stack` is `docker compose -f FILE... -p tritonbox-e2e ...` with the test's environment: ports
of its own, published on loopback only, and an API_KEY the checks look for where secrets must
never be. `Checks` counts passes and failures and prints one line for each.
"""

from __future__ import annotations

import dataclasses
import secrets
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import httpx
from tests.compose.docker_engine import docker

REPO = Path(__file__).resolve().parents[2]
PROJECT = "tritonbox-e2e"
PROMPT = "The capital of France is"


class Checks:
    def __init__(self) -> None:
        self.passed = 0
        self.failed = 0

    def check(self, name: str, step: Callable[[], object]) -> bool:
        try:
            detail = step()
        except Exception as error:  # a failed check is reported, the run goes on
            self.failed += 1
            print(f"FAIL {name}: {type(error).__name__}: {error}", flush=True)
            return False
        self.passed += 1
        print(f"ok   {name}" + (f": {detail}" if detail else ""), flush=True)
        return True


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclasses.dataclass
class Stack:
    """One compose project: its files, its `--env-file` (none: the project's `.env`) and the
    environment `docker compose` runs with."""

    env: dict[str, str]
    files: tuple[str, ...] = ("compose.cpu.yaml",)
    env_file: Path | None = None
    api_port: int = dataclasses.field(default_factory=free_port)
    playground_port: int = dataclasses.field(default_factory=free_port)
    # Published where compose publishes by default (PUBLISH_ADDRESS=127.0.0.1).
    key: str = dataclasses.field(default_factory=lambda: secrets.token_urlsafe(24))
    # Another name keeps another run's containers, network and volumes apart (gemma3.py's).
    project: str = PROJECT

    def __post_init__(self) -> None:
        self.env = self.env | {
            "API_PORT": str(self.api_port),
            "PLAYGROUND_PORT": str(self.playground_port),
            "API_KEY": self.key,
        }

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"}

    @property
    def api(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    @property
    def playground(self) -> str:
        return f"http://127.0.0.1:{self.playground_port}"

    def overlaid(self, overlay: str, env_file: Path, drop: tuple[str, ...] = ()) -> Stack:
        """The same project (ports, key) with `overlay` added and `env_file` as its `.env`;
        `drop`: variables the file must provide, not this process's environment."""
        env = {k: v for k, v in self.env.items() if k not in drop}
        return dataclasses.replace(self, env=env, files=(*self.files, overlay), env_file=env_file)

    def compose(self, *args: str, timeout: float = 1200, env: dict[str, str] | None = None) -> str:
        files = [arg for name in self.files for arg in ("-f", name)]
        env_file = ["--env-file", str(self.env_file)] if self.env_file else []
        command = ["docker", "compose", *files, *env_file, "-p", self.project, *args]
        result = subprocess.run(
            command, cwd=REPO, env=env or self.env, capture_output=True, text=True, timeout=timeout
        )
        if result.returncode != 0:
            raise RuntimeError(
                f"{' '.join(command[1:])}:\n{(result.stdout + result.stderr)[-3000:]}"
            )
        return result.stdout + result.stderr

    def up(self) -> float:
        """Seconds from `up` to every service healthy."""
        start = time.monotonic()
        self.compose("up", "--detach", "--wait", "--wait-timeout", "1200", "--no-build")
        return time.monotonic() - start

    def container(self, service: str) -> str:
        (container,) = self.compose("ps", "--quiet", service).split()
        return container

    def memory(self, services: tuple[str, ...]) -> dict[str, str]:
        ids = self.compose("ps", "--quiet").split()
        out = docker("stats", "--no-stream", "--format", "{{.Name}}\t{{.MemUsage}}", *ids)
        usage = {}
        for line in out.splitlines():
            name, used = line.split("\t")
            service = next((s for s in services if f"-{s}-" in name), None)
            if service:
                usage[service] = used.split(" / ")[0]
        return usage

    def secret_hidden(self, secret: str) -> str:
        """`secret` is in no container's command line (`docker inspect`, and every process
        `docker top` lists) and in no log."""
        processes = 0
        for container in self.compose("ps", "--quiet").split():
            shown = docker(
                "inspect",
                "-f",
                "{{.Path}} {{.Args}} {{.Config.Cmd}} {{.Config.Entrypoint}}",
                container,
            )
            assert secret not in shown, container
            listed = docker("top", container, "-eo", "pid,args")
            assert secret not in listed, container
            processes += len(listed.splitlines()) - 1
        assert secret not in self.compose("logs")
        return f"not in the command lines of {processes} processes, nor in the logs"


def predict(stack: Stack) -> str:
    # Greedy: the default model's next two tokens are " Paris" and "." (then a newline).
    body = {"prompt": PROMPT, "max_tokens": 2, "temperature": 0, "stream": False}
    answer = httpx.post(f"{stack.api}/predict", json=body, headers=stack.auth, timeout=120).json()
    assert answer["output"] == " Paris.", answer
    assert answer["status"] == "succeeded", answer
    return str(answer["id"])


def stored(stack: Stack, prediction_id: str) -> str:
    got = httpx.get(f"{stack.api}/v1/predictions/{prediction_id}", timeout=30).json()
    assert got["output"] == " Paris.", got
    return prediction_id


def page(url: str, needle: str) -> str:
    response = httpx.get(url, timeout=60)
    assert response.status_code == 200 and needle in response.text, response.status_code
    return f"{url} 200"


def found(needle: str, text: str) -> str:
    assert needle in text, f"{needle!r} not in the log"
    return needle
