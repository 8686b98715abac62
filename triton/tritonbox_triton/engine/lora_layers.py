"""Many LoRA adapters in one forward pass: each targeted nn.Linear adds its rows' own low-rank
product on top of the untouched base weights (nothing is merged).

For each adapter in the batch a layer computes the product in float32 (in a decode step as a
two-row product for each row, as generate()'s twin rows have it; in a prefill for every row) and
adds it to the base output of that adapter's rows before rounding back to the model's dtype:

    y[rows of a] = base(x)[rows of a] + (x[rows of a] @ A_aᵀ) @ B_aᵀ

That is peft's arithmetic for one adapter, so a row answers the same beside other adapters as
alone, also in bfloat16. (Concatenating every adapter's A and B into one product with a 0/1 mask,
punica-style, saves matmuls but sums each row's product among other adapters' zeros in another
order: in bfloat16 a mixed batch then drifted from the solo answers within 20 tokens.) A base
row gets nothing added and is bit-for-bit the base model's.
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
    """One layer's weights for one set of adapters: (group, A [r, in], B [out, r]) for each
    adapter that targets this layer."""

    groups: tuple[EngineAdapter, ...]  # held, so no adapter here is freed while planned
    parts: list[tuple[int, torch.Tensor, torch.Tensor]]

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
        self._row_index: dict[int, torch.Tensor] = {}  # group -> its rows, for `_indexed_for`
        self._indexed_for = -1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base(x)
        rows = self._rows
        if not rows.groups:
            return y
        plan = self._plan(rows.groups)
        if not plan.parts:
            return y  # no adapter in this batch targets this layer
        if self._indexed_for != rows.version:
            self._row_index = {
                g: (rows.row_group == g).nonzero().flatten() for g in range(len(rows.groups))
            }
            self._indexed_for = rows.version
        out, x32 = y.float(), x.float()
        step = x.dim() == 3 and x.shape[1] == 1  # a decode step: one token a sequence
        for group, a, b in plan.parts:
            index = self._row_index[group]
            if not index.numel():
                continue
            if step:
                delta = _as_twins(_as_twins(x32.index_select(0, index), a), b)
                out.index_add_(0, index, delta)
            else:
                # Every row's product, then this adapter's rows: a product over one row would
                # take PyTorch's one-row kernel, which rounds otherwise (kv_batch.py).
                delta = F.linear(F.linear(x32, a), b)
                out.index_add_(0, index, delta.index_select(0, index))
        return out.to(y.dtype)

    def _plan(self, groups: tuple[EngineAdapter, ...]) -> _Plan:
        for index, plan in enumerate(self._plans):
            if plan.serves(groups):
                if index:
                    self._plans.insert(0, self._plans.pop(index))
                return plan
        parts = []
        for group, adapter in enumerate(groups):
            pair = adapter.weights.get(self.key)
            if pair is not None:
                parts.append((group, pair[0], pair[1]))
        plan = _Plan(groups, parts)
        self._plans = [plan, *self._plans[: PLANS_KEPT - 1]]
        return plan


def _as_twins(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """`F.linear(x, weight)` of a decode step's rows [rows, 1, in], each row's as generate()'s
    twin rows have it: a product of two rows. float32 products round by their row count on
    some CPUs (an AMD EPYC's: one row, two or three, four or more differ in the last bits; the
    AMX machine's agree), so one product over the whole batch gave a row other bits than its
    solo run; a batch of two-row products gives each row the solo bits, whatever the batch."""
    rows, _, width = x.shape
    transposed = weight.t()
    return torch.bmm(x.expand(rows, 2, width), transposed.expand(rows, *transposed.shape))[:, :1]


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
