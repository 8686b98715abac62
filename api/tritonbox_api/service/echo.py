"""What OpenAI's `echo` asks of the engine (docs/api.md, "echo"): the prompt's log-probs from
its prefill, and for `max_tokens` 0 (`prompt_only`) a request that generates nothing returned.

The cpu engine answers TritonBox's compact `return_prompt_log_probs` and takes
`request_output_len` 0; TensorRT-LLM 0.20 answers `return_context_logits` (an engine built with
`gather_context_logits`), scored by the api (tritonbox_common/prompt_log_probs.py), and is sent 1
for a prompt-only request, its token dropped (vLLM's way: that 0.20 accepts 0 is not verified).
Either way a prompt longer than ECHO_MAX_PROMPT_TOKENS is not scored (`check_length`): the
context logits TensorRT-LLM sends are prompt x vocabulary floats.
"""

from __future__ import annotations

from tritonbox_api.protocol.errors import ApiError
from tritonbox_api.triton_gateway import EngineInfo


def check(info: EngineInfo, *, echo: bool, logprobs: int | None) -> None:
    """400 naming `echo` when the engine cannot give the prompt's log-probs."""
    if echo and logprobs is not None and not (info.prompt_log_probs or info.context_logits):
        raise ApiError(
            400,
            "echo: the prompt's log-probs need the engine's context logits, and this "
            "TensorRT-LLM engine was built without --gather_context_logits (docs/gpu.md)",
            param="echo",
        )


def check_length(limit: int, prompt_tokens: int, *, echo: bool, logprobs: int | None) -> None:
    """400 naming `echo` when the prompt is longer than ECHO_MAX_PROMPT_TOKENS (`limit`)."""
    if echo and logprobs is not None and prompt_tokens > limit:
        raise ApiError(
            400,
            f"echo: with logprobs the prompt may be at most {limit} tokens "
            f"(ECHO_MAX_PROMPT_TOKENS), got {prompt_tokens}",
            param="echo",
        )


def engine_request(
    info: EngineInfo,
    sampling: dict[str, float | int | bool],
    max_tokens: int,
    *,
    echo: bool,
    prompt_only: bool,
    logprobs: int | None,
) -> tuple[int, bool]:
    """Add the prompt-score inputs to `sampling`; the engine's max tokens and whether its
    answer is streamed (TensorRT-LLM repeats the context logits in every streamed response)."""
    stream = True
    if (echo and logprobs is not None) or (prompt_only and info.prompt_log_probs):
        if info.prompt_log_probs:
            sampling["return_prompt_log_probs"] = True
        else:
            sampling["return_context_logits"] = True
            stream = False
    if prompt_only:
        max_tokens = 0 if info.prompt_log_probs else 1
    return max_tokens, stream
