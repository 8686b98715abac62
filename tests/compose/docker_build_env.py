"""This machine's pip settings as the images' build arguments (docs/deployment.md).

The Dockerfiles take the package index from the standard PIP_* variables (build arguments of
their deps stage) and an extra CA certificate from BUILD_CA_CERT. A build runs in a container:
host paths (find-links folders, file:// indexes, a constraints file) mean nothing there, so
they are served read-only over HTTP on the Docker bridge's gateway address for the duration
of the build, and the CA certificates the host trusts beyond pip's own bundle (a TLS-inspecting
proxy's) become BUILD_CA_CERT.

Run alone, it serves and prints the variables until interrupted:
    python3 tests/compose/docker_build_env.py      # then, in another shell: eval "$(...)" / export
"""

from __future__ import annotations

import functools
import http.server
import importlib
import os
import re
import shlex
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from urllib.parse import unquote, urlparse

PORT = 38917  # fixed: the URLs are build arguments, part of the layer cache key
CERT = re.compile(r"-----BEGIN CERTIFICATE-----.+?-----END CERTIFICATE-----", re.DOTALL)


def pip_settings() -> dict[str, str]:
    """`pip config list` merged with PIP_* variables (which win, as they do for pip)."""
    listed = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True
    ).stdout
    settings: dict[str, str] = {}
    for line in listed.splitlines():
        key, _, value = line.partition("=")
        settings[key.split(".", 1)[-1].strip()] = value.strip().strip("'\"")
    for key, value in os.environ.items():
        if key.startswith("PIP_"):
            settings[key[4:].lower().replace("_", "-")] = value
    return settings


def extra_ca_certificates(bundle: str) -> str:
    """Certificates in `bundle` that pip's own bundle lacks (a proxy's CA), PEM."""
    certifi = importlib.import_module("pip._vendor.certifi")
    known = {c.replace("\n", "") for c in CERT.findall(Path(certifi.where()).read_text())}
    return "\n".join(
        c for c in CERT.findall(Path(bundle).read_text()) if c.replace("\n", "") not in known
    )


class Served:
    """Host folders and files exposed under /0/, /1/, ... of one HTTP server."""

    def __init__(self, host: str) -> None:
        self.host = host
        self.paths: list[Path] = []
        self.files: set[Path] = set()  # the only files served from a file's folder

    def url(self, location: str, index_page: bool = False) -> str:
        path = Path(urlparse(location).path if location.startswith("file:") else location)
        if not path.exists():
            return location  # a URL already, or nothing to serve
        # An index (…/simple) links its files relative to itself (../../files/…): serve its
        # parent. A file is served from its folder, alone.
        root = path.parent if index_page or not path.is_dir() else path
        self.paths.append(root)
        prefix = f"http://{self.host}:{PORT}/{len(self.paths) - 1}/"
        if not path.is_dir():
            self.files.add(path)
            return prefix + path.name
        return prefix + (f"{path.name}/" if index_page else "")


def build_args(settings: dict[str, str], served: Served) -> dict[str, str]:
    args: dict[str, str] = {}
    for key in ("index-url", "extra-index-url", "find-links", "constraint"):
        if settings.get(key):
            urls = [served.url(item, key.endswith("index-url")) for item in settings[key].split()]
            args["PIP_" + key.upper().replace("-", "_")] = " ".join(urls)
    hosts = settings.get("trusted-host", "").split()
    if served.paths:
        hosts.append(f"{served.host}:{PORT}")  # plain HTTP on the bridge, never leaves the host
    if hosts:
        args["PIP_TRUSTED_HOST"] = " ".join(hosts)
    if settings.get("cert") and Path(settings["cert"]).is_file():
        extra = extra_ca_certificates(settings["cert"])
        if extra:
            args["BUILD_CA_CERT"] = extra
    return args


class _Handler(http.server.SimpleHTTPRequestHandler):
    def __init__(self, *args: object, served: Served, **kwargs: object) -> None:
        self.served = served
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]

    def translate_path(self, path: str) -> str:
        index, _, rest = path.lstrip("/").partition("/")
        roots = self.served.paths
        if not index.isdigit() or int(index) >= len(roots):
            return "/nonexistent"
        root = roots[int(index)].resolve()
        target = (root / unquote(rest.split("?")[0])).resolve()  # torch-X%2Bcpu-….whl
        files = {f.resolve() for f in self.served.files if f.parent.resolve() == root}
        allowed = target.is_relative_to(root) and (not files or target in files)
        return str(target) if allowed else "/nonexistent"

    def log_message(self, format: str, *args: object) -> None:
        pass  # pip fetches hundreds of pages


class _Server(http.server.ThreadingHTTPServer):
    def handle_error(self, request: object, client_address: object) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):  # pip gave up on a download
            super().handle_error(request, client_address)  # type: ignore[arg-type]


@contextmanager
def serving(host: str) -> Iterator[dict[str, str]]:
    """The build arguments for this machine's pip settings, served while the block runs."""
    served = Served(host)
    args = build_args(pip_settings(), served)
    with serving_args(served):
        yield args


@contextmanager
def serving_args(served: Served) -> Iterator[None]:
    """Serve what `served` names (nothing to do when it names nothing)."""
    if not served.paths:
        yield
        return
    handler = functools.partial(_Handler, served=served)
    server = _Server((served.host, PORT), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield
    finally:
        server.shutdown()
        server.server_close()


def bridge_gateway() -> str:
    """The default bridge's gateway: where build containers reach this host."""
    out = subprocess.run(
        [
            "docker",
            "network",
            "inspect",
            "bridge",
            "--format",
            "{{(index .IPAM.Config 0).Gateway}}",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    return out or "172.17.0.1"


def main() -> None:
    with serving(bridge_gateway()) as args:
        for key, value in args.items():
            print(f"export {key}={shlex.quote(value)}")
        print("# serving; Ctrl-C to stop", file=sys.stderr, flush=True)
        with suppress(KeyboardInterrupt):
            threading.Event().wait()


if __name__ == "__main__":
    main()
