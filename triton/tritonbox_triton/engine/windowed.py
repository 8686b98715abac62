"""Attention under a sliding window or with soft-capped scores (Mistral, Qwen2's windowed
layers, Gemma 2 and 3), where the engine's compiled and fused attentions (attention.py) do not
apply: a key is seen only by the queries less than `window` positions after it, and Gemma 2
caps every score at ±cap with `cap · tanh(score / cap)`.

Computed in float32, one explicit pass: the scores, the cap, the mask, the softmax and the
values product, as transformers' eager attention orders them (it keeps the products in the
model's dtype and only the softmax in float32; float32 throughout is closer to the float32 model
the engine's answers are measured against). Within the window and without a cap, layers keep
the fast attention: the window hides nothing until a row is longer than it.
"""

from __future__ import annotations

import torch


def needs_explicit(window: int | None, longest: int, softcap: float | None) -> bool:
    """Whether a layer's attention over rows of up to `longest` keys must come here."""
    return softcap is not None or (window is not None and longest > window)


def decode_allowed(valid: torch.Tensor, window: int | None) -> torch.Tensor:
    """A decode step's `valid` (bool [rows, columns], each row's keys from column 0, its new one
    last) less the keys past the window: [rows, 1, 1, columns] for `attend`."""
    if window is not None:
        lengths = valid.sum(1, keepdim=True)
        valid = valid & (torch.arange(valid.shape[1])[None, :] >= lengths - window)
    return valid[:, None, None, :]


def causal_allowed(length: int, window: int | None) -> torch.Tensor:
    """A prompt's causal mask within the window: [1, 1, length, length] for `attend`."""
    queries = torch.arange(length)[:, None]
    keys = torch.arange(length)[None, :]
    allowed = keys <= queries
    if window is not None:
        allowed = allowed & (queries - keys < window)
    return allowed[None, None]


def attend(
    query: torch.Tensor,  # [rows, heads, queries, dim]
    key: torch.Tensor,  # [rows, kv heads, keys, dim]
    value: torch.Tensor,
    allowed: torch.Tensor,  # bool, broadcast to [rows, heads, queries, keys]
    scaling: float,
    softcap: float | None,
) -> torch.Tensor:
    """[rows, heads, queries, dim] in the query's dtype."""
    groups = query.shape[1] // key.shape[1]
    keys = key.repeat_interleave(groups, 1).float()
    values = value.repeat_interleave(groups, 1).float()
    scores = torch.matmul(query.float(), keys.transpose(-1, -2)) * scaling
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.matmul(scores.softmax(-1), values).to(query.dtype)


def forward(
    query: torch.Tensor,  # [batch, heads, queries, dim]
    key: torch.Tensor,  # [batch, kv heads, keys, dim]
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,  # bool [batch, 1, queries, keys] (a decode step's)
    scaling: float,
    window: int | None,
    softcap: float | None,
) -> torch.Tensor:
    """The model forward's attention (attention.engine_attention) here: a prompt causal within
    the window, a decode step over its mask's keys within the window: [batch, queries, heads,
    dim], as transformers' attention functions return it."""
    batch, columns = key.shape[0], key.shape[2]
    if query.shape[2] > 1:
        allowed = causal_allowed(columns, window)
    else:
        valid = torch.ones(batch, columns, dtype=torch.bool)
        if attention_mask is not None:
            valid = attention_mask[:, 0, 0, :]
        allowed = decode_allowed(valid, window)
    return attend(query, key, value, allowed, scaling, softcap).transpose(1, 2).contiguous()
