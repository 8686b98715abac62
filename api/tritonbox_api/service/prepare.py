"""Turn validated parameters into an engine request, checking the engine's own limits.

Pydantic has already checked types and static ranges; what needs the engine (the prompt's token
count, max_tokens against MAX_OUTPUT_LEN, each stop word's tokens) is checked here, with
messages that name the field, the limit and the value.
"""

from __future__ import annotations

import secrets
import uuid
from dataclasses import dataclass, replace
from typing import Any

from tritonbox_api.protocol.errors import ApiError, invalid
from tritonbox_api.service import echo as echo_rules
from tritonbox_api.service.adapters import AdapterSelection
from tritonbox_api.service.engine_context import EngineContext
from tritonbox_api.service.options import GenerationOptions
from tritonbox_api.service.prompts import PromptInput, chat_prompt, prompt_ids
from tritonbox_common import parameters as p
from tritonbox_common.client import GenerationRequest
from tritonbox_common.ensemble import ENGINE_MODEL
from tritonbox_common.prompt_log_probs import ECHO_MAX_PROMPT_TOKENS
from tritonbox_common.word_lists import encode_word_list, pack_word_ids


@dataclass(frozen=True)
class PreparedGeneration:
    request: GenerationRequest
    prompt_tokens: int
    applied: dict[str, Any]  # every parameter as the engine gets it
    stop_words: tuple[str, ...]
    adapter: AdapterSelection | None = None  # the LoRA adapter that answers; None: the base
    logprobs: int | None = None  # None: none; N: each token's log-prob and its N best rivals
    echo: bool = False  # the prompt's text (and with `logprobs` its tokens' entries) comes first
    prompt_only: bool = False  # echo with max_tokens 0: nothing generated is returned

    def with_adapter(self, adapter: AdapterSelection) -> PreparedGeneration:
        return replace(self, request=replace(self.request, lora=adapter.lora), adapter=adapter)

    def choice(self, index: int) -> PreparedGeneration:
        """The same request as choice `index` of several (OpenAI's `n`): an engine request of
        its own, seeded `seed + index` (mod 2**63), so a seeded request repeats all its choices
        and choice 0 is what the request alone would answer."""
        seed = (int(self.request.sampling["seed"]) + index) % 2**63
        request = replace(
            self.request,
            request_id=uuid.uuid4().hex,
            sampling={**self.request.sampling, "seed": seed},
        )
        return replace(self, request=request)


def _check_words(tokenizer: Any, field: str, words: list[str]) -> None:
    for index, word in enumerate(words):
        try:
            encode_word_list(tokenizer, [word])
        except ValueError as error:
            raise invalid(f"{field}[{index}]", str(error)) from None


