"""linear_kernel.py's products in their own order, on a CPU with AVX-512 and no native bfloat16
(PyTorch's bfloat16 product is oneDNN's emulation there, in another order): close to exact,
a row's bits its own, and given to the model's projections so that the decode step is still
its forward. This CPU runs them under emulation (test_emulated_cpus.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from tritonbox_triton.engine import dtype, linear_kernel, packed_layer
from tritonbox_triton.engine.decode_step import DecodeStep
from tritonbox_triton.engine.linear_kernel import Products
from tritonbox_triton.engine.probe import probe_input


@pytest.fixture(scope="module")
def own(tmp_path_factory: pytest.TempPathFactory) -> Products:
    loaded = linear_kernel.load(Path(tmp_path_factory.mktemp("kernels")))
    if loaded is None or not loaded.own_order:
        pytest.skip("the products are PyTorch's own order here, or not used (no AVX-512 "
                    "CPU without native bfloat16)")  # fmt: skip
    return loaded


@pytest.mark.parametrize(("outputs", "inner"), [(1027, 640), (96, 576), (33, 100)])
def test_within_bfloat16s_rounding_and_each_row_its_own(
    own: Products, outputs: int, inner: int
) -> None:
    """Inner sizes off the chunks of 64 too: in their own order there is no order to match."""
    generator = torch.Generator().manual_seed(outputs)
    weight = torch.randn(outputs, inner, generator=generator).bfloat16()
    bias = torch.randn(outputs, generator=generator).bfloat16()
    x = probe_input((9, inner), generator)
    got = own.linear(weight, bias)(x)
    exact = F.linear(x.double(), weight.double(), bias.double())
    assert torch.allclose(got.double(), exact, rtol=2**-7, atol=1e-3 * inner)
    for row in (0, 4, 8):
        assert torch.equal(own.linear(weight, bias)(x[row : row + 1]), got[row : row + 1])
    joined = own.linear(torch.cat([weight, weight[:5]]))(x)  # q, k and v as one product
    assert torch.equal(joined[:, :outputs], own.linear(weight)(x))


def test_the_model_takes_them_and_the_step_too(own: Products, model: Any) -> None:
    assert dtype.engine_dtype("auto") == torch.bfloat16
    assert "the model's own too" in dtype.describe("auto", torch.bfloat16)
    for layer in model.model.layers:
        for group in packed_layer.groups(layer):
            assert linear_kernel.attached(group)
    x = probe_input((3, model.config.hidden_size), torch.Generator().manual_seed(1))
    q_proj = model.model.layers[0].self_attn.q_proj
    assert torch.equal(q_proj(x), own.linear(q_proj.weight)(x))
    step = DecodeStep(model)
    assert step.layers[0].own_products
    assert step.lone_exact_for(37) and "own products" in step.describe()
