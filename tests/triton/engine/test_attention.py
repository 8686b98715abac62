"""The engine's float64 attention: the same numbers as PyTorch's fused attention (to float32
precision), causal when transformers passes no mask, and a row's result independent of the
padding its batch gives it."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tritonbox_triton.engine.attention import float64_attention

HEADS, KV_HEADS, DIM = 9, 3, 64


def qkv(batch: int, queries: int, keys: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(batch * 1000 + queries * 10 + keys)
    return (
        torch.randn(batch, HEADS, queries, DIM, generator=generator),
        torch.randn(batch, KV_HEADS, keys, DIM, generator=generator),
        torch.randn(batch, KV_HEADS, keys, DIM, generator=generator),
    )


def fused(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **options: object) -> torch.Tensor:
    out = F.scaled_dot_product_attention(q, k, v, enable_gqa=True, **options)  # type: ignore[arg-type]
    return out.transpose(1, 2)


def test_a_prompt_without_a_mask_is_causal() -> None:
    q, k, v = qkv(1, 7, 7)
    mine, _ = float64_attention(torch.nn.Module(), q, k, v, None, scaling=DIM**-0.5)
    torch.testing.assert_close(mine, fused(q, k, v, is_causal=True), rtol=1e-5, atol=1e-5)


def test_a_padded_decode_row_equals_the_row_alone_exactly() -> None:
    q, k, v = qkv(1, 1, 40)
    alone, _ = float64_attention(torch.nn.Module(), q, k, v, None, scaling=DIM**-0.5)
    torch.testing.assert_close(alone, fused(q, k, v), rtol=1e-5, atol=1e-5)
    for padding in (1, 13, 37, 200):
        zeros = torch.zeros(1, KV_HEADS, padding, DIM)
        mask = torch.ones(1, 1, 1, padding + 40, dtype=torch.bool)
        mask[..., :padding] = False
        padded, _ = float64_attention(
            torch.nn.Module(), q, torch.cat([zeros, k], 2), torch.cat([zeros, v], 2), mask,
            scaling=DIM**-0.5,
        )  # fmt: skip
        assert torch.equal(padded, alone), f"{padding} columns of padding changed the result"
