"""The AMX products (engine/amx_linear.py): within a rounding of float64's, a row's bits the same
at every row count, a packed member's product the same alone and joined, and
the model's forward and the engine's step taking the same products."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from tritonbox_triton.engine import amx_linear, packed_layer
from tritonbox_triton.engine.amx_linear import AmxProducts
from tritonbox_triton.engine.probe import probe_input


@pytest.fixture(scope="module")
def products(tmp_path_factory: pytest.TempPathFactory) -> AmxProducts:
    loaded = amx_linear.load(Path(tmp_path_factory.mktemp("kernels")))
    if loaded is None:
        pytest.skip("no AMX here (or the kernel did not load: amx_linear.py's log says why)")
    return loaded


ROWS = 600  # past a prefill chunk of 512 tokens and a step's rows beside it


# SmolLM2's projections, Gemma 3 270M's hidden size, outputs and inner sizes that leave a part
# of a block or of a tile.
@pytest.mark.parametrize(
    ("outputs", "inner"), [(960, 576), (3072, 576), (576, 1536), (1027, 640), (5, 70)]
)
def test_products_are_float64s_rounded_and_a_rows_bits_its_own(
    products: AmxProducts, outputs: int, inner: int
) -> None:
    generator = torch.Generator().manual_seed(outputs + inner)
    weight = torch.randn(outputs, inner, generator=generator).bfloat16()
    bias = torch.randn(outputs, generator=generator).bfloat16()
    x = probe_input((ROWS, inner), generator)
    linear = products.pack([weight])[0].linear(bias)
    full = linear(x)
    exact = F.linear(x.double(), weight.double(), bias.double())
    # one rounding to bfloat16 of a float32 sum: relative 2^-8, and the sum's own error
    assert torch.allclose(full.double(), exact, rtol=2**-7, atol=1e-3 * inner)
    for rows in (1, 2, 3, 16, 17, 31, 32, 33, 100, 128, 129, 300, 512):
        assert torch.equal(linear(x[:rows]), full[:rows]), rows
    assert torch.equal(linear(x[:6].view(2, 3, inner)), full[:6].view(2, 3, outputs))


def test_no_rows_give_no_rows(products: AmxProducts) -> None:
    linear = products.pack([torch.randn(32, 64).bfloat16()])[0].linear(None)
    assert linear(torch.empty(0, 64, dtype=torch.bfloat16)).shape == (0, 32)


def test_members_packed_as_one_give_their_own_products(products: AmxProducts) -> None:
    """q, k and v packed into one weight: each member's product, and the joined one, equal the
    member packed alone; a member of a partial block is packed apart."""
    generator = torch.Generator().manual_seed(3)
    weights = [torch.randn(n, 576, generator=generator).bfloat16() for n in (64, 32, 32)]
    x = probe_input((16, 576), generator)
    members = products.pack(weights)
    assert members[0].weight is members[2].weight and members[2].first == 96
    alone = [products.pack([w])[0].linear(None)(x) for w in weights]
    for member, expected in zip(members, alone, strict=True):
        assert torch.equal(member.linear(None)(x), expected)
    joined = products.joined(weights).linear(None)(x)
    assert torch.equal(joined, torch.cat(alone, dim=-1))
    ragged = products.pack([weights[0][:40], weights[1]])
    assert ragged[0].weight is not ragged[1].weight


def test_the_models_projections_and_the_steps_are_the_same_kernel(
    products: AmxProducts, model: Any
) -> None:
    """load_model gave the model's projections the kernel where this CPU has it (a bfloat16
    model), and PackedLayer's joined products take the same packed weights."""
    if model.dtype != torch.bfloat16:
        pytest.skip("the default model runs float32 here")
    layer = model.model.layers[0]
    qkv = packed_layer.groups(layer)[0]
    packed = amx_linear.packed_of(qkv)
    assert packed is not None and packed.first == 0
    assert all(getattr(linear, amx_linear.ATTRIBUTE).weight is packed.weight for linear in qkv)
    step_layer = packed_layer.PackedLayer(layer)
    x = probe_input((ROWS, layer.self_attn.q_proj.in_features), torch.Generator().manual_seed(9))
    forward = torch.cat([linear(x) for linear in qkv], dim=-1)
    assert torch.equal(step_layer.qkv(x), forward)
    assert step_layer.agrees_with_plain(ROWS // 2, copies=2)
    assert step_layer.agrees_with_plain(7, copies=3)
