"""The images: hadolint on every Dockerfile, pinned bases and versions, non-root users, the
shared entrypoint, and a .dockerignore that keeps models, caches and secrets out."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from tritonbox_testing.deploy import HADOLINT_BIN, REPO

DOCKERFILES = (
    "triton/Dockerfile",
    "triton/Dockerfile.cpu",
    "api/Dockerfile",
    "playground/Dockerfile",
)
GPU_BASE = re.compile(r"^nvcr\.io/nvidia/tritonserver:\d\d\.\d\d-trtllm-python-py3$")
SLIM_BASE = re.compile(r"^python:3\.11\.\d+-slim-\w+$")


def instructions(name: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", (REPO / name).read_text())
    lines = [line.strip() for line in text.splitlines()]
    return [
        (line.split(None, 1)[0].upper(), line.split(None, 1)[1])
        for line in lines
        if line and not line.startswith("#")
    ]


def final_stage(name: str) -> list[tuple[str, str]]:
    steps = instructions(name)
    last_from = max(i for i, (op, _) in enumerate(steps) if op == "FROM")
    return steps[last_from:]


@pytest.mark.parametrize("name", DOCKERFILES)
def test_hadolint(name: str) -> None:
    result = subprocess.run(
        [str(HADOLINT_BIN), "--no-color", name], cwd=REPO, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("name", DOCKERFILES)
def test_pinned_base_and_non_root(name: str) -> None:
    for op, argument in instructions(name):
        if op == "FROM":
            image = argument.split()[0]
            assert GPU_BASE.match(image) or SLIM_BASE.match(image), image
    users = [argument for op, argument in final_stage(name) if op == "USER"]
    assert users and users[-1] not in {"root", "0", "0:0"}
    assert re.fullmatch(r"\d+:\d+", users[-1])  # numeric: resolvable without /etc/passwd


def test_gpu_and_cpu_images_run_the_same_entrypoint() -> None:
    for name in ("triton/Dockerfile", "triton/Dockerfile.cpu"):
        steps = dict(final_stage(name))
        assert re.fullmatch(r'\["python3?", "-m", "tritonbox_triton"\]', steps["ENTRYPOINT"])
        assert steps["CMD"] == '["serve"]'
    gpu = dict(final_stage("triton/Dockerfile"))
    assert "TRITONSERVER_BIN=/opt/tritonserver/bin/tritonserver" in gpu["ENV"]
    # The module entrypoint works here, where the console script also exists.
    result = subprocess.run(
        [sys.executable, "-m", "tritonbox_triton", "--help"], capture_output=True, text=True
    )
    assert result.returncode == 0 and "serve" in result.stdout


def _pin(text: str, package: str) -> str:
    match = re.search(rf"^{package}==(\S+)$", text, re.MULTILINE)
    assert match, f"{package} is not pinned"
    return match.group(1)


def test_cpu_torch_is_the_pinned_cpu_build() -> None:
    dockerfile = (REPO / "triton/Dockerfile.cpu").read_text()
    pinned = _pin((REPO / "requirements/triton.txt").read_text(), "torch")
    assert f"torch=={pinned} --index-url https://download.pytorch.org/whl/cpu" in dockerfile


def test_api_image_has_no_torch_and_no_tritonserver() -> None:
    lines: list[str] = []
    pending = [REPO / "requirements/api.txt"]
    while pending:
        text = pending.pop().read_text()
        lines += text.splitlines()
        includes = [line.split()[1] for line in text.splitlines() if line.startswith("-r ")]
        pending += [REPO / "requirements" / name for name in includes]
    packages = {line.split("==")[0].split("[")[0] for line in lines if "==" in line}
    assert "transformers" in packages  # the walk did follow -r base.txt
    assert not packages & {"torch", "nvidia-pytriton", "gguf", "accelerate"}


def _ignore_rules() -> list[str]:
    lines = (REPO / ".dockerignore").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def test_dockerignore_is_an_allow_list() -> None:
    rules = _ignore_rules()
    assert rules[0] == "*"  # nothing enters a build context unless named below
    allowed = [rule[1:].rstrip("/") for rule in rules if rule.startswith("!")]
    for path in allowed:
        assert not path.startswith((".cache", ".venv", ".env", "models", "tests", "docs")), path
    for pattern in ("**/*.db", "**/*.gguf", "**/*.safetensors", "**/*.engine", "**/__pycache__"):
        assert pattern in rules
    # Every file a Dockerfile copies from the context is allowed in.
    for name in DOCKERFILES:
        for op, argument in instructions(name):
            if op != "COPY" or argument.startswith("--from"):
                continue
            for source in argument.split()[:-1]:
                assert any(
                    Path(source).match(path) or source.startswith(path.replace("*.txt", ""))
                    for path in allowed
                ), f"{name}: {source} is excluded by .dockerignore"
