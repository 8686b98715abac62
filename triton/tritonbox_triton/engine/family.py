"""What the written-out step (decode_step.py) must do differently for each model family, read
from the model's config and modules once at start.

- `llama`, `mistral`: Llama's layer (Mistral's sliding window, where set, on every layer);
- `qwen2`: biases on q, k and v; a window on the layers `layer_types` names, if enabled;
- `qwen3`: an RMSNorm over each head of q and k before RoPE;
- `gemma2`: Gemma's norms (`x · (1 + w)` in float32), a norm after attention and around the
  MLP, a scaled embedding, GELU (tanh), soft-capped attention scores and logits, and
  sliding-window layers;
- `gemma3_text`: Gemma 2's layer without soft-capping, with q/k norms and a RoPE table per
  layer type (local and global).

Every family runs the engine's batching, adapters (which take the model's forward), guides,
log-probs and word lists unchanged: those live outside the step. A model of another family, or
one with a setting the step does not follow, is decoded by the model's own forward: `unsupported`
names why, and the engine logs it at start with what it costs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from . import linear_kernel
from .dtype import NATIVE_BF16_FLAGS, cpu_flags

LLAMA_NORMS = frozenset({"llama", "mistral", "qwen2", "qwen3"})
GEMMA_NORMS = frozenset({"gemma2", "gemma3_text"})
ACTIVATIONS = frozenset({"silu", "gelu_pytorch_tanh"})


def unsupported(model: Any) -> str | None:
    """Why this model's decode step cannot be written out here, or None when it can."""
    config = model.config
    kind = config.model_type
    native = NATIVE_BF16_FLAGS & cpu_flags()
    if model.dtype == torch.bfloat16 and not native and linear_kernel.current() is None:
        # PyTorch emulates bfloat16 here, and oneDNN's prepacked products round otherwise than
        # the forward's: without linear_kernel.py's products the step would not give its bits.
        return "bfloat16 on a CPU without native bfloat16 or AVX2 (CPU_DTYPE=auto: float32 here)"
    if kind not in LLAMA_NORMS | GEMMA_NORMS:
        known = ", ".join(sorted(LLAMA_NORMS | GEMMA_NORMS))
        return f"model_type {kind!r} (the step knows {known})"
    if getattr(config, "mlp_bias", False):
        return "biased MLP projections"
    if kind != "qwen2" and getattr(config, "attention_bias", False):
        return "biased attention projections"
    activation = getattr(config, "hidden_activation", None) or config.hidden_act
    if activation not in ACTIVATIONS:
        return f"activation {activation!r}"
    scaling = getattr(config, "rope_scaling", None) or {}
    parameters = getattr(config, "rope_parameters", None) or {}
    types = [parameters.get(t, {}) or {} for t in ("full_attention", "sliding_attention")]
    rope_types = {p.get("rope_type") for p in [scaling, parameters, *types] if isinstance(p, dict)}
    if rope_types - {None, "default"}:
        return f"RoPE scaling {sorted(map(str, rope_types - {None, 'default'}))}"
    return None


@dataclass(frozen=True)
class Family:
    """The step's choices for one model (`of`)."""

    name: str
    gemma_norms: bool  # x · (1 + w) in float32, and norms after attention and around the MLP
    activation: str  # "silu" or "gelu_pytorch_tanh"
    qk_norm: bool  # an RMSNorm over each head of q and k before RoPE
    windows: tuple[int | None, ...]  # each layer's sliding window, None: full attention
    rope_types: tuple[str | None, ...]  # each layer's RoPE table (None: the model's one table)
    attention_softcap: float | None
    logits_softcap: float | None

    @property
    def windowed(self) -> bool:
        return any(window is not None for window in self.windows)


def of(model: Any) -> Family:
    config = model.config
    layers = config.num_hidden_layers
    layer_types = list(getattr(config, "layer_types", None) or ["full_attention"] * layers)
    window = getattr(config, "sliding_window", None)
    if config.model_type == "qwen2" and not getattr(config, "use_sliding_window", False):
        window = None
    if config.model_type == "mistral":  # no layer_types: the window, where set, is everywhere
        layer_types = ["sliding_attention"] * layers
    windows = tuple(window if kind == "sliding_attention" else None for kind in layer_types)
    per_type = config.model_type == "gemma3_text"
    return Family(
        name=config.model_type,
        gemma_norms=config.model_type in GEMMA_NORMS,
        activation=getattr(config, "hidden_activation", None) or config.hidden_act,
        qk_norm=hasattr(model.model.layers[0].self_attn, "q_norm"),
        windows=windows,
        rope_types=tuple(layer_types) if per_type else (None,) * layers,
        attention_softcap=getattr(config, "attn_logit_softcapping", None),
        logits_softcap=getattr(config, "final_logit_softcapping", None),
    )
