"""Many LoRA adapters in one forward pass: each targeted nn.Linear adds its rows' own low-rank
product, punica/LoRAX style, on top of the untouched base weights (nothing is merged).

For the adapters of the current batch, a layer concatenates their A matrices along the rank
axis (A_cat [sum r, in]) and their B matrices likewise (B_cat [out, sum r]); a 0/1 mask keeps,
for each row, only its own adapter's rank segment:

    y = base(x) + ((x @ A_cat^T) * mask_row) @ B_cat^T

Two small matmuls per layer whatever the number of adapters. A base row's mask is all zeros,
so its delta is exactly 0.0 and its output is bit-for-bit the base model's. The concatenation
is rebuilt only when the set of adapters in the batch changes, not every step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from tritonbox_common.lora import LLAMA_MODULES

ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")


@dataclass(eq=False)  # identity: the batch plan compares adapters with `is`
class EngineAdapter:
    """One converted adapter: (layer, HF module) -> (A [r, in], B [out, r], scaling inside B)."""

    task_id: int
    weights: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = field(repr=False)
    rank: int
    nbytes: int


class LoraRows:
    """Which adapter each row of the next forward pass uses; shared by every LoraLinear."""

    def __init__(self) -> None:
        self.groups: tuple[EngineAdapter, ...] = ()  # distinct adapters, first-seen order
        self.row_group: tuple[int, ...] = ()  # per row: index into groups, -1 = base
        self.version = 0  # bumped when groups change: layers rebuild their concatenation
        self.rows_version = 0  # bumped when any row changes: layers rebuild their masks
        self._key: tuple[int, ...] = ()

    def use(self, adapters: Sequence[EngineAdapter | None]) -> None:
        key = tuple(0 if a is None else id(a) for a in adapters)
        if key == self._key:
            return
        groups: list[EngineAdapter] = []
        row_group = []
        for adapter in adapters:
            if adapter is None:
                row_group.append(-1)
                continue
            if not any(adapter is g for g in groups):
                groups.append(adapter)
            row_group.append(next(i for i, g in enumerate(groups) if g is adapter))
        self._key, self.row_group = key, tuple(row_group)
        if tuple(map(id, groups)) != tuple(map(id, self.groups)):
            self.groups = tuple(groups)
            self.version += 1
        self.rows_version += 1


class LoraLinear(nn.Module):
    """`base` plus, per row, that row's adapter's low-rank product for (layer, module)."""

    def __init__(self, base: nn.Linear, layer: int, module: str, rows: LoraRows) -> None:
        super().__init__()
        self.base = base
        self.key = (layer, module)
        self._rows = rows
        self._built = (-1, -1)  # (groups version, rows version) the tensors below are for
        self._a: torch.Tensor | None = None  # [sum r, in]
        self._b: torch.Tensor | None = None  # [out, sum r]
        self._segments: list[tuple[int, int] | None] = []  # per group: rank columns or None
        self._mask: torch.Tensor | None = None  # [rows, 1, sum r]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base(x)
        rows = self._rows
        if not rows.groups:
            return y
        if self._built[0] != rows.version:
            self._concatenate(rows.groups)
        if self._a is None or self._b is None:
            return y  # no adapter in this batch targets this module
        if self._built[1] != rows.rows_version:
            self._build_mask(rows.row_group, x.dtype)
        assert self._mask is not None
        hidden = F.linear(x, self._a) * self._mask
        return y + F.linear(hidden, self._b)

    def _concatenate(self, groups: tuple[EngineAdapter, ...]) -> None:
        a_parts, b_parts, self._segments, start = [], [], [], 0
        for adapter in groups:
            pair = adapter.weights.get(self.key)
            if pair is None:
                self._segments.append(None)
                continue
            a, b = pair
            a_parts.append(a)
            b_parts.append(b)
            self._segments.append((start, start + a.shape[0]))
            start += a.shape[0]
        self._a = torch.cat(a_parts) if a_parts else None
        self._b = torch.cat(b_parts, dim=1) if b_parts else None
        self._built = (self._rows.version, -1)

    def _build_mask(self, row_group: tuple[int, ...], dtype: torch.dtype) -> None:
        assert self._a is not None
        mask = torch.zeros(len(row_group), 1, self._a.shape[0], dtype=dtype)
        for row, group in enumerate(row_group):
            segment = self._segments[group] if group >= 0 else None
            if segment is not None:
                mask[row, 0, segment[0] : segment[1]] = 1
        self._mask = mask
        self._built = (self._built[0], self._rows.rows_version)


def attach_lora(model: nn.Module) -> tuple[LoraRows, dict[str, tuple[int, int]], int]:
    """Wrap every Llama projection of `model` in place; (rows, (in, out) per module, layers).

    With no adapter in the batch each wrapper only calls its base layer, so base requests
    compute exactly what the unwrapped model did.
    """
    rows = LoraRows()
    dims: dict[str, tuple[int, int]] = {}
    layers = getattr(getattr(model, "model", None), "layers", None)
    if not isinstance(layers, nn.ModuleList):
        raise ValueError(f"attach_lora: {type(model).__name__} has no model.layers (Llama-style)")
    for index, layer in enumerate(layers):
        for name in LLAMA_MODULES:
            parent = getattr(layer, "self_attn" if name in ATTENTION else "mlp", None)
            base = getattr(parent, name, None)
            if isinstance(base, LoraLinear):  # attached before (a shared test model)
                raise ValueError("attach_lora: the model already has LoRA layers")
            if not isinstance(base, nn.Linear):
                raise ValueError(f"attach_lora: layer {index} {name} is not an nn.Linear")
            dims[name] = (base.in_features, base.out_features)
            setattr(parent, name, LoraLinear(base, index, name, rows))
    return rows, dims, len(layers)
