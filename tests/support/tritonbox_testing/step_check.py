"""The written-out decode step (engine/decode_step.py) against the model's own forward over the
same batch cache: one step's logits and the keys and values it writes, bit for bit."""

from __future__ import annotations

from collections.abc import Callable

import torch
from transformers import PreTrainedModel

from tritonbox_triton.engine.decode_step import DecodeStep
from tritonbox_triton.engine.kv_batch import BatchedKVCache


def step_equals_forward(model: PreTrainedModel, step: DecodeStep, batch: BatchedKVCache,
                        ids: Callable[[int], torch.Tensor]) -> None:  # fmt: skip
    """One decode step of `batch` with `ids(rows)` as the rows' tokens: the step's logits
    equal the forward's, and it wrote the same keys and values; then the batch advances."""
    valid, positions = batch.decode_inputs()
    tokens = ids(batch.shown_rows)
    with torch.inference_mode():
        keys, values = batch.key_buffers.clone(), batch.value_buffers.clone()
        eager = model(
            input_ids=tokens[:, None], attention_mask=valid[:, None, None, :],
            position_ids=positions, past_key_values=batch.cache, use_cache=True,
        ).logits[:, -1]  # fmt: skip
        logits = step(tokens, positions[:, 0], valid, keys, values)
    assert torch.equal(logits, eager)
    assert torch.equal(keys, batch.key_buffers) and torch.equal(values, batch.value_buffers)
    batch.advance()
