"""Many LoRA adapters in one forward pass: each targeted nn.Linear adds its rows' own low-rank
product, punica/LoRAX style, on top of the untouched base weights (nothing is merged).

For the adapters of the current batch, a layer concatenates their A matrices along the rank
axis (A_cat [sum r, in]) and their B matrices likewise (B_cat [out, sum r]); a 0/1 mask keeps,
for each row, only its own adapter's rank segment:

    y = base(x) + ((x @ A_cat^T) * mask_row) @ B_cat^T

Two small matmuls per layer whatever the number of adapters. A base row's mask is all zeros,
so its delta is exactly 0.0 and its output is bit-for-bit the base model's. The concatenation
is built when the set of adapters in the batch changes, not every step.
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
        self.row_group = torch.zeros(0, dtype=torch.long)  # per row: its group, -1 = base
        self.version = 0  # bumped whenever the rows change: layers rebuild their masks
        self._key: tuple[int, ...] = ()

    def use(self, adapters: Sequence[EngineAdapter | None]) -> None:
        key = tuple(0 if a is None else id(a) for a in adapters)
        if key == self._key:
            return  # the usual decode step: same rows as the last one
        groups: list[EngineAdapter] = []
        row_group = []
        for adapter in adapters:
            if adapter is None:
                row_group.append(-1)
                continue
            if not any(adapter is g for g in groups):
                groups.append(adapter)
            row_group.append(next(i for i, g in enumerate(groups) if g is adapter))
        self._key, self.groups = key, tuple(groups)
        self.row_group = torch.tensor(row_group, dtype=torch.long)
        self.version += 1


@dataclass(eq=False)
class _Plan:
    """One layer's concatenated weights for one set of adapters."""

    groups: tuple[EngineAdapter, ...]  # held, so no adapter here is freed while planned
    a: torch.Tensor | None  # [sum r, in]; None when no adapter here targets this layer
    b: torch.Tensor | None  # [out, sum r]
    # [groups + 1, 1, sum r]: group g's 0/1 rank columns; the last row (index -1) is all zeros,
    # a base row's mask.
    masks: torch.Tensor

    def serves(self, groups: tuple[EngineAdapter, ...]) -> bool:
        return len(groups) == len(self.groups) and all(
            a is b for a, b in zip(groups, self.groups, strict=True)
        )


# The decode batch's plan and the prefill's alternate on every admission: keep both.
PLANS_KEPT = 2


class LoraLinear(nn.Module):
    """`base` plus, per row, that row's adapter's low-rank product for (layer, module)."""

    def __init__(self, base: nn.Linear, layer: int, module: str, rows: LoraRows) -> None:
        super().__init__()
        self.base = base
        self.key = (layer, module)
        self._rows = rows
        self._plans: list[_Plan] = []  # most recently used first
        self._mask = torch.zeros(0)  # [rows, 1, sum r]
        self._mask_for: tuple[int, _Plan | None] = (-1, None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base(x)
        rows = self._rows
        if not rows.groups:
            return y
        plan = self._plan(rows.groups)
        if plan.a is None or plan.b is None:
            return y  # no adapter in this batch targets this layer
        if self._mask_for[0] != rows.version or self._mask_for[1] is not plan:
            self._mask = plan.masks[rows.row_group].to(x.dtype)
            self._mask_for = (rows.version, plan)
        hidden = F.linear(x, plan.a) * self._mask
        return y + F.linear(hidden, plan.b)

    def _plan(self, groups: tuple[EngineAdapter, ...]) -> _Plan:
        for index, plan in enumerate(self._plans):
            if plan.serves(groups):
                if index:
                    self._plans.insert(0, self._plans.pop(index))
                return plan
        a_parts, b_parts, segments, start = [], [], [], 0
        for group, adapter in enumerate(groups):
            pair = adapter.weights.get(self.key)
            if pair is not None:
                a_parts.append(pair[0])
                b_parts.append(pair[1])
                segments.append((group, start, start + pair[0].shape[0]))
                start += pair[0].shape[0]
        # One adapter (every prefill, a single-adapter batch): its own tensors, no copy.
        a = a_parts[0] if len(a_parts) == 1 else torch.cat(a_parts) if a_parts else None
        b = b_parts[0] if len(b_parts) == 1 else torch.cat(b_parts, dim=1) if b_parts else None
        # Adapters are converted in float32; the engine may run in bfloat16.
        dtype = self.base.weight.dtype
        a = None if a is None else a.to(dtype)
        b = None if b is None else b.to(dtype)
        masks = torch.zeros(len(groups) + 1, 1, start)
        for group, first, end in segments:
            masks[group, 0, first:end] = 1
        plan = _Plan(groups, a, b, masks)
        self._plans = [plan, *self._plans[: PLANS_KEPT - 1]]
        return plan


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
