"""The prompt's own log-probs, from the logits of the prefill (OpenAI's `echo` with `logprobs`).

Two ways to ask, both answered from the same prefill:

- TensorRT-LLM's `return_context_logits` -> `context_logits` [batch, input_len, vocab] (FP32
  here, the engine's dtype): the logits at every prompt position, as NVIDIA's backend returns
  them from an engine built with `gather_context_logits`.
- TritonBox's compact extension `return_prompt_log_probs` -> `prompt_log_probs` [batch,
  input_len - 1]: the log-prob of prompt token i+1 given tokens 0..i, the log-softmax of the
  logits at position i (the first token has none: nothing comes before it); with
  `num_top_logprobs` N > 0 also `prompt_top_token_ids` INT32 / `prompt_top_log_probs` FP32
  [batch, input_len - 1, N], the N most likely tokens at each of those positions. This is 4 bytes
  (plus 8 N) per position where the full logits are 4 × vocab (196 KB for a 49152-token vocab).

The distribution is the model's own: the log-softmax of the raw logits, before any sampling
setting (penalties, temperature, bans apply to generated tokens only), as vLLM's prompt
log-probs. Kept out of the scheduler so that the scheduler only asks for every position's logits
(`logits_to_keep`) and hands them here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .params import SamplingParams


@dataclass(frozen=True, slots=True)
class PromptScores:
    """What one request asked for of its prompt, ready to send (numpy, batch dimension 1)."""

    tensors: dict[str, np.ndarray[Any, Any]]


def wanted(params: SamplingParams) -> bool:
    """Whether the prefill must keep the logits of every prompt position."""
    return params.return_context_logits or params.return_prompt_log_probs


def logits_to_keep(params: SamplingParams) -> int:
    """transformers' `logits_to_keep`: 0 keeps every position, 1 only the last (generation)."""
    return 0 if wanted(params) else 1


def score(logits: torch.Tensor, prompt: list[int], params: SamplingParams) -> PromptScores:
    """`logits`: the prefill's [input_len, vocab] for one sequence, in the model's dtype."""
    tensors: dict[str, np.ndarray[Any, Any]] = {}
    if params.return_context_logits:
        tensors["context_logits"] = logits.float().numpy()[np.newaxis].astype(np.float32)
    if params.return_prompt_log_probs:
        # Position i predicts token i+1: the last position predicts the first generated token.
        logprobs = torch.log_softmax(logits[:-1].float(), dim=-1)
        following = torch.tensor(prompt[1:], dtype=torch.long)
        chosen = logprobs.gather(1, following[:, None])[:, 0]
        tensors["prompt_log_probs"] = chosen.numpy()[np.newaxis].astype(np.float32)
        top_n = min(params.num_top_logprobs, logprobs.shape[-1])
        if top_n > 0:
            top = torch.topk(logprobs, top_n, dim=-1)
            tensors["prompt_top_token_ids"] = top.indices.numpy()[np.newaxis].astype(np.int32)
            tensors["prompt_top_log_probs"] = top.values.numpy()[np.newaxis].astype(np.float32)
    return PromptScores(tensors)


def send(sink: Any, logits: torch.Tensor, prompt: list[int], params: SamplingParams) -> None:
    """Score the prompt and hand it to the request's sink (`TokenSink.on_prompt`), before any
    token of the request: the sink sends the scores with its first response."""
    sink.on_prompt(score(logits, prompt, params))
