"""`python -m tritonbox_triton serve` as the containers run it, in a subprocess, with stand-ins
for what only a GPU machine has: `tritonserver` (answers readiness), `mpirun` (starts each
`:`-separated rank) and `nvidia-smi` (lists N GPUs)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

FAKE_TRITONSERVER = """\
import http.server, os, signal, sys, time
print("fake tritonserver", " ".join(sys.argv[1:]), flush=True)
args = dict(a[2:].split("=", 1) for a in sys.argv[1:] if "=" in a)
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
if args.get("allow-http") == "false":  # a rank > 0: serves nothing
    while True:
        time.sleep(1)
class Ready(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", int(args["http-port"])), Ready).serve_forever()
"""

# Starts every rank of `mpirun [opts] -n 1 CMD… : -n 1 CMD…` and forwards SIGTERM to them.
FAKE_MPIRUN = """\
import signal, subprocess, sys
words = [w for w in sys.argv[1:] if w != "--allow-run-as-root"]
ranks, current = [], []
for word in words + [":"]:
    if word == ":":
        ranks.append(current[2:])  # drop "-n 1"
        current = []
    else:
        current.append(word)
print(f"fake mpirun: {len(ranks)} ranks", flush=True)
children = [subprocess.Popen(rank) for rank in ranks]
signal.signal(signal.SIGTERM, lambda *_: [c.terminate() for c in children])
sys.exit(max(c.wait() for c in children))
"""


def install_fakes(bin_dir: Path, gpus: int) -> Path:
    """Fake tritonserver, mpirun and nvidia-smi in `bin_dir`; returns the tritonserver path."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    scripts = {
        "tritonserver": f"#!{sys.executable}\n{FAKE_TRITONSERVER}",
        "mpirun": f"#!{sys.executable}\n{FAKE_MPIRUN}",
        "nvidia-smi": "#!/bin/sh\n"
        + "".join(f"echo 'GPU {i}: NVIDIA H100 (UUID: GPU-{i})'\n" for i in range(gpus)),
    }
    for name, text in scripts.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    return bin_dir / "tritonserver"


def serve_environment(settings: dict[str, str], path_first: Path | None = None) -> dict[str, str]:
    """This environment without any TritonBox setting, plus `settings` (upper-case keys)."""
    from tritonbox_triton.settings import TritonSettings

    names = {name.upper() for name in TritonSettings.model_fields} | {"HF_TOKEN"}
    env = {k: v for k, v in os.environ.items() if k not in names}
    if path_first is not None:
        env["PATH"] = f"{path_first}{os.pathsep}{env.get('PATH', '')}"
    return env | {"PYTHONSAFEPATH": "1"} | settings


@contextlib.contextmanager
def serving(env: dict[str, str], workdir: Path, timeout_s: float = 120) -> Iterator[list[str]]:
    """Run `serve` until it prints that Triton is ready; yields its output lines so far."""
    process = subprocess.Popen(
        [sys.executable, "-m", "tritonbox_triton", "serve", "--env-file", str(workdir / "none")],
        env=env,
        cwd=workdir,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    assert process.stdout is not None
    lines: list[str] = []
    deadline = time.monotonic() + timeout_s
    try:
        for line in process.stdout:
            lines.append(line.rstrip())
            if line.startswith("Triton is ready") or time.monotonic() > deadline:
                break
        assert any(line.startswith("Triton is ready") for line in lines), "\n".join(lines)
        yield lines
        process.send_signal(signal.SIGTERM)
        assert process.wait(60) == 0, "\n".join(lines + process.stdout.read().splitlines())
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
