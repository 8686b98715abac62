"""Building the engine's C library (fused_ops.c, attention_kernel.c, logits_kernel.c,
linear_kernel.c, amx_linear.c) for this machine, and loading it into this process.

The library is compiled for this machine (`-march=native`) into a cache folder, named by a hash
of its source, flags and CPU, so a restart loads it in milliseconds; a cold compile takes about
half a second and is logged. It is linked with OpenMP: the libgomp torch has already loaded (the
same soname), so its parallel passes run on torch's own workers; `libgomp_paths` lets the loader
check that no second runtime came with it.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import torch

from .dtype import cpu_flags, hidden_flags

log = logging.getLogger(__name__)

SOURCES = tuple(
    Path(__file__).with_name(name)
    for name in (
        "fused_ops.c",
        "attention_kernel.c",
        "logits_kernel.c",
        "linear_kernel.c",
        "amx_linear.c",
    )
)
HEADERS = tuple(Path(__file__).with_name(name) for name in ("bf16.h", "amx.h"))
FLAGS = ("-O3", "-march=native", "-ffp-contract=off", "-fopenmp", "-shared", "-fPIC")
LIBRARIES = ("-lm",)  # after the source: a linker that drops unneeded libraries keeps them
VECTOR_EXP = "Sleef_expf16_u10"  # what ATen's AVX-512 Vectorized<float>::exp() calls
# GCC's switches for the /proc/cpuinfo flags a build may be told to do without (dtype.HIDE_FLAGS):
# `-march=native` would otherwise compile them in.
NO_ISA = {"avx512f": "-mno-avx512f", "avx512_bf16": "-mno-avx512bf16",
          "avx512_fp16": "-mno-avx512fp16", "amx_bf16": "-mno-amx-bf16",
          "amx_tile": "-mno-amx-tile", "amx_int8": "-mno-amx-int8"}  # fmt: skip


def flags() -> tuple[str, ...]:
    """The compiler's flags: `FLAGS`, less the instructions of hidden CPU flags."""
    return FLAGS + tuple(NO_ISA[flag] for flag in sorted(hidden_flags() & NO_ISA.keys()))


def default_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tritonbox/kernels"


# What building each library did in this process: the engine opens it more than once at start
# (linear_kernel.py for the dtype, then fused_ops.py), and the ready line should say whether this
# start compiled it, not that the second opening found it.
BUILT: dict[Path, str] = {}


def build_library(directory: Path) -> tuple[Path, str]:
    """The compiled library in `directory`, compiled there first unless a build of this source
    with these flags for this CPU already is; and which of the two happened at its first
    opening in this process, in words."""
    compiler = shutil.which(os.environ.get("CC", "cc"))
    if compiler is None:
        raise FileNotFoundError("no C compiler (cc) on PATH")
    texts = [path.read_bytes() for path in SOURCES + HEADERS]
    key = hashlib.sha256(b"\0".join([*texts, *map(str.encode, flags() + LIBRARIES),
                                     " ".join(sorted(cpu_flags())).encode()]))  # fmt: skip
    library = directory / f"fused_ops-{key.hexdigest()[:16]}.so"
    if library.exists():
        return library, BUILT.setdefault(library, f"cached in {directory}")
    directory.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(dir=directory) as scratch:  # no half-written library
        output = Path(scratch) / library.name
        subprocess.run([compiler, *flags(), "-o", str(output), *map(str, SOURCES), *LIBRARIES],
                       check=True, capture_output=True, text=True)  # fmt: skip
        os.replace(output, library)
    built = f"compiled in {time.monotonic() - started:.1f} s (cold), cached in {directory}"
    log.info("fused ops: %s", built)
    BUILT[library] = built
    return library, built


def open_library(directory: Path | None = None) -> tuple[ctypes.CDLL, str]:
    """The library built into `directory` (default: the user's cache), loaded, and how it came
    to be (`build_library`). Raises OSError where it cannot be built or loaded, or where loading
    it brought a second OpenMP runtime (a second team of workers: more threads than cores)."""
    try:
        path, built = build_library(directory or default_dir())
    except subprocess.CalledProcessError as error:
        raise OSError(error.stderr or str(error)) from error
    libgomp = libgomp_paths()
    library = ctypes.CDLL(str(path))
    if libgomp_paths() != libgomp:
        raise OSError("loading it brought another libgomp")
    return library, built


def libgomp_paths() -> set[str]:
    """The OpenMP runtimes mapped into this process (torch's own, once torch is imported)."""
    maps = Path("/proc/self/maps").read_text().splitlines()
    return {line.split()[-1] for line in maps if "libgomp" in line.rsplit("/", 1)[-1]}


def vector_exp(name: str = VECTOR_EXP) -> int | None:
    """The address of the exp ATen's AVX-512 kernels call (`name`), where ATen runs those
    kernels."""
    if torch.backends.cpu.get_cpu_capability() != "AVX512":
        return None
    try:
        torch_cpu = ctypes.CDLL(str(Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"))
        address: int | None = ctypes.cast(getattr(torch_cpu, name), ctypes.c_void_p).value
    except (OSError, AttributeError):
        return None
    return address
