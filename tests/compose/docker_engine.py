"""A Docker engine and the base images for scripts/test_compose.

The engine: the running one if `docker info` answers, else a `dockerd` started here (root
needed) and stopped again by its pid at the end; its data root is the default one, so the layer
cache and the base images survive between runs. The Compose CLI: `docker compose` as
documented; where the plugin is missing, the pinned Compose CLI of the project's venv is made
that plugin for these commands only (a private DOCKER_CONFIG with a cli-plugins link).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# In what the tests/compose/standins scripts write on their images.
STANDIN_MARK = "tritonbox stand-in"


def docker(*args: str, timeout: float = 120, env: dict[str, str] | None = None) -> str:
    result = subprocess.run(
        ["docker", *args], capture_output=True, text=True, timeout=timeout, env=env
    )
    if result.returncode != 0:
        raise RuntimeError(f"docker {' '.join(args)}: {result.stderr.strip()[-2000:]}")
    return result.stdout


def _answers() -> bool:
    try:
        docker("info", "--format", "{{.ServerVersion}}", timeout=20)
    except (RuntimeError, subprocess.TimeoutExpired):
        return False
    return True


class Engine:
    """The engine to use; `stop()` ends only a dockerd this object started."""

    def __init__(self) -> None:
        self.process: subprocess.Popen[bytes] | None = None
        if _answers():
            return
        log = open(Path(tempfile.gettempdir()) / "tritonbox-dockerd.log", "ab")  # noqa: SIM115
        self.process = subprocess.Popen(["dockerd"], stdout=log, stderr=log, start_new_session=True)
        deadline = time.monotonic() + 90
        while not _answers():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"dockerd did not start; see {log.name}")
            time.sleep(1)

    def describe(self) -> str:
        version = docker("version", "--format", "{{.Server.Version}}").strip()
        how = f"started here, pid {self.process.pid}" if self.process else "already running"
        return f"Docker Engine {version} ({how})"

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def dockerfile_default(dockerfile: str, argument: str) -> str:
    """The default of `ARG argument=...` in a Dockerfile (the base image it names)."""
    text = (REPO / dockerfile).read_text()
    match = re.search(rf"^ARG {argument}=(\S+)$", text, re.MULTILINE)
    if match is None:
        raise RuntimeError(f"{dockerfile} has no ARG {argument}=...")
    return match.group(1)


def _standin(image: str) -> str | None:
    """What the stand-in tagged `image` is made of (its mark says), None for any other image;
    RuntimeError when there is no `image` here."""
    # The Python stand-in is marked in its import comment, PostgreSQL's in its label.
    marks = docker("image", "inspect", "--format", "{{.Comment}}\n{{json .Config.Labels}}", image)
    match = re.search(rf"{STANDIN_MARK} for {re.escape(image)}: ([^\"}}\n]+)", marks)
    return match.group(1).strip() if match else None


def base_image(image: str, standin: str = "tests/compose/standins/base") -> str:
    """Make `image` available: as is, pulled, or a stand-in built from the Debian archive by
    `standin` (a script of this repository taking the tag)."""
    try:
        what = _standin(image)
        return f"{image}: STAND-IN (cached; {what})" if what else f"{image}: present"
    except RuntimeError:
        pass
    try:
        docker("pull", image, timeout=300)
        return f"{image}: pulled"
    except (RuntimeError, subprocess.TimeoutExpired) as error:
        reason = str(error).splitlines()[0][:160]
    print(f"{image}: cannot be pulled; building a STAND-IN with {standin}", flush=True)
    subprocess.run([str(REPO / standin), image], check=True, timeout=1800)
    what = _standin(image)
    return f"{image}: STAND-IN built from the Debian archive ({what}; pull failed: {reason})"


def compose_environment() -> dict[str, str]:
    """os.environ, with `docker compose` working (the venv's Compose CLI as the plugin)."""
    env = dict(os.environ)
    probe = subprocess.run(["docker", "compose", "version"], capture_output=True, env=env)
    if probe.returncode == 0:
        return env
    plugin = REPO / ".venv/bin/docker-compose"
    if not plugin.is_file():
        raise RuntimeError("no `docker compose`: install the Compose plugin or run scripts/install")
    config = Path(tempfile.mkdtemp(prefix="tritonbox-docker-config-"))
    (config / "cli-plugins").mkdir()
    (config / "cli-plugins/docker-compose").symlink_to(plugin)
    env["DOCKER_CONFIG"] = str(config)
    return env
