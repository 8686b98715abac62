"""The prompt's own log-probs, from the prefill's hidden states (OpenAI's `echo` with `logprobs`).

Two ways to ask, both answered from the same prefill:

- TensorRT-LLM's `return_context_logits` -> `context_logits` [batch, input_len, vocab] (FP32
  here, the engine's dtype): the logits at every prompt position, as NVIDIA's backend returns
  them from an engine built with `gather_context_logits`. The answer itself is input_len × vocab
  × 4 bytes, so a prompt is refused past CONTEXT_LOGITS_MAX_BYTES (`check`).
- TritonBox's compact extension `return_prompt_log_probs` -> `prompt_log_probs` [batch,
  input_len - 1]: the log-prob of prompt token i+1 given tokens 0..i, the log-softmax of the
  logits at position i (the first token has none: nothing comes before it); with
  `num_top_logprobs` N > 0 also `prompt_top_token_ids` INT32 / `prompt_top_log_probs` FP32
  [batch, input_len - 1, N], the N most likely tokens at each of those positions. This is 4 bytes
  (plus 8 N) per position where the full logits are 4 × vocab (196 KB for a 49152-token vocab).

The prefill keeps only its last position's logits, as for any request; the decoder's final hidden
states (input_len × hidden, a few KB a token) are kept instead (`final_hidden`), and projected
through the float32 head (float_logits.py) a chunk of positions at a time (`score`). Each chunk
is reduced to what was asked before the next one is projected, so the memory the scores take is
a few chunks of logits (CHUNK_BYTES), not the prompt's: 2,048 positions at a 49152-token vocabulary
were 0.8 GB of float32 logits for the twin rows the prefill runs (running_batch.py). A row's
logits are the same bits alone or among others (tests/triton/engine/test_float_logits.py), so
the chunks change no value.

The distribution is the model's own: the log-softmax of the raw logits, before any sampling
setting (penalties, temperature, bans apply to generated tokens only), as vLLM's prompt
log-probs.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from tritonbox_common.errors import RequestError

from .params import SamplingParams

# Float32 logits projected at once: 8 MiB is 42 positions at a 49152-token vocabulary, 16 at
# Llama 3's 128256. Measured on SmolLM2 (tests/triton/engine/test_prompt_logprobs_memory.py), a
# 2,048-token prompt's scores raise the prefill's peak by about 8 chunks (the head's output, the
# log-softmax, top-k's work and the allocator's slack): 30 MiB at 4 MiB chunks, 250 at 32.
# Smaller chunks pass over the head's weights more often (once a chunk).
CHUNK_BYTES = 8 << 20
# `context_logits` is the whole [input_len, vocab] float32 tensor, built here and copied once more
# into Triton's response: 512 MiB is 2,730 positions at 49152 tokens, 1,046 at 128256.
CONTEXT_LOGITS_MAX_BYTES = 512 << 20
_MIB = 1 << 20


@dataclass(frozen=True, slots=True)
class PromptScores:
    """What one request asked for of its prompt, ready to send (numpy, batch dimension 1)."""

    tensors: dict[str, np.ndarray[Any, Any]]


def wanted(params: SamplingParams) -> bool:
    """Whether the prefill must keep the final hidden states of every prompt position."""
    return params.return_context_logits or params.return_prompt_log_probs


def check(params: SamplingParams, prompt_len: int, vocab_size: int) -> None:
    """RequestError when the request's `context_logits` would be over CONTEXT_LOGITS_MAX_BYTES."""
    size = 4 * prompt_len * vocab_size
    if params.return_context_logits and size > CONTEXT_LOGITS_MAX_BYTES:
        most = CONTEXT_LOGITS_MAX_BYTES // (4 * vocab_size)
        raise RequestError(
            f"return_context_logits: {prompt_len} prompt tokens x {vocab_size} float32 logits "
            f"are {size // _MIB} MiB, over the engine's limit of "
            f"{CONTEXT_LOGITS_MAX_BYTES // _MIB} MiB ({most} tokens at this vocabulary); "
            "return_prompt_log_probs gives the prompt's log-probs in 4 bytes a token"
        )


