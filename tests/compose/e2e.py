"""The appliance end to end on a real Docker engine (run through scripts/test_compose).

Builds the three images with `docker compose -f compose.cpu.yaml build` (the documented path;
package-index settings from this machine's pip, docs/deployment.md), brings the stack up with
`docker compose -f compose.cpu.yaml up`, published on loopback only and in a project (so a
network and volumes) of its own, and checks it from outside as a user would. Measures builds,
image sizes, cold and warm start-to-healthy and memory, and prints them as the table of
docs/deployment.md; `--write-docs` also writes that table into the page (a test run never
rewrites a tracked file: `scripts/test_compose --write-docs` is how the page is refreshed).
Then, on the same images and project, the PostgreSQL overlay with four api workers
(tests/compose/postgres.py). Ends with `compose: N passed, M failed`; exits 1 on any failure.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx

# The helpers as `tests.compose.…` (as mypy names them); the repo root only for these imports, since
# its `triton/` folder would pass for the `triton` package (why PYTHONSAFEPATH=1). tests/support:
# the tests' shared helpers (tritonbox_testing: the long stream the checks cancel and stop).
sys.path += [
    str(Path(__file__).resolve().parents[2]),
    str(Path(__file__).resolve().parents[1] / "support"),
]
from tests.compose.deployment_table import Measured, table, write_benchmark
from tests.compose.docker_build_env import bridge_gateway, serving
from tests.compose.docker_engine import (
    Engine,
    base_image,
    compose_environment,
    docker,
    dockerfile_default,
)
from tests.compose.postgres import postgres_overlay, postgres_phase
from tests.compose.stack import (
    REPO,
    Checks,
    Stack,
    found,
    page,
    predict,
    stored,
)
from tests.compose.stop_checks import stop_phase
from tritonbox_testing.hardware import AVX512, BF16, NATIVE_BF16

SERVICES = ("triton", "api", "playground")


def stream_chat(stack: Stack) -> str:
    models = httpx.get(f"{stack.api}/v1/models", headers=stack.auth, timeout=30).json()["data"]
    body = {
        "model": models[0]["id"],
        "messages": [{"role": "user", "content": "What is the capital of France?"}],
        "max_tokens": 16,
        "temperature": 0,
        "stream": True,
    }
    chunks: list[str] = []
    url = f"{stack.api}/v1/chat/completions"
    with httpx.stream("POST", url, json=body, headers=stack.auth, timeout=120) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                delta = json.loads(line[6:])["choices"][0]["delta"]
                chunks.append(delta.get("content") or "")
    text = "".join(chunks)
    assert len([c for c in chunks if c]) > 1 and "Paris" in text, chunks
    return f"{len(chunks)} chunks: {text!r}"


def closed_by_default(stack: Stack) -> str:
    """Published on loopback only, and the api refuses callers without the key."""
    for service in ("api", "playground"):
        bindings = docker("port", stack.container(service)).split()
        addresses = {b.rsplit(":", 1)[0] for b in bindings if ":" in b}
        assert addresses == {"127.0.0.1"}, (service, bindings)
    refused = httpx.post(f"{stack.api}/predict", json={"prompt": "Hi"}, timeout=30)
    assert refused.status_code == 401, refused.status_code
    return "127.0.0.1 only; 401 without the key"


def secrets_stay_hidden(stack: Stack) -> str:
    """The key is in no command line (`docker inspect`, `docker top`), no log, not in the page."""
    stack.secret_hidden(stack.key)
    for path in ("/", "/config"):
        assert stack.key not in httpx.get(f"{stack.playground}{path}", timeout=60).text, path
    return "not in command lines, logs or the playground page"


def run(checks: Checks, measured: Measured) -> None:
    engine = Engine()
    try:
        print(engine.describe(), flush=True)
        measured.engine = engine.describe().split(" (")[0]
        env = compose_environment()
        measured.compose = docker("compose", "version", "--short", env=env).strip()
        dockerfiles = ("triton/Dockerfile.cpu", "api/Dockerfile", "playground/Dockerfile")
        for image in sorted({dockerfile_default(d, "PYTHON_IMAGE") for d in dockerfiles}):
            note = base_image(image)
            size = int(docker("image", "inspect", "-f", "{{.Size}}", image)) / 1e6
            measured.base = f"{note}, {size:.0f} MB"
            print(measured.base, flush=True)
        stack = Stack(env)
        with postgres_overlay(stack) as overlaid:
            # Leftovers of a failed run, PostgreSQL's volume included (its password was another).
            overlaid.compose("down", "--volumes", "--remove-orphans")
            try:
                if exercise(checks, measured, stack):
                    postgres_phase(checks, measured, overlaid)
            finally:
                checks.check("down -v", lambda: overlaid.compose("down", "--volumes") and None)
    finally:
        engine.stop()


def exercise(checks: Checks, measured: Measured, stack: Stack) -> bool:
    """The default CPU stack; True once it came up (the PostgreSQL phase goes on from there)."""
    with serving(bridge_gateway()) as index:
        if index:
            print("package index for the builds: " + ", ".join(sorted(index)), flush=True)
            # This machine's index holds the CPU torch; PyTorch's own index is not needed.
            index["TORCH_INDEX_URL"] = ""
        for service in SERVICES:
            start = time.monotonic()
            if not checks.check(f"build {service}", _builder(stack, service, index)):
                return False
            measured.build_s[service] = time.monotonic() - start
    for service in SERVICES:
        image = stack.compose("config", "--images").split()
        name = next(i for i in image if i.startswith(f"tritonbox/{service}:"))
        measured.size_mb[service] = int(docker("image", "inspect", "-f", "{{.Size}}", name)) / 1e6
    print("images: " + ", ".join(f"{s} {m:.0f} MB" for s, m in measured.size_mb.items()))
    checks.check("api image <= 450 MB", lambda: _at_most(measured.size_mb["api"], 450))
    checks.check(
        "playground image <= 350 MB", lambda: _at_most(measured.size_mb["playground"], 350)
    )
    if not checks.check("up (cold): all healthy", lambda: measured.set("cold_s", stack.up())):
        print(stack.compose("logs", "--tail", "60"), flush=True)
        return False
    checks.check(
        "triton prepared the model",
        lambda: found("prepared SmolLM2-135M-Instruct.Q4_1.gguf at", _logs(stack)),
    )
    checks.check("/readyz", lambda: page(f"{stack.api}/readyz", '"ready"'))
    compiled = ("compiled in", "act·up", "compiled decode attention")
    checks.check("engine's decode path for this CPU", lambda: _decode_path(stack, *compiled))
    ids: list[str] = []
    checks.check("/predict greedy", lambda: _record(ids, predict(stack)))
    checks.check("streaming chat completion", lambda: stream_chat(stack))
    if ids:
        checks.check("permalink page", lambda: page(f"{stack.api}/p/{ids[0]}", "Paris"))
    checks.check("playground page", lambda: page(f"{stack.playground}/", "gradio"))
    checks.check("closed by default", lambda: closed_by_default(stack))
    checks.check("secrets stay hidden", lambda: secrets_stay_hidden(stack))
    stop_phase(checks, stack)  # issue 23: triton stopped and crashed, then serving again
    measured.memory = stack.memory(SERVICES)
    print("memory: " + ", ".join(f"{s} {m}" for s, m in measured.memory.items()), flush=True)
    checks.check("restart api", lambda: stack.compose("restart", "api") and stack.up() and None)
    if ids:
        checks.check("prediction kept across restart", lambda: stored(stack, ids[0]))
    checks.check("down (volumes kept)", lambda: stack.compose("down") and None)
    checks.check("up (warm): all healthy", lambda: measured.set("warm_s", stack.up()))
    checks.check("model reused", lambda: found("default model already prepared", _logs(stack)))
    checks.check(
        "decode path again, kernels from the volume",
        lambda: _decode_path(stack, "cached in /cache/kernels"),
    )
    if ids:
        checks.check("prediction kept across down/up", lambda: stored(stack, ids[0]))
    checks.check("/predict greedy after down/up", lambda: predict(stack) and None)
    checks.check("warm start measurably faster", lambda: _faster(measured))
    return True


def _builder(stack: Stack, service: str, index: dict[str, str]) -> Callable[[], object]:
    return lambda: stack.compose("build", service, env=stack.env | index) and None


def _record(ids: list[str], prediction_id: str) -> str:
    ids.append(prediction_id)
    return f"' Paris.' ({prediction_id})"


def _logs(stack: Stack) -> str:
    return stack.compose("logs", "triton")


def _decode_path(stack: Stack, *built: str) -> str:
    """The engine's ready line (in tritonserver's log, in the cache volume) names the decode path
    this CPU gets. Where the engine runs bfloat16 (natively, or with AVX2's products:
    tritonbox_testing.hardware), the fused elementwise stages (the C compiler and OpenMP in the
    image, the library in the volume) with each of `built`'s words, the compiled attention only
    on AVX-512; elsewhere float32 with PyTorch's operations (docs/cpu-engine.md)."""
    log = docker("exec", stack.container("triton"), "cat", "/cache/logs/tritonserver-8001.log")
    line = next((row for row in log.splitlines() if "cpu engine ready" in row), "")
    assert "decoding with the written-out step" in line, line or log[-2000:]
    if BF16:
        assert "bfloat16 (auto: " in line and "fused elementwise stages" in line, line
        assert ("CPU has" if NATIVE_BF16 else "AVX2 products") in line, line
        wanted = [w for w in built if AVX512 or w != "compiled decode attention"]
        assert all(words in line for words in wanted), line
    else:
        float32 = ("float32 (auto: no native bf16)", "elementwise stages as PyTorch's operations")
        assert all(words in line for words in float32), line
    return line.partition("cpu engine ready: ")[2].partition(", ")[2].rstrip('"')


def _faster(m: Measured) -> str:
    assert m.warm_s < 0.9 * m.cold_s, f"warm {m.warm_s:.0f} s, cold {m.cold_s:.0f} s"
    return f"warm {m.warm_s:.0f} s < cold {m.cold_s:.0f} s"


def _at_most(megabytes: float, limit: float) -> str:
    assert megabytes <= limit, f"{megabytes:.0f} MB"
    return f"{megabytes:.0f} MB"


def main() -> int:
    os.chdir(REPO)
    checks, measured = Checks(), Measured()
    began = time.monotonic()
    try:
        run(checks, measured)
    except Exception as error:
        checks.failed += 1
        print(f"FAIL setup: {type(error).__name__}: {error}", flush=True)
    measured.total_s = time.monotonic() - began
    print(measured.summary(), flush=True)
    print(table(measured), flush=True)
    if checks.failed == 0 and "--write-docs" in sys.argv[1:]:
        write_benchmark(measured, REPO / "docs/deployment.md")
    print(f"compose: {checks.passed} passed, {checks.failed} failed", flush=True)
    return 1 if checks.failed else 0


if __name__ == "__main__":
    sys.exit(main())
