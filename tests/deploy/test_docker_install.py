"""The images' shared install step (scripts/docker_install.py) and the build's view of this
machine's pip settings (tests/compose/docker_build_env.py), without a Docker engine."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from types import ModuleType

import pytest
from tritonbox_testing.deploy import REPO


def _load(name: str, path: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, REPO / path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


install = _load("docker_install", "scripts/docker_install.py")
build_env = _load("docker_build_env", "tests/compose/docker_build_env.py")


def test_pins_follow_includes(tmp_path: Path) -> None:
    (tmp_path / "base.txt").write_text("# shared\nnumpy==1.26.4  # why\n")
    (tmp_path / "svc.txt").write_text("-r base.txt\ntritonclient[grpc]==2.73.0\n")
    assert install.pins(tmp_path / "svc.txt") == ["numpy==1.26.4", "tritonclient[grpc]==2.73.0"]


def test_every_service_requirement_file_resolves() -> None:
    for name in ("triton", "api", "playground", "llm"):
        lines = install.pins(REPO / f"requirements/{name}.txt")
        assert lines and all(install.NAME.match(line) for line in lines), name


def test_keep_installed_holds_the_base_versions() -> None:
    lines = [
        "transformers==5.23.0",
        "tritonclient[grpc]==2.73.0",
        'uvloop==0.23.0; sys_platform != "win32"',
    ]
    installed = {"transformers": "4.51.3", "tritonclient": "2.58.0"}
    assert install.rewrite(lines, installed, cpu_torch=False) == [
        "transformers==4.51.3",
        "tritonclient[grpc]==2.58.0",  # the extra stays: its dependencies are still wanted
        'uvloop==0.23.0; sys_platform != "win32"',
    ]


def test_cpu_torch_is_an_exact_local_version() -> None:
    assert install.rewrite(["torch==2.13.0"], {}, cpu_torch=True) == ["torch==2.13.0+cpu"]
    assert install.rewrite(["torch==2.13.0"], {}, cpu_torch=False) == ["torch==2.13.0"]


def test_ca_certificate_is_added_to_pips_bundle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pem = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----"
    monkeypatch.setenv("BUILD_CA_CERT", pem)
    monkeypatch.setenv("PIP_INDEX_URL", "")  # an unset build argument must not reach pip
    monkeypatch.delenv("PIP_CERT", raising=False)
    env = install.pip_environment(tmp_path)
    bundle = Path(env["PIP_CERT"]).read_text()
    assert bundle.rstrip().endswith(pem) and bundle.count("BEGIN CERTIFICATE") > 100
    assert "BUILD_CA_CERT" not in env and "PIP_INDEX_URL" not in env


def test_project_step_hooks_the_prefix_into_an_isolated_interpreter(tmp_path: Path) -> None:
    # What Triton's Python backend stub does: an isolated interpreter (-I ignores PYTHONPATH)
    # must still import what the install step put into the prefix, through the .pth file.
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = venv / "prefix/lib/python3.11/site-packages"
    (site / "marker_pkg").mkdir(parents=True)
    (site / "marker_pkg/__init__.py").write_text("VALUE = 42\n")
    python = venv / "bin/python"
    # The project step's .pth line (the step itself also runs pip, which needs an index).
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    (Path(purelib) / install.PTH).write_text(install.pth_lines([site]))
    result = subprocess.run(
        [str(python), "-I", "-c", "import marker_pkg; print(marker_pkg.VALUE)"],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": "/nonexistent"},
    )
    assert result.stdout.strip() == "42", result.stderr
    assert install.site_dirs(venv / "prefix") == [site]


def test_host_pip_settings_become_served_urls(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "pkg-1.0+cpu-py3-none-any.whl").write_bytes(b"wheel")
    index = tmp_path / "pypi/simple"
    (index / "pkg").mkdir(parents=True)
    (index / "pkg/index.html").write_text('<a href="../../files/pkg-1.0.whl">pkg</a>')
    (tmp_path / "pypi/files").mkdir()
    (tmp_path / "pypi/files/pkg-1.0.whl").write_bytes(b"indexed")
    constraints = tmp_path / "etc/constraints.txt"
    constraints.parent.mkdir()
    constraints.write_text("torch<=2.14.1\n")
    (tmp_path / "etc/secret.conf").write_text("password")
    settings = {
        "find-links": str(wheels),
        "extra-index-url": f"file://{index} https://mirror.example/simple",
        "constraint": str(constraints),
    }
    served = build_env.Served("127.0.0.1")
    args = build_env.build_args(settings, served)
    base = f"http://127.0.0.1:{build_env.PORT}"
    assert args["PIP_EXTRA_INDEX_URL"] == f"{base}/0/simple/ https://mirror.example/simple"
    assert args["PIP_TRUSTED_HOST"] == f"127.0.0.1:{build_env.PORT}"

    def get(url: str) -> bytes:
        with urllib.request.urlopen(url, timeout=10) as response:
            body: bytes = response.read()
            return body

    with build_env.serving_args(served):
        assert b"pkg-1.0+cpu-py3-none-any.whl" in get(args["PIP_FIND_LINKS"])
        assert get(args["PIP_FIND_LINKS"] + "pkg-1.0%2Bcpu-py3-none-any.whl") == b"wheel"
        assert get(f"{base}/0/files/pkg-1.0.whl") == b"indexed"  # relative links work
        assert get(args["PIP_CONSTRAINT"]) == b"torch<=2.14.1\n"
        with pytest.raises(urllib.error.HTTPError):
            get(f"{base}/2/secret.conf")  # only the named file of that folder
        with pytest.raises(urllib.error.HTTPError):
            get(f"{base}/1/../../etc/secret.conf")


def test_base_versions_are_all_pinnable() -> None:
    # Constraints are written from these: every version must parse, and the first copy on
    # sys.path is the one held (the one the interpreter imports).
    found = install.base_versions()
    assert found["pip"] and all(re.fullmatch(r"[0-9][0-9A-Za-z.+!-]*", v) for v in found.values())
