"""The q/k norms with RoPE and the cache writes as one pass (fused_qk_norm.py): transformers' own
Qwen3RMSNorm and Gemma3RMSNorm, then its RoPE, bit for bit, at the head shapes of those families'
checkpoints; refused, and PyTorch's operations run, where its start-up check finds other bits."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from transformers.models.gemma3.modeling_gemma3 import Gemma3RMSNorm
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb
from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm
from tritonbox_testing.families import build
from tritonbox_testing.hardware import needs_bf16

from tritonbox_triton.engine.attention import load_model
from tritonbox_triton.engine.decode_step import DecodeStep
from tritonbox_triton.engine.fused_ops import load as load_fused_ops
from tritonbox_triton.engine.fused_qk_norm import QKNormRope

EPS = 1e-6
POSITIONS = 2048


def _tables(dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Llama's default RoPE tables in bfloat16 [positions, dim], as its rotary embedding's."""
    inverse = 1.0 / (10_000 ** (torch.arange(0, dim, 2).float() / dim))
    angles = torch.arange(POSITIONS).float()[:, None] * inverse[None]
    both = torch.cat([angles, angles], -1)
    return both.cos().bfloat16(), both.sin().bfloat16()


def _norms(gemma: bool, dim: int, generator: torch.Generator) -> list[Qwen3RMSNorm | Gemma3RMSNorm]:
    """A q and a k norm as the family's model has them, with random weights."""
    made: list[Qwen3RMSNorm | Gemma3RMSNorm] = []
    for _ in "qk":
        norm = Gemma3RMSNorm(dim, eps=EPS) if gemma else Qwen3RMSNorm(dim, eps=EPS)
        with torch.no_grad():
            norm.weight.copy_(torch.randn(dim, generator=generator) * 0.3 + (0.0 if gemma else 1.0))
        made.append(norm.to(torch.bfloat16))
    return made


# (heads, kv heads, head dim): Qwen3-0.6B and -8B's, Gemma 3 270M's and 1B's, SmolLM2's shape.
SHAPES = [(16, 8, 128), (32, 8, 128), (4, 1, 256), (9, 3, 64)]


@pytest.mark.parametrize("gemma", [False, True], ids=["qwen3", "gemma3"])
@pytest.mark.parametrize("shape", SHAPES, ids=[f"{h}x{k}x{d}" for h, k, d in SHAPES])
@pytest.mark.parametrize("threads", [1, 2])
def test_the_pass_is_transformers_norms_and_rope_bit_for_bit(
    gemma: bool, shape: tuple[int, int, int], threads: int
) -> None:
    heads, kv_heads, dim = shape
    ops = load_fused_ops()
    assert ops is not None, "no fused ops on this machine: fused_ops.py's log says why"
    generator = torch.Generator().manual_seed(heads * dim + gemma)
    q_norm, k_norm = _norms(gemma, dim, generator)
    qk = QKNormRope(ops, heads, kv_heads, EPS, gemma, [(q_norm.weight, k_norm.weight)])
    cos, sin = _tables(dim)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        # A decode step's rows, with its cache writes, and a prefill's (shared among the
        # threads), magnitudes spread over 2^±8.
        for rows in (2, 7, 300):
            width = (heads + 2 * kv_heads) * dim
            spread = torch.exp2(torch.randint(-8, 9, (rows, width), generator=generator))
            qkv = (torch.randn(rows, width, generator=generator) * spread).bfloat16()
            at = torch.randint(0, POSITIONS, (rows,), generator=generator)
            roped = qk(qkv, 0, cos, sin, at)
            split = qkv.view(rows, 1, heads + 2 * kv_heads, dim).transpose(1, 2)
            with torch.no_grad():  # as the model's attention: norms over [rows, heads, 1, dim]
                query, key = q_norm(split[:, :heads]), k_norm(split[:, heads : heads + kv_heads])
            query, key = apply_rotary_pos_emb(query, key, cos[at][:, None], sin[at][:, None])
            assert torch.equal(roped[:, :heads], query[:, :, 0]), rows
            assert torch.equal(roped[:, heads:], key[:, :, 0]), rows
            if rows > 16:
                continue
            keys, values = (torch.zeros(rows, kv_heads, POSITIONS, dim).bfloat16() for _ in "kv")
            out = torch.empty_like(roped)
            assert qk(qkv, 0, cos, sin, at, (keys, values), out) is out
            written = torch.arange(rows), slice(None), at
            assert torch.equal(out, roped)
            assert torch.equal(keys[written], key[:, :, 0])
            assert torch.equal(values[written], split[:, heads + kv_heads :, 0])
            assert int(keys.count_nonzero()) <= rows * kv_heads * dim, "written elsewhere"
    finally:
        torch.set_num_threads(before)


@needs_bf16  # elsewhere the step declines bfloat16 (family.py)
@pytest.mark.parametrize("family", ["qwen3", "gemma3_text"])
def test_a_pass_off_in_one_weight_is_refused(
    family: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The check can fail: with one value of each norm weight a little off on the pass's side
    only, it answers no, and the step runs PyTorch's operations there."""
    model = load_model(build(family, tmp_path), torch.bfloat16)
    ops = load_fused_ops()
    assert ops is not None
    assert DecodeStep(model, ops).qk_fused is not None
    prepared = QKNormRope._prepared

    def off(self: QKNormRope, weight: torch.Tensor) -> torch.Tensor:
        made = prepared(self, weight).clone()
        made[0] = made[0] * 1.03 + 0.01
        return made

    monkeypatch.setattr(QKNormRope, "_prepared", off)
    with caplog.at_level(logging.WARNING, logger="tritonbox_triton.engine.fused_qk_norm"):
        step = DecodeStep(model, ops)
    assert step.qk_fused is None
    assert "q/k norms not PyTorch's bits" in caplog.text
    assert "q/k norms" not in step.describe()
