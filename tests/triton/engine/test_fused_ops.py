"""The fused elementwise stages: built once per machine into their folder, and PyTorch's bits or
not used at all."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from tritonbox_testing.hardware import needs_bf16

from tritonbox_triton.engine import fused_build, fused_ops
from tritonbox_triton.engine.decode_step import DecodeStep
from tritonbox_triton.engine.fused_ops import LANES, FusedOps, rms_norm, rotary, swiglu


def _fresh(directory: Path) -> FusedOps | None:
    fused_ops.load.cache_clear()  # as a restarted engine would: a new process remembers
    fused_build.BUILT.clear()  # neither the loaded ops nor what building the library did
    return fused_ops.load(directory)


def test_built_once_into_its_folder_and_loaded_from_it_after(tmp_path: Path) -> None:
    ops = _fresh(tmp_path)
    assert ops is not None and ops.lanes in LANES
    assert ops.built.startswith("compiled in ") and str(tmp_path) in ops.built
    # Opened again by this process (the engine's dtype check, then its step): what this start did.
    assert fused_build.build_library(tmp_path)[1] == ops.built
    (library,) = tmp_path.glob("fused_ops-*.so")
    built = library.stat().st_mtime_ns
    again = _fresh(tmp_path)
    assert again is not None and again.built == f"cached in {tmp_path}"
    assert library.stat().st_mtime_ns == built, "a restart compiled it again"
    assert [path.name for path in tmp_path.iterdir()] == [library.name], "scratch files left"


def test_no_compiler_leaves_pytorchs_operations(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    with caplog.at_level(logging.WARNING, logger=fused_ops.__name__):
        assert _fresh(tmp_path / "kernels") is None
    assert "no C compiler" in caplog.text


@needs_bf16  # bfloat16 stages; the model is float32 elsewhere
def test_the_stages_give_pytorchs_bits_for_the_model(model: Any) -> None:
    ops = fused_ops.load()
    assert ops is not None
    step = DecodeStep(model, ops)
    assert step.fused is ops
    # Wide and tiny magnitudes, one row and a prefill's worth of them.
    generator = torch.Generator().manual_seed(3)
    for rows, scale in ((1, 1.0), (16, 300.0), (624, 1e-3)):
        hidden = (torch.randn(rows, 576, generator=generator) * scale).bfloat16()
        delta = torch.randn(rows, 576, generator=generator).bfloat16()
        expected_hidden = hidden + delta
        weight = step.layers[0].post_norm
        normed = ops.add_rms_norm(hidden, delta, weight, step.eps)
        assert torch.equal(hidden, expected_hidden)
        assert torch.equal(normed, rms_norm(expected_hidden, weight, step.eps))
        qkv = torch.randn(rows, 960, generator=generator).bfloat16()
        positions = torch.randint(0, 2048, (rows,), generator=generator)
        roped = ops.rope(qkv, 12, *step._tables[None], positions)
        cos, sin = step.rotary(positions)
        assert torch.equal(roped, rotary(qkv[:, :768].view(rows, 12, 64), cos, sin))


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_silu_gives_pytorchs_bits_on_every_path(threads: int) -> None:
    """SiLU · up at the model's width and at widths whose rows end in ATen's scalar tail (and
    the C pass's), over as many rows as a step or a prefill has, with ATen's threads cutting
    the rows into chunks at other places (which values take which of its two exp paths moves
    with them)."""
    ops = fused_ops.load()
    assert ops is not None
    generator = torch.Generator().manual_seed(5)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for rows in (1, 16, 37, 624):
            for width in (1536, 1536 + 33, 100):
                scale = torch.exp2(torch.randint(-8, 9, (rows, 2 * width), generator=generator))
                gate_up = (torch.randn(rows, 2 * width, generator=generator) * scale).bfloat16()
                fused = ops.silu_mul(gate_up, width)
                assert torch.equal(fused, swiglu(gate_up, width)), (rows, width)
    finally:
        torch.set_num_threads(before)


@needs_bf16  # bfloat16 stages; the model is float32 elsewhere
def test_a_silu_table_off_in_one_value_is_caught(model: Any) -> None:
    """The check can fail: with one value's SiLU in the table off by its last bit."""
    ops = fused_ops.load()
    assert ops is not None
    other = FusedOps(ops.library, ops.lanes, vector_exp=ops.vector_exp)
    bits = int(torch.tensor([1.5], dtype=torch.bfloat16).view(torch.int16)) & 0xFFFF
    other.table(F.silu).view(torch.int16)[bits] += 1
    assert not other.silu_agrees(1536)
    assert ops.silu_agrees(1536)
    step = DecodeStep(model, other)  # the other stages still fused, SiLU·up as PyTorch's
    assert step.fused is other and not step.fused_silu
    assert step.describe().split(" (")[0].endswith("stages: norms, RoPE and cache writes")


def test_a_sum_in_another_order_is_caught(model: Any) -> None:
    """The check can fail: summed at the other vector width, the norms round otherwise."""
    ops = fused_ops.load()
    assert ops is not None
    other = FusedOps(ops.library, next(lanes for lanes in LANES if lanes != ops.lanes))
    step = DecodeStep(model)
    assert not other.agrees(step.final_norm, step.eps, step.heads, step.kv_heads,
                            step._tables[None][0][:256], step._tables[None][1][:256])  # fmt: skip
    assert DecodeStep(model, other).fused is None
