"""The engine's attention: the attention's numbers, causal for a prompt, and a decode row's result
the same bits alone (as `generate()`'s reference computes it) and in a right-padded batch beside
rows of other lengths, with the compiled decode kernel, PyTorch's fused path and the float64
fallback."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from tritonbox_testing.hardware import needs_avx512, needs_bf16

from tritonbox_triton.engine import attention, fused_build, fused_ops
from tritonbox_triton.engine.attention import (
    BLOCKS,
    KERNEL,
    DecodeAttention,
    decode_width,
    engine_attention,
    model_kernel,
    padding_block,
)
from tritonbox_triton.engine.attention_kernel import AttentionKernel, DecodeRows, attention_kernel

HEADS, KV_HEADS, DIM = 9, 3, 64
GROUPS = HEADS // KV_HEADS


def randn(*shape: int, seed: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def compiled() -> AttentionKernel | None:
    return attention_kernel(fused_ops.load(None), torch.bfloat16, KV_HEADS, GROUPS, DIM)


@pytest.fixture(params=["compiled", "fused", "float64"])
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> AttentionKernel | None:
    """The decode kernel the attention layers carry (`load_model`), None for PyTorch's paths."""
    if request.param == "compiled":
        kernel = compiled()
        if kernel is None:
            pytest.skip("no compiled decode attention on this machine")
        return kernel
    if request.param == "float64":
        monkeypatch.setattr(attention, "padding_block", lambda *shape: None)
    elif padding_block(torch.bfloat16, KV_HEADS, GROUPS, DIM) is None:
        pytest.skip("no padding block keeps the fused kernel's bits on this machine")
    return None


def layer(kernel: AttentionKernel | None) -> torch.nn.Module:
    """An attention layer as `load_model` leaves it."""
    module = torch.nn.Module()
    setattr(module, KERNEL, kernel)
    return module


@needs_bf16  # the compiled attention is bfloat16's (the model is float32 elsewhere)
@needs_avx512  # and AVX-512 code
def test_the_engines_model_decodes_with_the_compiled_kernel_here(model: object) -> None:
    """On the machines this was built on (AVX-512) `load_model` gives it to every layer."""
    assert isinstance(model_kernel(model), AttentionKernel)  # type: ignore[arg-type]


@needs_avx512
def test_the_kernels_check_can_fail() -> None:
    """exp2 in place of exp: the softmax is wrong, and the start-up check says so."""
    ops = fused_ops.load(None)
    assert ops is not None
    exp2 = fused_build.vector_exp("Sleef_exp2f16_u10")
    assert exp2 is not None
    wrong = fused_ops.FusedOps(ops.library, ops.lanes, vector_exp=exp2)
    assert not AttentionKernel(wrong).agrees(KV_HEADS, GROUPS, DIM)
    assert AttentionKernel(ops).agrees(KV_HEADS, GROUPS, DIM)


@needs_avx512
@pytest.mark.parametrize("kv_heads,groups,dim", [(1, 4, 256), (2, 4, 128), (8, 4, 128)])
def test_the_compiled_kernel_takes_the_families_heads(kv_heads: int, groups: int, dim: int) -> None:
    """Gemma 3 270M's heads of 256 (1 kv head, 4 queries each), Mistral 7B's and Llama 3 8B's
    (8 kv heads of 128) and others: built and checked here (AVX-512), a decode row still has
    its bits alone and in a batch. PyTorch's attention took a quarter of the 270M model's
    decode step."""
    kernel = attention_kernel(fused_ops.load(None), torch.bfloat16, kv_heads, groups, dim)
    assert kernel is not None
    lengths = torch.tensor([5, 300, 650])
    keys, values = (randn(3, kv_heads, 700, dim, seed=seed) for seed in (1, 2))
    query = randn(3, kv_heads, groups, dim, seed=3)
    batched = kernel.decode(query, keys, values, DecodeRows(lengths), dim**-0.5)
    alone = kernel.decode(query[2:], keys[2:, :, :650], values[2:, :, :650],
                          DecodeRows(lengths[2:]), dim**-0.5)  # fmt: skip
    assert torch.equal(alone[0], batched[2])


