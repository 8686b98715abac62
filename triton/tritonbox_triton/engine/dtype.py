"""The engine's number format: bfloat16 where the CPU computes it natively or linear_kernel.py's
products run (AVX2), float32 elsewhere.

At 135M parameters a decode step mostly streams weights through the cores, so halving their size
halves the step (measured: 16 rows 70 → 37 ms, one row 40 → 20 ms on 2 AVX512-BF16 cores).
Without native bf16 instructions PyTorch's own bfloat16 products are slower than float32; on an
AVX2 CPU linear_kernel.py computes the same sums faster than float32, so bfloat16 is taken there
too, and float32 only where neither runs.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import torch

log = logging.getLogger(__name__)
# /proc/cpuinfo flags of CPUs whose vector units compute bf16 dot products themselves.
NATIVE_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})
# Flags the engine treats as absent (comma-separated), so that one machine runs the kernels and
# checks of a CPU without them: the benchmarks' --emulate (scripts/benchmarks/emulation.py).
HIDE_FLAGS = "TRITONBOX_HIDE_CPU_FLAGS"


def hidden_flags() -> frozenset[str]:
    return frozenset(filter(None, os.environ.get(HIDE_FLAGS, "").replace(",", " ").split()))


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    try:
        text = cpuinfo.read_text()
    except OSError:  # not Linux: no flags known, so float32
        return frozenset()
    line = next((row for row in text.splitlines() if row.startswith("flags")), "")
    return frozenset(line.partition(":")[2].split()) - hidden_flags()


def engine_dtype(
    setting: str, flags: frozenset[str] | None = None, kernel_dir: Path | None = None
) -> torch.dtype:
    """CPU_DTYPE (`auto`, `bfloat16` or `float32`) as the dtype the engine runs in; `auto` on a
    CPU without native bfloat16 builds linear_kernel.py's products into `kernel_dir` to know."""
    if setting == "float32":
        return torch.float32
    if setting == "bfloat16":
        return torch.bfloat16
    if setting != "auto":
        raise ValueError(f"cpu_dtype must be auto, bfloat16 or float32, not {setting!r}")
    if NATIVE_BF16_FLAGS & (cpu_flags() if flags is None else flags):
        return torch.bfloat16
    from . import linear_kernel  # it imports this module

    return torch.float32 if linear_kernel.load(kernel_dir) is None else torch.bfloat16


def describe(setting: str, dtype: torch.dtype) -> str:
    """The start-up log line's words for the choice."""
    name = str(dtype).removeprefix("torch.")
    if setting != "auto":
        return f"{name} (CPU_DTYPE={setting})"
    found = sorted(NATIVE_BF16_FLAGS & cpu_flags())
    if found:
        return f"{name} (auto: CPU has {', '.join(found)})"
    if dtype == torch.bfloat16:
        from . import linear_kernel

        products = linear_kernel.current()
        if products is not None and products.own_order:
            return f"{name} (auto: no native bf16; AVX2 products, the model's own too)"
        return f"{name} (auto: no native bf16; AVX2 products with PyTorch's sums)"
    return f"{name} (auto: no native bf16)"
