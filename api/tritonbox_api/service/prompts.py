"""A request's prompts as the engine gets them: token ids, from text or as the client sent them.

The api sends the `tensorrt_llm` step token ids itself (prepare.py says why), so a prompt given as
token ids (OpenAI's and vLLM's completions accept them; evaluation harnesses send them) reaches
the engine as exactly those ids, never decoded and tokenised again: a harness that scores
`echo` log-probs gets the values of the tokens it sent. Their text, for `echo` and the row, is
the tokenizer's decoding of them. The ensemble's preprocessing step takes text only; it is for
Triton's own clients and is not on this path.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from tritonbox_api.protocol.errors import invalid
from tritonbox_api.service.engine_context import EngineContext
from tritonbox_common.errors import RequestError
from tritonbox_common.tokenization import PromptTooLongError, encode_prompt

# Prompts up to this many characters are tokenised on the event loop: a fast tokenizer takes
# well under the cost of handing the work to a thread and back under a burst of requests (the
# hop waits for the loop, which is busy relaying other streams), so a thread only pays for
# prompts long enough to stall every other stream noticeably (docs/benchmark-api-changes.md).
INLINE_TOKENIZE_MAX_CHARS = 2_000


@dataclass(frozen=True)
class PromptInput:
    """One prompt of a request: its text, and its token ids when the client sent ids."""

    text: str
    ids: list[int] | None = None  # None: the text is tokenised (prepare)
    field: str = "prompt"  # how the client names it in errors: `prompt`, `prompt[2]`


def chat_prompt(tokenizer: Any, messages: list[dict[str, str]]) -> str:
    if not getattr(tokenizer, "chat_template", None):
        raise invalid("messages", "this model has no chat template; send a `prompt` instead")
    try:
        return str(
            tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        )
    except Exception as error:  # the template itself may reject a conversation (roles, order)
        raise invalid("messages", f"the model's chat template refused them: {error}") from None


def _too_long(field: str, count: int, limit: int) -> Exception:
    return invalid(
        field,
        f"{count} tokens is longer than the engine's max input of {limit} tokens (MAX_INPUT_LEN)",
    )


def _prompt_ids(context: EngineContext, prompt: str, field: str) -> list[int]:
    try:
        ids = encode_prompt(context.tokenizer, prompt, context.info.max_input_len)
    except PromptTooLongError as error:  # counted once: a long prompt's tokens cost the api CPU
        raise _too_long(field, error.tokens, context.info.max_input_len) from None
    except RequestError:
        count = len(context.tokenizer.encode(prompt))
        raise _too_long(field, count, context.info.max_input_len) from None
    return [int(i) for i in ids]


async def prompt_ids(context: EngineContext, prompt: str, field: str = "prompt") -> list[int]:
    """The prompt's token ids; 422 when it is longer than the engine accepts."""
    if len(prompt) <= INLINE_TOKENIZE_MAX_CHARS:
        return _prompt_ids(context, prompt, field)
    # Tokenising a long prompt takes milliseconds: keep it off the event loop.
    return await asyncio.to_thread(_prompt_ids, context, prompt, field)


def checked_ids(context: EngineContext, ids: list[int], field: str) -> list[int]:
    """Token ids as sent, checked: each a token of the vocabulary, no more than MAX_INPUT_LEN."""
    vocabulary = len(context.tokenizer)
    for position, token in enumerate(ids):
        if token >= vocabulary:
            raise invalid(
                field,
                f"token id {token} at position {position} is not in the vocabulary "
                f"(ids 0 to {vocabulary - 1})",
            )
    if len(ids) > context.info.max_input_len:
        raise _too_long(field, len(ids), context.info.max_input_len)
    return ids


def prompt_inputs(context: EngineContext, prompts: list[str | list[int]]) -> list[PromptInput]:
    """Each prompt of a request with the name errors give it; token ids checked and decoded."""
    inputs = []
    for index, prompt in enumerate(prompts):
        field = "prompt" if len(prompts) == 1 else f"prompt[{index}]"
        if isinstance(prompt, str):
            inputs.append(PromptInput(prompt, field=field))
            continue
        ids = checked_ids(context, prompt, field)
        # Special tokens kept: the text echoes what the ids are (a harness's prefix token too).
        text = str(context.tokenizer.decode(ids, skip_special_tokens=False))
        inputs.append(PromptInput(text, ids, field))
    return inputs
