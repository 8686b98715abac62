"""Prefilling the prompts that arrive together in one forward pass.

Prefilled one at a time, 16 requests that arrive at once wait for each other in turn: the last
one's first token came after 16 prompt passes, each of which streams every weight through the
cores once more. Prefilled together they share one pass.

The prompts are right-padded to the longest. Attention is causal, so a prompt's tokens never see
the padding after them: each row's keys, values and last hidden state are those of the prompt
alone (the padding's own positions are computed and thrown away). Nothing else in a Llama layer
mixes rows.

What differs is the number of rows in each matrix product. oneDNN's bfloat16 kernels sum a
product of more than 32 rows in an order that depends on the row count (seen on this machine's
AMX kernels; up to 32 rows, as in a decode step, the order is fixed). A prompt alone is
therefore prefilled as twin rows through the model's forward, exactly as generate()'s reference
does (scheduler.py); a shared pass moves each prompt's values within bfloat16's rounding:
tests/triton/engine/test_prefill.py checks the rows against each prompt alone to that
precision, and the engine's answers against generate() token for token (docs/cpu-engine.md).

Only requests that need nothing but the next token go together: a request with a LoRA adapter,
or one that wants its prompt's log-probs (every position's logits), is prefilled alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from transformers import DynamicCache

from . import prompt_logprobs
from .kv_batch import Layers, prefilled_layers
from .params import SamplingParams

# Rows × longest prompt of one shared pass: a pass's activations grow with it, and a long
# prompt is better prefilled alone than holding up the short ones it came with.
BATCH_TOKENS = 1024


def shareable(params: SamplingParams, has_adapter: bool) -> bool:
    """Whether a request may share its prefill with others."""
    return not has_adapter and not prompt_logprobs.wanted(params) and params.max_tokens > 0


def groups(
    prompts: Sequence[Sequence[int]], budget: int = BATCH_TOKENS, most_padding: int | None = None
) -> list[list[int]]:
    """Indexes of `prompts`, in order, cut into runs of at most `budget` padded tokens; with
    `most_padding`, a prompt joins a run only where that adds at most so many tokens of
    padding (a pass's padded positions cost what its prompts' own do)."""
    runs: list[list[int]] = []
    longest = 0  # the last run's longest prompt: the run is that times its length, padded
    for index, prompt in enumerate(prompts):
        run = runs[-1] if runs else []
        wider = max(longest, len(prompt))
        added = wider * (len(run) + 1) - longest * len(run) - len(prompt)  # padding it adds
        fits = bool(run) and wider * (len(run) + 1) <= budget
        if fits and (most_padding is None or added <= most_padding):
            run.append(index)
            longest = wider
        else:
            runs.append([index])
            longest = len(prompt)
    return runs


def right_padded(prompts: Sequence[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """The prompts as one [rows, longest] batch padded on the right (with token 0: no prompt
    position sees it), and each one's last position."""
    longest = max(len(prompt) for prompt in prompts)
    ids = torch.tensor([[*prompt, *[0] * (longest - len(prompt))] for prompt in prompts])
    return ids, torch.tensor([len(prompt) - 1 for prompt in prompts])


def own_layers(layers: Layers, prompts: Sequence[Sequence[int]]) -> list[Layers]:
    """Each prompt's own keys and values ([1, heads, its length, dim]) out of a shared pass's."""
    return [
        [(keys[row : row + 1, :, : len(prompt)], values[row : row + 1, :, : len(prompt)])
         for keys, values in layers]
        for row, prompt in enumerate(prompts)
    ]  # fmt: skip


@torch.inference_mode()
def prefill_together(
    model: Any, prompts: Sequence[Sequence[int]]
) -> tuple[torch.Tensor, list[Layers]]:
    """One pass of the model's forward over two or more prompts: each one's next-token logits
    [rows, vocab] (the model's dtype) and its own keys and values."""
    if len(prompts) < 2:
        raise ValueError("a shared prefill needs two prompts or more")
    ids, ends = right_padded(prompts)
    cache = DynamicCache()  # every key of every layer: windows are masked, not cut (windowed.py)
    hidden = model.model(input_ids=ids, past_key_values=cache, use_cache=True).last_hidden_state
    logits = model.lm_head(hidden[torch.arange(len(prompts)), ends])
    return logits, own_layers(prefilled_layers(cache), prompts)
