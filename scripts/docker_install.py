"""The one install step of every TritonBox image (run by the Dockerfiles with the base image's
own Python; standard library only, Python 3.11+).

`deps` installs a service's pinned requirements into a separate prefix (/opt/tritonbox/deps),
in a build stage of its own: the package-index settings (PIP_* build arguments, an extra CA)
exist only there, so they never reach the final image or its history. `--keep-installed` (the
GPU image) holds every distribution the base image already has at its version: NVIDIA's
TensorRT-LLM stack stays exactly as shipped, and only what is missing is added.

`models` adds packages that ship a model (the cpu image's MODEL_REQUIREMENTS) to that prefix,
in a layer after it.

`wheels` builds TritonBox's own distributions (setuptools from the deps stage, no index) in a
stage of its own, so the api and playground images carry no build tools. `project` runs in the
final stage: it installs those wheels, or source folders (the Triton images: an editable
tritonbox-triton keeps the model templates next to the package), hooks the prefix into the
base interpreter with a `.pth` file and runs `pip check`. The `.pth` appends the prefix *after*
the interpreter's own site-packages: the base image's packages win, and Triton's Python backend
stub, an isolated interpreter that ignores PYTHONPATH, still sees the project, because `.pth`
files are read in isolated mode too.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import os
import re
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?\s*==\s*([^\s;#]+)(.*)$")
PTH = "zz-tritonbox.pth"  # read after the base's own .pth files
SETUPTOOLS = "setuptools==84.2.1"
BUILD_TOOLS = "/opt/tritonbox-build-tools"  # outside /opt/tritonbox, which the images copy
BASE_CHECK = Path("/opt/tritonbox/pip-check.base")  # the base image's own `pip check`
NO_DEPS = Path("/opt/tritonbox/no-deps.txt")  # distributions installed without dependencies


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(path: Path) -> list[str]:
    """The requirement lines of `path`, `-r` includes followed, comments dropped."""
    lines: list[str] = []
    for raw in path.read_text().splitlines():
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("-r "):
            lines += pins(path.parent / line[3:].strip())
        else:
            lines.append(line)
    return lines


def rewrite(lines: list[str], installed: dict[str, str], cpu_torch: bool) -> list[str]:
    """Pins with the base image's versions for what it has; torch pinned to its CPU build."""
    out = []
    for line in lines:
        match = NAME.match(line)
        if match is None:
            out.append(line)
            continue
        name, extras, version, rest = match.groups()
        version = installed.get(canonical(name), version)
        if cpu_torch and canonical(name) == "torch" and "+" not in version:
            # Exact local version: the multi-GB CUDA build of the same number can never match.
            version += "+cpu"
        out.append(f"{name}{extras or ''}=={version}{rest}")
    return out


def pip(*args: str, env: dict[str, str] | None = None) -> None:
    command = [sys.executable, "-m", "pip", *args]
    print("+", " ".join(command), flush=True)
    subprocess.run(command, check=True, env=env)