def test_bfloat16_keeps_its_bits_with_a_block_here() -> None:
    """On the machines this was built on (AVX-512/AMX) bfloat16 takes the fused path."""
    assert padding_block(torch.bfloat16, KV_HEADS, GROUPS, DIM) in BLOCKS


def test_a_prompt_is_causal(path: AttentionKernel | None) -> None:
    q, k, v = (
        randn(2, HEADS, 7, DIM, seed=1),
        randn(2, KV_HEADS, 7, DIM, seed=2),
        randn(2, KV_HEADS, 7, DIM, seed=3),
    )
    mine, _ = engine_attention(layer(path), q, k, v, None, scaling=DIM**-0.5)
    expected = F.scaled_dot_product_attention(
        q.double(), k.double(), v.double(), is_causal=True, enable_gqa=True
    ).transpose(1, 2)
    torch.testing.assert_close(mine.double(), expected, rtol=2e-2, atol=2e-2)


def test_a_decode_row_has_the_same_bits_alone_and_in_any_batch(
    path: AttentionKernel | None,
) -> None:
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
    batched = DecodeAttention(valid, query.dtype, path)(query, keys, values, DIM**-0.5)
    for row, length in enumerate(lengths.tolist()):
        twins = query[row : row + 1].reshape(1, HEADS, 1, DIM).expand(2, -1, -1, -1)
        own_keys = keys[row : row + 1, :, :length].expand(2, -1, -1, -1)
        own_values = values[row : row + 1, :, :length].expand(2, -1, -1, -1)
        alone, _ = engine_attention(layer(path), twins, own_keys, own_values, None,
                                    scaling=DIM**-0.5)  # fmt: skip
        assert torch.equal(alone[0, 0], batched[row].reshape(HEADS, DIM)), f"row of {length} keys"


def test_the_decode_is_the_attention(path: AttentionKernel | None) -> None:
    lengths = torch.tensor([5, 33, 16, 47])
    width = 48
    keys, values = randn(4, KV_HEADS, width, DIM, seed=7), randn(4, KV_HEADS, width, DIM, seed=8)
    query = randn(4, KV_HEADS, GROUPS, DIM, seed=9)
    valid = torch.arange(width)[None, :] < lengths[:, None]
    mine = DecodeAttention(valid, query.dtype, path)(query, keys, values, DIM**-0.5)
    for row, length in enumerate(lengths.tolist()):
        expected = F.scaled_dot_product_attention(
            query[row].double(), keys[row, :, :length].double(), values[row, :, :length].double()
        )
        torch.testing.assert_close(mine[row].double(), expected.flatten(), rtol=2e-2, atol=2e-2)


def test_the_compiled_kernel_is_as_close_to_float64_as_pytorchs() -> None:
    """Rounded once from float32 (PyTorch's fused path rounds its softmax's weights to bfloat16
    before the values product): on random rows of up to 600 keys, at least as close."""
    kernel = compiled()
    if kernel is None:
        pytest.skip("no compiled decode attention on this machine")
    lengths = torch.randint(1, 600, (16,), generator=torch.Generator().manual_seed(10))
    width = decode_width(int(lengths.max()), torch.bfloat16, KV_HEADS, GROUPS, DIM)
    keys = randn(16, KV_HEADS, width, DIM, seed=11)
    values = randn(16, KV_HEADS, width, DIM, seed=12)
    query = randn(16, KV_HEADS, GROUPS, DIM, seed=13)
    valid = torch.arange(width)[None, :] < lengths[:, None]
    exact = torch.cat([
        F.scaled_dot_product_attention(query[row].double(), keys[row, :, :length].double(),
                                       values[row, :, :length].double()).flatten()[None]
        for row, length in enumerate(lengths.tolist())
    ])  # fmt: skip
    errors = {
        name: (DecodeAttention(valid, query.dtype, k)(query, keys, values, DIM**-0.5).double()
               - exact).abs().mean().item()
        for name, k in (("compiled", kernel), ("pytorch", None))
    }  # fmt: skip
    assert errors["compiled"] <= errors["pytorch"], errors


def test_the_compiled_kernel_refuses_keys_that_do_not_start_at_column_0() -> None:
    kernel = compiled()
    if kernel is None:
        pytest.skip("no compiled decode attention on this machine")
    left_padded = torch.tensor([[False, True, True], [True, True, True]])
    with pytest.raises(ValueError, match="from column 0"):
        DecodeAttention(left_padded, torch.bfloat16, kernel)


