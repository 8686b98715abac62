"""What this machine's CPU runs natively, for the tests of paths the engine takes only there.

The engine runs bfloat16 where the CPU computes it natively, or where it has AVX2 and
linear_kernel.py's products give PyTorch's bits (engine/dtype.py), and float32 elsewhere; it
builds its compiled attention only for AVX-512 (attention_kernel.c). Tests of a bfloat16 path
skip where the engine runs float32, naming why; everything the engine does on that CPU is still
tested.
"""

from __future__ import annotations

import pytest
import torch

from tritonbox_triton.engine.dtype import NATIVE_BF16_FLAGS, cpu_flags, engine_dtype

NATIVE_BF16 = bool(NATIVE_BF16_FLAGS & cpu_flags())
BF16 = engine_dtype("auto") == torch.bfloat16  # natively, or with AVX2's products
AVX512 = "avx512f" in cpu_flags()

needs_bf16 = pytest.mark.skipif(
    not BF16,
    reason=f"no native bfloat16 on this CPU (none of {', '.join(sorted(NATIVE_BF16_FLAGS))}) "
    "and no AVX2 products: the engine runs float32 here",
)
needs_avx512 = pytest.mark.skipif(
    not AVX512, reason="no AVX-512 on this CPU: the compiled stages and attention are not built"
)
