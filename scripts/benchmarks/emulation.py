"""Both servers run as on a CPU without some of this one's instructions (`--emulate KIND`).

The engine picks its dtype and kernels from the CPU (dtype.py); a session gets whichever machine
it gets. To measure the paths of an older CPU on a newer one, each side is told to do without:
TritonBox's engine through `TRITONBOX_HIDE_CPU_FLAGS` (its checks and its kernels' build),
PyTorch through `ATEN_CPU_CAPABILITY`, oneDNN through `ONEDNN_MAX_CPU_ISA`, and vLLM, which asks
`torch.cpu` what the hardware has before it picks its kernels, through a `sitecustomize` that
gives it the emulated answers. The instructions are emulated, the machine is not: its caches,
memory and clock stay this one's, so a page says which rows were emulated and on what.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tritonbox_triton.engine.dtype import HIDE_FLAGS, cpu_flags


@dataclass(frozen=True)
class Kind:
    hidden: tuple[str, ...]  # /proc/cpuinfo flags (prefixes) the engine is told are absent
    aten: str  # ATEN_CPU_CAPABILITY
    onednn: str  # ONEDNN_MAX_CPU_ISA
    torch_cpu: tuple[str, ...]  # torch.cpu's answers that vLLM is given as False


KINDS = {
    # An AMD EPYC with AVX2 only (Zen 2).
    "avx2": Kind(("avx512", "amx", "avx_vnni"), "avx2", "AVX2",
                 ("_is_avx512_supported", "_is_avx512_bf16_supported",
                  "_is_avx512_vnni_supported", "_is_amx_tile_supported")),
    # An Intel Xeon with AVX-512 and VNNI, no bfloat16 (Cascade Lake).
    "avx512": Kind(("avx512_bf16", "avx512_fp16", "amx"), "avx512", "AVX512_CORE_VNNI",
                   ("_is_avx512_bf16_supported", "_is_amx_tile_supported")),
}  # fmt: skip
_SITE = """import torch.cpu
for _name in {names!r}:
    setattr(torch.cpu, _name, lambda: False)
"""
VLLM_PATH = "TRITONBOX_EMULATED_VLLM_PATH"  # the sitecustomize's folder, for start_vllm
# The widest vector unit the engine's products use, by the flag that has it, best first.
UNITS = (("amx_bf16", "AMX"), ("avx512_bf16", "AVX512-BF16"), ("avx512f", "AVX-512"),
         ("avx2", "AVX2"))  # fmt: skip


def widest_unit(flags: frozenset[str]) -> str:
    """The best of `UNITS` among `flags`, in words."""
    return next((name for flag, name in UNITS if flag in flags), "no AVX2")


def environment(kind: str) -> dict[str, str]:
    """The variables that make TritonBox's engine, PyTorch and oneDNN run as on `kind`."""
    spec = KINDS[kind]
    hidden = sorted(flag for flag in cpu_flags() if flag.startswith(spec.hidden))
    return {HIDE_FLAGS: ",".join(hidden), "ATEN_CPU_CAPABILITY": spec.aten,
            "ONEDNN_MAX_CPU_ISA": spec.onednn}  # fmt: skip


def apply(kind: str) -> str:
    """Set this process's environment (its children inherit it) for `kind`, vLLM's included,
    before torch has run an operation; what the rows' CPU column adds."""
    real = cpu_flags()
    site = Path(tempfile.mkdtemp(prefix="tritonbox-emulate-"))
    (site / "sitecustomize.py").write_text(_SITE.format(names=KINDS[kind].torch_cpu))
    os.environ |= environment(kind) | {VLLM_PATH: str(site)}
    return f"emulated on {widest_unit(real)}"


def vllm_environment() -> dict[str, str]:
    """What vLLM's environment adds under `apply` (its sitecustomize), else nothing."""
    site = os.environ.get(VLLM_PATH)
    if not site:
        return {}
    return {"PYTHONPATH": os.pathsep.join(filter(None, [site, os.environ.get("PYTHONPATH")]))}