def test_the_compiled_kernel_gives_a_row_its_bits_on_any_thread_count() -> None:
    """Decoding and causally, one thread or two: each (row, kv head) is one thread's task."""
    kernel = compiled()
    if kernel is None:
        pytest.skip("no compiled decode attention on this machine")
    lengths = torch.tensor([40, 1, 17, 300, 16, 129])
    keys, values = randn(6, KV_HEADS, 304, DIM, seed=14), randn(6, KV_HEADS, 304, DIM, seed=15)
    query = randn(6, KV_HEADS, GROUPS, DIM, seed=16)
    rows = DecodeRows(lengths)
    one, two = (kernel.decode(query, keys, values, rows, DIM**-0.5, threads=n) for n in (1, 2))
    assert torch.equal(one, two)
    prompt = randn(3, HEADS, 39, DIM, seed=17)
    one, two = (kernel.causal(prompt, keys[:3, :, :39], values[:3, :, :39], DIM**-0.5, threads=n)
                for n in (1, 2))  # fmt: skip
    assert torch.equal(one, two)


def test_a_prompt_has_the_same_bits_alone_and_right_padded_in_a_batch() -> None:
    """The compiled kernel's prefill: a 23-token prompt alone, and padded to 39 beside others."""
    kernel = compiled()
    if kernel is None:
        pytest.skip("no compiled decode attention on this machine")
    q = randn(4, HEADS, 39, DIM, seed=18)
    k, v = randn(4, KV_HEADS, 39, DIM, seed=19), randn(4, KV_HEADS, 39, DIM, seed=20)
    batched, _ = engine_attention(layer(kernel), q, k, v, None, scaling=DIM**-0.5)
    alone, _ = engine_attention(layer(kernel), q[2:3, :, :23], k[2:3, :, :23], v[2:3, :, :23],
                                None, scaling=DIM**-0.5)  # fmt: skip
    assert torch.equal(alone[0], batched[2, :23])


def test_the_compiled_kernel_refuses_a_prompt_longer_than_its_keys() -> None:
    """The C pass reads a position's keys up to its own: fewer keys would be read past."""
    kernel = compiled()
    if kernel is None:
        pytest.skip("no compiled decode attention on this machine")
    query, keys = randn(1, HEADS, 9, DIM, seed=21), randn(1, KV_HEADS, 8, DIM, seed=22)
    with pytest.raises(ValueError, match="9 positions over 8 keys"):
        kernel.causal(query, keys, keys, DIM**-0.5)


@pytest.mark.parametrize(("kv_heads", "groups", "dim"), [(3, 3, 64), (2, 4, 64), (1, 4, 256)])
def test_a_prompt_position_has_a_decode_rows_bits_in_any_chunking(
    kv_heads: int, groups: int, dim: int
) -> None:
    """The compiled prefill attends a block of positions side by side (each key widened once for
    all of them): each position still has the bits of a decode row over the same keys, however
    the prompt is cut into chunks (the blocks then fall on other positions)."""
    kernel = attention_kernel(fused_ops.load(None), torch.bfloat16, kv_heads, groups, dim)
    if kernel is None:
        pytest.skip("no compiled attention for these heads on this machine")
    length, scaling = 70, dim**-0.5
    query = randn(1, kv_heads * groups, length, dim, seed=23)
    keys, values = (randn(1, kv_heads, length, dim, seed=seed) for seed in (24, 25))
    whole = kernel.causal(query, keys, values, scaling)
    chunks = [kernel.causal(query[:, :, a:b], keys[:, :, :b], values[:, :, :b], scaling, before=a)
              for a, b in ((0, 5), (5, 38), (38, length))]  # fmt: skip
    assert torch.equal(torch.cat(chunks, dim=1), whole)
    for t in range(length):
        row = query[:, :, t].reshape(1, kv_heads, groups, dim).contiguous()
        decoded = kernel.decode(row, keys, values, DecodeRows(torch.tensor([t + 1])), scaling)
        assert torch.equal(decoded[0], whole[0, t]), t