def pip_environment(workdir: Path) -> dict[str, str]:
    """os.environ, plus PIP_CERT for BUILD_CA_CERT (a TLS-inspecting proxy's CA, PEM text)."""
    env = dict(os.environ, PIP_NO_CACHE_DIR="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    extra = env.pop("BUILD_CA_CERT", "").strip()
    if extra and "PIP_CERT" not in env:
        certifi = importlib.import_module("pip._vendor.certifi")  # pip's own default bundle
        bundle = workdir / "ca-bundle.pem"
        bundle.write_text(Path(certifi.where()).read_text() + "\n" + extra + "\n")
        env["PIP_CERT"] = str(bundle)
    return {key: value for key, value in env.items() if not (key.startswith("PIP_") and not value)}


def base_versions() -> dict[str, str]:
    """What the base interpreter has, by name: the versions pip can pin (Ubuntu's own python3-*
    packages may carry versions such as 2.7.7ubuntu4 that no constraint can name; pip leaves
    those alone anyway, as nothing of ours requires them)."""
    version = importlib.import_module("pip._vendor.packaging.version")
    found: dict[str, str] = {}
    for dist in importlib.metadata.distributions():
        try:
            version.Version(dist.version)
        except version.InvalidVersion:
            print(f"not held (not a PEP 440 version): {dist.metadata['Name']} {dist.version}")
            continue
        found.setdefault(canonical(dist.metadata["Name"]), dist.version)  # first on sys.path
    return found


def deps(args: argparse.Namespace) -> None:
    installed = base_versions() if args.keep_installed else {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        env = pip_environment(work)
        lines = [line for name in args.requirements for line in pins(Path(name))]
        requirements = work / "requirements.txt"
        requirements.write_text("\n".join(rewrite(lines, installed, args.cpu_torch)) + "\n")
        options = ["install", "--prefix", args.prefix, "--no-warn-script-location"]
        if args.no_compile:
            options.append("--no-compile")
        if installed:
            # Never a second copy of anything the base has, not even as a dependency.
            held = work / "held.txt"
            held.write_text("".join(f"{n}=={v}\n" for n, v in sorted(installed.items())))
            options += ["-c", str(held)]
        if args.extra_index_url:
            options += ["--extra-index-url", args.extra_index_url]
        pip(*options, "-r", str(requirements), env=env)
        if args.no_deps:
            pip(*options, "--no-deps", *(f"-r{n}" for n in args.no_deps), env=env)
            names = [NAME.match(line) for name in args.no_deps for line in pins(Path(name))]
            NO_DEPS.write_text("".join(f"{canonical(m.group(1))}\n" for m in names if m))
        # What builds the project's own distributions later, without an index; kept out of the
        # prefix, so out of the images that install wheels (the api and the playground).
        pip("install", "--target", BUILD_TOOLS, "--no-compile", SETUPTOOLS, env=env)
    strip(Path(args.prefix), args.drop)
    # What the base image itself already reports, so that the final check fails on what the
    # project adds, not on a conflict the base shipped with (NVIDIA's image is not ours to fix).
    BASE_CHECK.parent.mkdir(parents=True, exist_ok=True)
    BASE_CHECK.write_text("\n".join(check_problems()) + "\n")


def models(args: argparse.Namespace) -> None:
    """Packages that ship a model (the cpu image's MODEL_REQUIREMENTS), added to the prefix that
    `deps` made, in a layer of their own: without dependencies (the file lists every package the
    model needs), and named among the no-deps distributions for the final `pip check`."""
    with tempfile.TemporaryDirectory() as tmp:
        env = pip_environment(Path(tmp))
        options = ["install", "--prefix", args.prefix, "--no-warn-script-location", "--no-deps"]
        pip(*options, "-r", args.requirement, env=env)
    names = [NAME.match(line) for line in pins(Path(args.requirement))]
    with NO_DEPS.open("a") as listed:
        listed.write("".join(f"{canonical(m.group(1))}\n" for m in names if m))


def strip(prefix: Path, drop: list[str]) -> None:
    """Drop what no service runs: the test suites some wheels ship, and `drop` (globs)."""
    for site in site_dirs(prefix):
        for pattern in ["numpy/**/tests", "pandas/**/tests", *drop]:
            doomed = list(site.glob(pattern))
            for path in doomed:
                subprocess.run(["rm", "-rf", str(path)], check=True)
            print(f"- {pattern}: {len(doomed)} removed", flush=True)


def site_dirs(prefix: Path) -> list[Path]:
    # Debian and Ubuntu interpreters use .../local/lib/pythonX.Y/dist-packages for a prefix.
    return sorted({p for p in prefix.glob("**/python3*/*-packages") if p.is_dir()})


def replace_base_copies(sites: list[Path], allowed: bool) -> None:
    """Remove the base interpreter's own copy of what the prefix also holds (pip replaced it
    in the deps stage, e.g. a newer setuptools that torch requires): the prefix comes after the
    base on sys.path, so the older copy would win. Refused with --keep-installed (GPU)."""
    ours = {
        canonical(d.metadata["Name"])
        for d in importlib.metadata.distributions(path=list(map(str, sites)))
    }
    base = {canonical(d.metadata["Name"]) for d in importlib.metadata.distributions()}
    for name in sorted(ours & base):
        if not allowed:
            raise SystemExit(f"docker_install: the prefix holds a second {name} (--keep-installed)")
        pip("uninstall", "--yes", name)


def check_problems() -> list[str]:
    """`pip check`'s complaints, one per line (none: an empty list)."""
    command = [sys.executable, "-m", "pip", "check"]
    print("+", " ".join(command), flush=True)
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode == 0:
        return []
    return [line for line in result.stdout.splitlines() if line.strip()] or [result.stderr]


def pth_lines(sites: list[Path]) -> str:
    # addsitedir, not a bare path: the prefix's own .pth files (editable installs) run too.
    return "".join(f"import site; site.addsitedir({str(s)!r})\n" for s in sites)


def build_environment() -> dict[str, str]:
    if not Path(BUILD_TOOLS).is_dir():
        raise SystemExit(f"docker_install: {BUILD_TOOLS} (from the deps stage) is missing")
    return dict(os.environ, PYTHONPATH=BUILD_TOOLS)


def wheels(args: argparse.Namespace) -> None:
    options = ["wheel", "--no-deps", "--no-index", "--no-build-isolation", "-w", args.out]
    pip(*options, *args.folders, env=build_environment())


def project(args: argparse.Namespace) -> None:
    sites = site_dirs(Path(args.prefix))
    if not sites:
        raise SystemExit(f"docker_install: nothing installed under {args.prefix}")
    replace_base_copies(sites, allowed=not args.keep_installed)
    purelib = Path(sysconfig.get_paths()["purelib"])
    purelib.mkdir(parents=True, exist_ok=True)
    (purelib / PTH).write_text(pth_lines(sites))
    # Wheels (built in a stage of their own) or source folders; no index either way.
    options = ["install", "--prefix", args.prefix, "--no-deps", "--no-index", "--no-cache-dir"]
    options += ["--no-build-isolation", "--no-warn-script-location"]
    sources, folders = [], []
    for item in args.items:
        if item in args.editable:
            sources += ["-e", item]
        elif Path(item, "pyproject.toml").is_file():
            sources.append(item)
        elif Path(item).is_dir():  # a folder of wheels
            sources += sorted(str(wheel) for wheel in Path(item).glob("*.whl"))
            continue
        else:
            sources.append(item)
            continue
        folders.append(item)
    pip(*options, *sources, env=build_environment() if folders else None)
    for folder in folders:
        for build in (Path(folder) / "build", *Path(folder).glob("*.egg-info")):
            subprocess.run(["rm", "-rf", str(build)], check=True)
    base = set(BASE_CHECK.read_text().splitlines()) if BASE_CHECK.is_file() else set()
    # Installed with --no-deps on purpose (the default model's package: its dependencies are an
    # unrelated CLI): pip check's "requires X, which is not installed" about them is expected.
    no_deps = NO_DEPS.read_text().split() if NO_DEPS.is_file() else []
    problems = [
        line
        for line in check_problems()
        if not (canonical(line.split(" ")[0]) in no_deps and line.endswith("is not installed."))
    ]
    for line in sorted(set(problems) & base):
        print(f"pip check (already so in the base image): {line}", flush=True)
    added = [line for line in problems if line not in base]
    if added:
        raise SystemExit("pip check: " + "\n".join(added))
    print("pip check: nothing broken beyond what the base image itself reports", flush=True)
    # Installed with --no-compile (smaller images): byte-compile what the service imports, by
    # importing it, as root; modules it never loads (most of transformers) stay source only.
    for module in (m for group in args.warm_import for m in group.split(",")):
        print(f"+ import {module}", flush=True)
        subprocess.run([sys.executable, "-c", f"import {module}"], check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    d = commands.add_parser("deps", help="install pinned requirements into the prefix")
    d.add_argument("--prefix", required=True)
    d.add_argument("-r", "--requirement", dest="requirements", action="append", required=True)
    d.add_argument("--no-deps", action="append", default=[], help="requirements without deps")
    d.add_argument("--keep-installed", action="store_true")
    d.add_argument("--cpu-torch", action="store_true")
    d.add_argument("--no-compile", action="store_true", help="no .pyc (see --warm-import)")
    d.add_argument("--drop", action="append", default=[], help="glob in site-packages to delete")
    m = commands.add_parser("models", help="add packages that ship a model, without deps")
    m.add_argument("--prefix", required=True)
    m.add_argument("-r", "--requirement", required=True)
    w = commands.add_parser("wheels", help="build wheels of the project's folders")
    w.add_argument("--out", required=True)
    w.add_argument("folders", nargs="+")
    d.add_argument("--extra-index-url", default="")
    p = commands.add_parser("project", help="install TritonBox's distributions, then pip check")
    p.add_argument("--prefix", required=True)
    p.add_argument("--editable", action="append", default=[])
    p.add_argument("--keep-installed", action="store_true", help="the base's copies stay")
    p.add_argument("--warm-import", action="append", default=[], help="modules (a,b) to compile")
    p.add_argument("items", nargs="+", help="source folders, wheels or folders of wheels")
    args = parser.parse_args()
    {"deps": deps, "models": models, "wheels": wheels, "project": project}[args.command](args)


if __name__ == "__main__":
    main()
