"""The engine's attention: PyTorch's fused attention's numbers, causal for a prompt, and a
decode row's result the same bits alone (as `generate()`'s reference computes it) and in a
right-padded batch beside rows of other lengths, on the fused path and the float64 fallback."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tritonbox_triton.engine import attention
from tritonbox_triton.engine.attention import (
    BLOCKS,
    decode_attention,
    decode_width,
    engine_attention,
    padding_bias,
    padding_block,
)

HEADS, KV_HEADS, DIM = 9, 3, 64
GROUPS = HEADS // KV_HEADS


def randn(*shape: int, seed: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


@pytest.fixture(params=["fused", "float64"])
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "float64":
        monkeypatch.setattr(attention, "padding_block", lambda *shape: None)
    elif padding_block(torch.bfloat16, KV_HEADS, GROUPS, DIM) is None:
        pytest.skip("no padding block keeps the fused kernel's bits on this machine")
    return str(request.param)


def test_bfloat16_keeps_its_bits_with_a_block_here() -> None:
    """On the machines this was built on (AVX-512/AMX) bfloat16 takes the fused path."""
    assert padding_block(torch.bfloat16, KV_HEADS, GROUPS, DIM) in BLOCKS


def test_a_prompt_is_causal(path: str) -> None:
    q, k, v = (
        randn(2, HEADS, 7, DIM, seed=1),
        randn(2, KV_HEADS, 7, DIM, seed=2),
        randn(2, KV_HEADS, 7, DIM, seed=3),
    )
    mine, _ = engine_attention(torch.nn.Module(), q, k, v, None, scaling=DIM**-0.5)
    expected = F.scaled_dot_product_attention(
        q.double(), k.double(), v.double(), is_causal=True, enable_gqa=True
    ).transpose(1, 2)
    torch.testing.assert_close(mine.double(), expected, rtol=2e-2, atol=2e-2)


def test_a_decode_row_has_the_same_bits_alone_and_in_any_batch(path: str) -> None:
    """Alone: the reference's unpadded keys through transformers' interface, twin rows. In a
    batch: right-padded to the batch's width with garbage past each row's length, as the
    engine's cache holds rows that left before."""
    lengths = torch.tensor([40, 1, 17, 300, 16, 129])
    rows = len(lengths)
    width = decode_width(int(lengths.max()), torch.bfloat16, KV_HEADS, GROUPS, DIM) + 16
    keys = randn(rows, KV_HEADS, width, DIM, seed=4)
    values = randn(rows, KV_HEADS, width, DIM, seed=5)
    query = randn(rows, KV_HEADS, GROUPS, DIM, seed=6)
    valid = torch.arange(width)[None, :] < lengths[:, None]
    batched = decode_attention(query, keys, values, padding_bias(valid, query.dtype), DIM**-0.5)
    for row, length in enumerate(lengths.tolist()):
        twins = query[row : row + 1].reshape(1, HEADS, 1, DIM).expand(2, -1, -1, -1)
        own_keys = keys[row : row + 1, :, :length].expand(2, -1, -1, -1)
        own_values = values[row : row + 1, :, :length].expand(2, -1, -1, -1)
        alone, _ = engine_attention(
            torch.nn.Module(), twins, own_keys, own_values, None, scaling=DIM**-0.5
        )
        assert torch.equal(alone[0, 0], batched[row].reshape(HEADS, DIM)), f"row of {length} keys"


def test_the_fused_decode_is_the_attention() -> None:
    lengths = torch.tensor([5, 33])
    width = 48
    keys, values = randn(2, KV_HEADS, width, DIM, seed=7), randn(2, KV_HEADS, width, DIM, seed=8)
    query = randn(2, KV_HEADS, GROUPS, DIM, seed=9)
    valid = torch.arange(width)[None, :] < lengths[:, None]
    mine = decode_attention(query, keys, values, padding_bias(valid, query.dtype), DIM**-0.5)
    for row, length in enumerate(lengths.tolist()):
        expected = F.scaled_dot_product_attention(
            query[row].double(), keys[row, :, :length].double(), values[row, :, :length].double()
        )
        torch.testing.assert_close(mine[row].double(), expected, rtol=2e-2, atol=2e-2)