def chunk_positions(vocab_size: int) -> int:
    """Positions projected together: CHUNK_BYTES of float32 logits, one position at least."""
    return max(1, CHUNK_BYTES // (4 * vocab_size))


@contextmanager
def final_hidden(model: Any, keep: bool) -> Iterator[list[torch.Tensor]]:
    """Inside: the decoder's last hidden states ([rows, input_len, hidden], after its final norm)
    of each forward pass of `model`, appended to the list; nothing unless `keep`."""
    kept: list[torch.Tensor] = []
    if not keep:
        yield kept
        return

    def hook(module: Any, args: Any, output: Any) -> None:
        kept.append(output.last_hidden_state)

    handle = model.get_decoder().register_forward_hook(hook)
    try:
        yield kept
    finally:
        handle.remove()


def logits(model: Any, hidden: torch.Tensor) -> torch.Tensor:
    """Float32 logits of `hidden` [positions, hidden] as the model's forward computes them: its
    head (float_logits.py), then Gemma 2's soft cap, where it has one (transformers' order)."""
    out: torch.Tensor = model.lm_head(hidden)
    cap = getattr(model.config, "final_logit_softcapping", None)
    if cap is not None:
        out = torch.tanh(out / cap) * cap
    return out.float()


@torch.inference_mode()
def score(
    model: Any,
    hidden: torch.Tensor,
    prompt: list[int],
    params: SamplingParams,
    chunk: int | None = None,
) -> PromptScores:
    """`hidden`: the prefill's final hidden states [input_len, hidden] for one sequence.
    `chunk`: positions projected at once (default: `chunk_positions` of the model's vocabulary)."""
    vocab = int(model.lm_head.weight.shape[0])
    step = chunk or chunk_positions(vocab)
    length = len(prompt)
    context = np.empty((1, length, vocab), np.float32) if params.return_context_logits else None
    # Position i predicts token i+1: the last position predicts the first generated token.
    scored = max(length - 1, 0) if params.return_prompt_log_probs else 0
    top_n = min(params.num_top_logprobs, vocab)
    chosen = np.empty((1, scored), np.float32)
    top_ids = np.empty((1, scored, top_n), np.int32)
    top_values = np.empty((1, scored, top_n), np.float32)
    following = torch.tensor(prompt[1:], dtype=torch.long)
    for start in range(0, length if context is not None else scored, step):
        end = min(start + step, length)
        part = logits(model, hidden[start:end])
        if context is not None:
            context[0, start:end] = part.numpy()
        rows = min(end, scored) - start
        if rows <= 0:
            continue
        logprobs = torch.log_softmax(part[:rows], dim=-1)
        picked = logprobs.gather(1, following[start : start + rows, None])[:, 0]
        chosen[0, start : start + rows] = picked.numpy()
        if top_n > 0:
            top = torch.topk(logprobs, top_n, dim=-1)
            top_ids[0, start : start + rows] = top.indices.numpy()
            top_values[0, start : start + rows] = top.values.numpy()
    tensors: dict[str, np.ndarray[Any, Any]] = {}
    if context is not None:
        tensors["context_logits"] = context
    if params.return_prompt_log_probs:
        tensors["prompt_log_probs"] = chosen
        if top_n > 0:
            tensors["prompt_top_token_ids"] = top_ids
            tensors["prompt_top_log_probs"] = top_values
    return PromptScores(tensors)


def send(
    sink: Any, model: Any, hidden: torch.Tensor, prompt: list[int], params: SamplingParams
) -> None:
    """Score the prompt and hand it to the request's sink (`TokenSink.on_prompt`), before any
    token of the request: the sink sends the scores with its first response."""
    sink.on_prompt(score(model, hidden, prompt, params))
