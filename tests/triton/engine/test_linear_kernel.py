"""The AVX2 bfloat16 products (engine/linear_kernel.py) against PyTorch's own `F.linear`: the
same bits at every row count and shape the engine runs, with and without a bias, and the
checks that decide where they are used."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from tritonbox_triton.engine import dtype, linear_kernel
from tritonbox_triton.engine.linear_kernel import Products
from tritonbox_triton.engine.probe import probe_input


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory) -> Products:
    loaded = linear_kernel.load(Path(tmp_path_factory.mktemp("kernels")))
    if loaded is None:
        pytest.skip(
            "no AVX2 products here: the CPU has native bfloat16, lacks AVX2 and FMA, or PyTorch "
            "sums in another order (oneDNN's on AVX-512)"
        )
    return loaded


@pytest.fixture(scope="module")
def products(loaded: Products) -> Products:
    """The products where they give PyTorch's bits (AVX2); test_own_order_products.py has
    them where they keep their own order (AVX-512 without native bfloat16)."""
    if loaded.own_order:
        pytest.skip("PyTorch sums in another order here: the products keep their own")
    return loaded


def _spread(rows: int, inner: int, seed: int) -> torch.Tensor:
    return probe_input((rows, inner), torch.Generator().manual_seed(seed))


# SmolLM2's projections (q/k/v joined, o, gate/up joined, down), Gemma 3 270M's hidden size,
# and output counts that leave a partial tile of 4.
@pytest.mark.parametrize(
    ("outputs", "inner"), [(960, 576), (576, 576), (3072, 576), (576, 1536), (1027, 640), (5, 128)]
)
@pytest.mark.parametrize("rows", [1, 2, 3, 7, 16, 33])
def test_each_product_has_pytorchs_bits(
    products: Products, outputs: int, inner: int, rows: int
) -> None:
    generator = torch.Generator().manual_seed(outputs + inner)
    weight = torch.randn(outputs, inner, generator=generator).bfloat16()
    bias = torch.randn(outputs, generator=generator).bfloat16()
    x = _spread(rows, inner, rows)
    assert torch.equal(products.linear(weight)(x), F.linear(x, weight))
    assert torch.equal(products.linear(weight, bias)(x), F.linear(x, weight, bias))


def test_a_bias_made_for_the_call_lives_as_long_as_the_product(products: Products) -> None:
    """PackedLayer joins q, k and v's biases into a new tensor that only the product keeps."""
    weight = torch.randn(40, 64).bfloat16()
    bias = torch.randn(40).bfloat16()
    linear = products.linear(weight, bias.clone())
    gc.collect()
    churn = [torch.full((40,), 1e30).bfloat16() for _ in range(1000)]  # reuse freed memory
    x = _spread(3, 64, 6)
    assert torch.equal(linear(x), F.linear(x, weight, bias)), len(churn)


def test_leading_dimensions_and_views_are_kept(products: Products) -> None:
    weight = torch.randn(96, 128).bfloat16()
    x = _spread(12, 256, 3)[:, ::2].reshape(3, 4, 128)  # not contiguous
    got = products.linear(weight)(x)
    assert got.shape == (3, 4, 96) and torch.equal(got, F.linear(x, weight))


def test_an_inner_size_off_the_chunks_keeps_pytorchs_product(products: Products) -> None:
    """Sizes that are not a multiple of 64 end in tails whose order was not matched."""
    weight = torch.randn(33, 100).bfloat16()
    x = _spread(5, 100, 4)
    assert torch.equal(products.linear(weight)(x), F.linear(x, weight))


def test_sums_are_float32_and_unrounded(loaded: Products) -> None:
    weight = torch.randn(1001, 576).bfloat16()
    x = _spread(9, 576, 5)
    got = loaded.sums(x, weight)
    exact = F.linear(x.double(), weight.double())
    assert got.dtype == torch.float32
    assert torch.allclose(got.double(), exact, rtol=1e-5, atol=1e-3)
    rounded = F.linear(x.double(), weight.double()).bfloat16().double()
    assert (got.double() - exact).abs().max() < (rounded - exact).abs().max() / 50
    for row in (0, 4, 8):  # a row's sums do not depend on the rows beside it
        assert torch.equal(loaded.sums(x[row : row + 1], weight), got[row : row + 1])


def test_the_engine_runs_bfloat16_where_they_load(products: Products) -> None:
    assert dtype.engine_dtype("auto") == torch.bfloat16
    assert "AVX2 products" in dtype.describe("auto", torch.bfloat16)


def test_they_are_not_used_where_the_cpu_has_native_bfloat16_or_no_avx2(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    load = linear_kernel.load.__wrapped__  # not the cached answer for this machine
    monkeypatch.setattr(linear_kernel, "cpu_flags", lambda: frozenset({"avx2", "fma", "amx_bf16"}))
    assert load(tmp_path) is None
    monkeypatch.setattr(linear_kernel, "cpu_flags", lambda: frozenset({"avx", "sse4_2"}))
    assert load(tmp_path) is None


def test_a_different_order_is_refused(products: Products, monkeypatch: pytest.MonkeyPatch) -> None:
    """The start-up check can fail: with a product that rounds otherwise, it answers no."""
    made = products.linear

    def off(weight: torch.Tensor, bias: torch.Tensor | None = None) -> linear_kernel.Linear:
        linear = made(weight, bias)
        return lambda x: linear(x) * 1.0078125  # one bfloat16 step up

    assert products.agree()
    monkeypatch.setattr(products, "linear", off)
    assert not products.agree()
