"""Random inputs for the start-up checks that a kernel's sums are PyTorch's.

The order of a kernel's sums depends on the shapes (and threads), not on the values, but two
orders round alike on most inputs of one magnitude: one random try said yes where a real
prompt's bits differed. Magnitudes spread over 2^±8 make another order show.
A kernel that sums in its own order is checked against float64 instead (`near_exact`).
"""

from __future__ import annotations

import torch


def probe_input(
    shape: tuple[int, ...],
    generator: torch.Generator,
    *,
    spread: bool = True,
    dtype: torch.dtype = torch.bfloat16,
) -> torch.Tensor:
    """Normal values of `shape` in `dtype`, each scaled by 2^k for k in [-8, 8] if `spread`."""
    x = torch.randn(shape, generator=generator)
    if spread:
        x = x * torch.exp2(torch.randint(-8, 9, shape, generator=generator).float())
    return x.to(dtype)


def near_exact(
    got: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> bool:
    """Whether `got` is `F.linear(x, weight, bias)` within bfloat16's rounding of float64's."""
    exact = torch.nn.functional.linear(
        x.double(), weight.double(), None if bias is None else bias.double()
    )
    return torch.allclose(got.double(), exact, rtol=2**-7, atol=1e-3 * x.shape[-1])
