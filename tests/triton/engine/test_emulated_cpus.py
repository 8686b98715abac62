"""The engine's paths for older CPUs, run on this one: test files below run again in a process
told to do without the newer instructions (scripts/benchmarks/emulation.py: the engine's checks
and kernel build, PyTorch's and oneDNN's dispatch). On a CPU with native bfloat16 the engine
never takes linear_kernel.py's products otherwise: the AVX2 ones with PyTorch's bits, and on
AVX-512 without bfloat16 the same products in their own order, given to the model too."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from tritonbox_testing.repo_scripts import REPO, script_module

from tritonbox_triton.engine.dtype import NATIVE_BF16_FLAGS, cpu_flags

emulation = script_module("scripts.benchmarks.emulation")
ENGINE = "tests/triton/engine"
# per kind: the instruction it keeps (so this CPU must have it), and the files run there
RUNS = {
    "avx2": ("avx2", ["test_linear_kernel.py", "test_decode_step.py"]),
    "avx512": (
        "avx512f",
        [
            "test_linear_kernel.py",
            "test_own_order_products.py",
            "test_decode_step.py",
            "test_families.py",
        ],
    ),
}
# Tests that must run (not skip) under each kind: the products' own.
MUST_RUN = {"avx2": "test_linear_kernel.py", "avx512": "test_own_order_products.py"}


@pytest.mark.parametrize("kind", sorted(RUNS))
def test_an_older_cpus_engine_paths_pass_here(kind: str, tmp_path: os.PathLike[str]) -> None:
    needs, files = RUNS[kind]
    if needs not in cpu_flags() or not NATIVE_BF16_FLAGS & cpu_flags():
        pytest.skip(f"this CPU lacks {needs}, or is such a CPU itself (the plain run tests it)")
    env = os.environ | emulation.environment(kind) | {"XDG_CACHE_HOME": str(tmp_path)}
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rs",
               *(f"{ENGINE}/{name}" for name in files)]  # fmt: skip
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    tail = done.stdout[-4000:] + done.stderr[-2000:]
    assert done.returncode == 0, tail
    assert re.search(r"\d+ passed", done.stdout), tail
    skipped = [line for line in done.stdout.splitlines() if line.startswith("SKIPPED")]
    assert not [line for line in skipped if MUST_RUN[kind] in line], tail
