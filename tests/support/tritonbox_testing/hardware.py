"""What this machine's CPU runs natively, for the tests of paths the engine takes only there.

The engine picks bfloat16 only where the CPU computes it (engine/dtype.py) and builds its
compiled stages and attention only for AVX-512 (fused_ops.c, attention_kernel.c). On an AVX2
CPU it runs float32 and PyTorch's operations; the bit-for-bit checks of its bfloat16 paths then
have nothing of the engine's to check (PyTorch emulates bfloat16 there, and its emulated
kernels round otherwise than the forward's, which is why the engine declines them: family.py).
Those tests skip there, naming the flag; everything the engine does on that CPU is still tested.
"""

from __future__ import annotations

import pytest
import torch

from tritonbox_triton.engine.dtype import NATIVE_BF16_FLAGS, cpu_flags, engine_dtype

NATIVE_BF16 = engine_dtype("auto") == torch.bfloat16
AVX512 = "avx512f" in cpu_flags()

needs_native_bf16 = pytest.mark.skipif(
    not NATIVE_BF16,
    reason=f"no native bfloat16 on this CPU (none of {', '.join(sorted(NATIVE_BF16_FLAGS))}): "
    "the engine runs float32 here",
)
needs_avx512 = pytest.mark.skipif(
    not AVX512, reason="no AVX-512 on this CPU: the compiled stages and attention are not built"
)