async def prepare(
    options: GenerationOptions,
    context: EngineContext,
    *,
    max_beam_width: int,
    prompt_input: PromptInput | None = None,
    echo_max_prompt_tokens: int = ECHO_MAX_PROMPT_TOKENS,
) -> PreparedGeneration:
    """The engine request for `options`. `prompt_input`: the prompt when it is one of several
    or came as token ids (those go to the engine as sent, prompts.py), instead of
    `options.params.prompt`.

    The request is for the `tensorrt_llm` step itself, not the ensemble: the api has the
    prompt's ids already (it counts them) and decodes the output itself, so the ensemble's
    tokenising and per-token detokenising steps were paid for twice. Measured: half of Triton's
    CPU per token (docs/benchmark-direct-engine.md). The ensemble stays for Triton's own clients.
    """
    params = options.params  # its max_tokens may be clamped below
    logprobs, echo, prompt_only = options.logprobs, options.echo, options.prompt_only
    max_tokens_given = options.max_tokens_given
    limit = context.info.max_output_len
    if max_tokens_given is None:
        max_tokens_given = "max_tokens" in params.model_fields_set
    if not max_tokens_given and params.max_tokens > limit:
        # The default must work on every engine: a small one gets its own maximum instead.
        params = params.model_copy(update={"max_tokens": limit})
    if params.max_tokens > limit:
        raise invalid(
            "max_tokens", f"must be at most {limit} (MAX_OUTPUT_LEN), got {params.max_tokens}"
        )
    if params.min_tokens > params.max_tokens:
        raise invalid(
            "min_tokens",
            f"must be at most max_tokens ({params.max_tokens}), got {params.min_tokens}",
        )
    if params.beam_width > max_beam_width:
        raise invalid(
            "beam_width",
            f"must be at most {max_beam_width} (MAX_BEAM_WIDTH of this engine), "
            f"got {params.beam_width}",
        )
    if options.stream and params.beam_width > 1:
        raise invalid("beam_width", "streaming needs beam_width 1; set stream to false")
    # The prompt's own top alternatives come from TensorRT-LLM's context logits (scored here),
    # so only generated tokens' are missing on an engine without top log-probs.
    if logprobs and not context.info.top_logprobs and not prompt_only:
        raise ApiError(
            400,
            f"{options.logprobs_field}: this engine returns only the chosen token's log-prob "
            f"(TensorRT-LLM 0.20 has no top log-probs); send 0, got {logprobs}",
            param=options.logprobs_field,
        )
    if params.guided_decoding is not None and not context.info.guided_decoding:
        raise invalid(
            "guided_decoding",
            "this engine does not follow guides: a TensorRT-LLM engine needs xgrammar's "
            "tokenizer info in its folder (docs/gpu.md, 'Guided decoding')",
        )
    echo_rules.check(context.info, echo=echo, logprobs=logprobs)
    field = prompt_input.field if prompt_input is not None else "prompt"
    if params.messages is not None:
        messages = [m.model_dump() for m in params.messages]
        prompt = chat_prompt(context.tokenizer, messages)
    else:
        assert params.prompt is not None  # the model validator guarantees one of them
        prompt = params.prompt if prompt_input is None else prompt_input.text
    if prompt_input is not None and prompt_input.ids is not None:
        ids = prompt_input.ids  # checked against the vocabulary and MAX_INPUT_LEN already
    elif not prompt.strip():
        raise invalid(field, "is empty (only whitespace)")
    else:
        ids = await prompt_ids(context, prompt, field)
    echo_rules.check_length(echo_max_prompt_tokens, len(ids), echo=echo, logprobs=logprobs)
    stop_words = list(params.stop_words_list or [])
    bad_words = list(params.bad_words_list or [])
    _check_words(context.tokenizer, "stop_words_list", stop_words)
    _check_words(context.tokenizer, "bad_words_list", bad_words)

    # Every sampling parameter by its one definition; the seed is settled just below.
    sampling: dict[str, float | int | bool] = {
        q.name: getattr(params, q.name) for q in (*p.SAMPLING_PARAMETERS, p.BEAM_WIDTH)
    }
    if params.temperature == 0.0:
        # Temperature 0 means "always the most likely token" to users; engines spell it top_k 1.
        sampling["top_k"] = 1
    # A random seed is still recorded, so any answer can be reproduced from its prediction.
    seed = params.seed if params.seed is not None else secrets.randbelow(2**63)
    sampling["seed"] = seed
    if logprobs is not None:
        sampling["return_log_probs"] = True
        if logprobs and context.info.top_logprobs:  # an engine without the input refuses it
            sampling["num_top_logprobs"] = logprobs
    engine_max_tokens, engine_stream = echo_rules.engine_request(
        context.info, sampling, params.max_tokens,
        echo=echo, prompt_only=prompt_only, logprobs=logprobs,
    )  # fmt: skip
    # What the ensemble's preprocessing step adds: its default end and pad ids, the model's other
    # end ids as one-token stop words (an end, not a stop word: the api's text rule is for the
    # client's words), bad words as token ids with their variants.
    token_ids = context.token_ids
    sampling |= {"end_id": token_ids.end_id, "pad_id": token_ids.pad_id}
    extra_ends = [[end] for end in token_ids.extra_end_ids]
    if params.ignore_eos:
        # TensorRT-LLM's own `ignore_eos` (tensorrt_llm/executor/worker.py): end_id -1, an id no
        # token has, so nothing ends the answer but max_tokens and the client's stop words; the
        # model's other end ids are no stop words either.
        sampling["end_id"], extra_ends = -1, []
    request = GenerationRequest(
        model=ENGINE_MODEL,
        input_ids=ids,
        stop_word_ids=pack_word_ids(extra_ends) if extra_ends else None,
        bad_word_ids=encode_word_list(context.tokenizer, bad_words) if bad_words else None,
        prompt=prompt,
        max_tokens=engine_max_tokens,
        # The api streams from the engine (it buffers for non-streaming clients), except for
        # TensorRT-LLM's context logits, which every streamed response would carry again.
        stream=engine_stream,
        # Stop words stay here: the api's exact-text matcher is their one rule. The engine would
        # only see token ids, a looser rule that ended answers where the text does not appear;
        # the api stops the engine's request itself when its matcher finds a word.
        stop_words=(),
        bad_words=bad_words,
        sampling=sampling,
        # Structured output: TensorRT-LLM's guided-decoding inputs (both engines compile it).
        guide=(guided.guide_type, guided.guide) if (guided := params.guided_decoding) else None,
    )
    applied = {
        **params.model_dump(mode="json", exclude={"prompt", "messages"}),
        "seed": seed,
        "stop_words_list": stop_words,
        "bad_words_list": bad_words,
        "prompt": prompt if params.messages is None else None,
        "messages": [m.model_dump() for m in params.messages] if params.messages else None,
        "engine_prompt": prompt,
        **({"logprobs": logprobs} if logprobs is not None else {}),
        **({"echo": True} if echo else {}),
        **({"max_tokens": 0} if prompt_only else {}),
    }
    return PreparedGeneration(
        request=request,
        prompt_tokens=len(ids),
        applied=applied,
        stop_words=tuple(stop_words),
        logprobs=logprobs,
        echo=echo,
        prompt_only=prompt_only,
    )
