"""The float32 logits head (engine/float_logits.py) against float64 products of the same
bfloat16 operands: every kernel it may pick, every row count a step uses, shapes that are not
whole blocks."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from tritonbox_triton.engine import fused_ops, linear_kernel
from tritonbox_triton.engine.float_logits import KERNELS, Float32Logits


@pytest.fixture(scope="module")
def library(tmp_path_factory: pytest.TempPathFactory) -> object:
    ops = fused_ops.load(Path(tmp_path_factory.mktemp("kernels")))
    if ops is None:
        pytest.skip("the engine's C library does not build here")
    return ops.library


def head(vocab: int, hidden: int, dtype: torch.dtype = torch.bfloat16) -> nn.Linear:
    generator = torch.Generator().manual_seed(vocab + hidden)
    linear = nn.Linear(hidden, vocab, bias=False)
    linear.weight.data = torch.randn(vocab, hidden, generator=generator).to(dtype)
    return linear


def exact(linear: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.linear(x.double(), linear.weight.double())


# Block counts odd and even, with and without a partial last block (the AVX512-BF16 kernel
# takes blocks two at a time from 8 rows on, one at a time below).
@pytest.mark.parametrize(("vocab", "hidden"), [(1001, 65), (4096, 576), (517, 640), (2008, 72)])
@pytest.mark.parametrize("rows", [1, 2, 3, 8, 16, 17, 40])
def test_bfloat16_products_are_summed_in_float32(
    library: object, vocab: int, hidden: int, rows: int
) -> None:
    linear = head(vocab, hidden)
    logits = Float32Logits(linear, library)  # type: ignore[arg-type]
    x = torch.randn(rows, hidden, generator=torch.Generator().manual_seed(rows)).bfloat16()
    got = logits(x)
    assert got.dtype == torch.float32 and got.shape == (rows, vocab)
    reference = exact(linear, x)
    # float32 sums of exact products: off by float32's rounding of the sums, far below the
    # 2^-8 relative step of a bfloat16 result.
    assert torch.allclose(got.double(), reference, rtol=1e-5, atol=1e-4)
    rounded = linear(x).double()  # what the model's own head gives: bfloat16 logits
    assert (got.double() - reference).abs().max() < (rounded - reference).abs().max() / 50


@pytest.mark.parametrize("kernel", KERNELS, ids=[name for name, _, _ in KERNELS])
def test_each_kernel_sums_a_row_alike_alone_or_batched(
    library: object, kernel: tuple[str, int, str]
) -> None:
    """A row's logits do not depend on the rows beside it (the engine runs a lone sequence as
    twins and a prompt's last position alone), and each kernel sums in float32."""
    linear = head(3000, 576)
    logits = Float32Logits(linear, library, kernels=(kernel,))  # type: ignore[arg-type]
    if logits.how != kernel[2]:
        pytest.skip(f"{kernel[0]} is not built or not allowed here ({logits.how})")
    x = torch.randn(20, 576, generator=torch.Generator().manual_seed(5)).bfloat16()
    batched = logits(x)
    assert torch.allclose(batched.double(), exact(linear, x), rtol=1e-5, atol=1e-4)
    for row in (0, 7, 19):
        assert torch.equal(logits(x[row : row + 1]), batched[row : row + 1])


def test_without_the_library_a_float32_copy_gives_the_same_logits() -> None:
    linear = head(1001, 65)
    logits = Float32Logits(linear, None)
    assert "float32 copy" in logits.how
    x = torch.randn(3, 65).bfloat16()
    assert torch.allclose(logits(x).double(), exact(linear, x), rtol=1e-5, atol=1e-4)


def test_a_float32_model_keeps_its_own_product() -> None:
    linear = head(1001, 65, torch.float32)
    logits = Float32Logits(linear, None)
    x = torch.randn(2, 5, 65)
    assert logits.how == "float32 weights"
    assert torch.equal(logits(x), linear(x))


def test_a_bias_is_added_in_float32(library: object) -> None:
    linear = head(100, 64)
    linear.bias = nn.Parameter(torch.randn(100).bfloat16())
    x = torch.randn(2, 64).bfloat16()
    expected = exact(linear, x) + linear.bias.double()
    got = Float32Logits(linear, library)(x)  # type: ignore[arg-type]
    assert torch.allclose(got.double(), expected, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("rows", [1, 2, 8, 17])
def test_the_avx2_products_sum_the_weight_as_it_is(tmp_path: Path, rows: int) -> None:
    """Where the CPU has AVX2 and no native bfloat16 (linear_kernel.py): no float32 copy."""
    products = linear_kernel.load(tmp_path)
    if products is None:
        pytest.skip("no AVX2 products here")
    linear = head(4096, 576)
    logits = Float32Logits(linear, None, products=products)
    assert logits.how == "bfloat16 weights, float32 sums (AVX2)"
    x = torch.randn(rows, 576, generator=torch.Generator().manual_seed(rows)).bfloat16()
    got = logits(x)
    assert got.dtype == torch.float32
    assert torch.allclose(got.double(), exact(linear, x), rtol=1e-5, atol=1e-4)
    assert torch.equal(logits(x[:1]), got[:1])
