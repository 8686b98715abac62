"""One decoder layer's projections, prepacked once for oneDNN (decode_step.py says why), and
the check that a prepacked product rounds as the model's own projection; the products
`load_model` gives the model itself.
"""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from . import amx_linear, linear_kernel
from .amx_linear import Packed
from .float_logits import Float32Logits
from .linear_kernel import Linear
from .probe import probe_input

TRIES = 6  # inputs `PackedLayer.agrees_with_plain` tries per row count


def _base(module: Any) -> Any:
    """A projection's own linear layer (a LoRA wrapper keeps it as `.base`: lora_layers.py)."""
    return getattr(module, "base", module)


def packed_linear(
    weight: torch.Tensor, bias: torch.Tensor | None = None, amx: Packed | None = None
) -> Linear:
    """`x ↦ F.linear(x, weight, bias)` with the weight reordered once (bfloat16), by
    linear_kernel.py's products where the CPU has no native bfloat16, else oneDNN's; with
    `amx` (where the model's own projections have it: amx_linear.py), its kernel, as the
    model's forward."""
    if amx is not None:
        return amx.linear(bias)
    if weight.dtype != torch.bfloat16:
        return lambda x: F.linear(x, weight, bias)
    products = linear_kernel.current()
    if products is not None:
        return products.linear(weight, bias)
    if not torch.backends.mkldnn.is_available():
        return lambda x: F.linear(x, weight, bias)
    packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), None)
    pointwise = torch.ops.mkldnn._linear_pointwise
    bias = None if bias is None else bias.detach()

    def linear(x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = pointwise(x, packed, bias, "none", [], "")
        return out

    return linear


def _weight(layer: Any, name: str) -> torch.Tensor | None:
    """A norm's weight, or None where the layer has no such norm."""
    norm = getattr(layer, name, None)
    return None if norm is None else norm.weight


class PackedLayer:
    """One decoder layer's weights. q, k and v are one product, and so are gate and up: each
    output column is the same dot product however many columns share the call (checked bit for
    bit), and a step makes three fewer calls per layer. Norms a family lacks are None
    (family.py): q/k norms (Qwen3, Gemma 3), the norms around Gemma's MLP."""

    def __init__(self, layer: Any) -> None:
        attention = layer.self_attn
        self.input_norm: torch.Tensor = layer.input_layernorm.weight
        self.post_norm: torch.Tensor = layer.post_attention_layernorm.weight
        self.pre_mlp_norm = _weight(layer, "pre_feedforward_layernorm")
        self.post_mlp_norm = _weight(layer, "post_feedforward_layernorm")
        self.q_norm, self.k_norm = _weight(attention, "q_norm"), _weight(attention, "k_norm")
        self.plain = groups(layer)
        qkv, _, gate_up, _ = self.plain
        amx = [amx_linear.packed_of(linears) for linears in self.plain]
        self.amx = all(amx)  # the model's projections take AMX products (amx_linear.py)
        # ... or linear_kernel.py's in their own order: either way a row's bits are its own
        self.own_products = self.amx or all(map(linear_kernel.attached, self.plain))
        self.qkv, self.o, self.gate_up, self.down = (  # one weight is packed as it is, not copied
            packed_linear(*_joined(linears), amx=packed)
            for linears, packed in zip(self.plain, amx, strict=True)
        )
        self.qk_width = qkv[0].weight.shape[0] + qkv[1].weight.shape[0]
        self.intermediate = gate_up[0].weight.shape[0]  # gate_up's output: gate, then up
        self.scaling = float(attention.scaling)

    def agrees_with_plain(self, rows: int, copies: int = 1) -> bool:
        """Whether each prepacked product of `rows` rows has the bits of the model's own
        projections (q, k and v apart, gate and up apart) over `copies` copies of those rows.
        Tried on `TRIES` inputs, half with magnitudes spread (probe.py says why); one
        difference answers no."""
        for attempt in range(TRIES):
            generator = torch.Generator().manual_seed(rows * TRIES + attempt)
            products = (self.qkv, self.o, self.gate_up, self.down)
            for packed, plain in zip(products, self.plain, strict=True):
                shape, dtype = (rows, plain[0].weight.shape[1]), plain[0].weight.dtype
                x = probe_input(shape, generator, spread=bool(attempt % 2), dtype=dtype)
                copied = torch.cat([x] * copies)
                expected = torch.cat([linear(copied) for linear in plain], dim=-1)[:rows]
                if not torch.equal(packed(x), expected):
                    return False
        return True


def groups(layer: Any) -> list[list[Any]]:
    """A decoder layer's linear layers in groups that read the same input: q, k and v; o; gate
    and up; down."""
    attention, mlp = layer.self_attn, layer.mlp
    qkv = [_base(getattr(attention, name)) for name in ("q_proj", "k_proj", "v_proj")]
    gate_up = [_base(mlp.gate_proj), _base(mlp.up_proj)]
    return [qkv, [_base(attention.o_proj)], gate_up, [_base(mlp.down_proj)]]


def _joined(linears: list[Any]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The weights of linear layers that read the same input, as one (and their biases, where
    any has one: Qwen2's q, k and v)."""
    weights = [linear.weight for linear in linears]
    weight = torch.cat(weights) if len(weights) > 1 else weights[0]
    if all(linear.bias is None for linear in linears):
        return weight, None
    biases = [
        torch.zeros(linear.weight.shape[0], dtype=weight.dtype)
        if linear.bias is None
        else linear.bias
        for linear in linears
    ]
    return weight, torch.cat(biases)


def attach_products(model: Any, library: ctypes.CDLL | None, kernel_dir: Path | None) -> None:
    """The model's head in float32 (float_logits.py: the engine's C library `library`, or the
    AVX2 products); in bfloat16 on a CPU with AMX, its decoder layers' projections through
    amx_linear.py's kernel, and on one with AVX-512 but no native bfloat16 through
    linear_kernel.py's (in their own order there), the engine's step then taking the same."""
    bfloat16 = model.lm_head.weight.dtype == torch.bfloat16
    products = linear_kernel.load(kernel_dir) if bfloat16 else None
    model.lm_head = Float32Logits(model.lm_head, library, products=products)
    amx = amx_linear.load(kernel_dir) if bfloat16 else None
    layers = getattr(getattr(model, "model", None), "layers", None)
    own = products is not None and products.own_order
    if (amx is None and not own) or layers is None:
        return
    try:
        groups_of = [groups(layer) for layer in layers]
    except AttributeError:  # not a layer the step knows (family.py): its forward keeps F.linear
        return
    linears = [linear for layer in groups_of for group in layer for linear in group]
    if not all(isinstance(linear, torch.nn.Linear) for linear in linears):
        return
    if amx is not None:
        amx_linear.attach(groups_of, amx)
    elif products is not None:
        linear_kernel.attach(groups_of, products)
