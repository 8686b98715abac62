"""OpenAI-compatible request and response models (the subset this engine can honour).

Options the engine cannot honour are refused with a message rather than ignored: `n` above
MAX_CHOICES, `best_of` > 1, `suffix` (by validation), log-probs with `n` > 1, and top
log-probs (`top_logprobs` or completions' `logprobs` above 0) of generated tokens on an engine
without them (TensorRT-LLM 0.20 returns the chosen token's log-prob only); every refusal is a
400 naming the client's field (routes/openai_errors.py). `n` up to MAX_CHOICES, `logprobs` and
`top_logprobs` (chat), `logprobs` 0-5 and `echo` (completions; with `max_tokens` 0 the prompt is
only scored, as vLLM's) are honoured. Completions' `prompt` is a string, a list of strings, a list
of token ids or a list of lists of them (OpenAI's and vLLM's four forms); each prompt of a list is
its own set of `n` choices, numbered prompt-major as OpenAI numbers them.
TritonBox's extra sampling options (top_k, repetition_penalty, min_tokens, bad_words) and
vLLM's `ignore_eos` are accepted as the SDK's `extra_body`, as vLLM does; structured output
(`response_format`, vLLM's guided_* and `structured_outputs`) is in structured.py.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from tritonbox_api.protocol.errors import FieldError
from tritonbox_api.protocol.generation import MAX_MESSAGES, ChatMessage, GenerationInput
from tritonbox_api.protocol.structured import StructuredFields
from tritonbox_common import parameters as p

MAX_CHOICES = 8  # `n`: choices per request, each an engine request of its own
MAX_TOP_LOGPROBS = 20  # chat's top_logprobs, as OpenAI's
MAX_COMPLETION_LOGPROBS = 5  # completions' logprobs, as OpenAI's
# Completions: prompts x n engine requests at most, under one prediction, each taking one of
# the MAX_CONCURRENT_REQUESTS slots (as `n`'s choices do): enough for an evaluation harness's
# batches (lm-evaluation-harness sends batch_size prompts a request), and a bound on what one
# request, which runs whatever its size when it is alone, can ask of the engine.
MAX_PROMPT_CHOICES = 32
# A prompt as token ids (OpenAI's and vLLM's); each id is checked against the vocabulary once
# the tokenizer is known (service/prompts.py), the length against MAX_INPUT_LEN.
TokenIds = Annotated[
    list[Annotated[int, Field(ge=0)]], Field(min_length=1, max_length=p.MAX_PROMPT_CHARS)
]
PromptForm = str | list[int]  # one prompt: its text or its token ids
# A placeholder for GenerationInput's required text while a token-id prompt's text (decoded by
# the route, which has the tokenizer) is not known yet; replaced before anything reads it.
IDS_PLACEHOLDER = "(token ids)"


class StreamOptions(BaseModel):
    include_usage: bool = False


class _OpenAIRequest(StructuredFields):
    model_config = ConfigDict(extra="forbid")

    model: str
    max_tokens: int = p.MAX_TOKENS.field()
    temperature: float = p.TEMPERATURE.field()
    top_p: float = p.TOP_P.field()
    presence_penalty: float = p.PRESENCE_PENALTY.field()
    frequency_penalty: float = p.FREQUENCY_PENALTY.field()
    seed: int | None = p.SEED.field()
    stop: p.Word | p.WordList | None = Field(default=None, description=p.STOP_WORDS.description)
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(
        default=1,
        ge=1,
        le=MAX_CHOICES,
        description="How many answers (choices); each is its own engine request, seeded "
        "seed + index when a seed is given.",
    )
    user: str | None = Field(default=None, max_length=256)
    # TritonBox extras (extra_body in the openai SDK).
    top_k: int = p.TOP_K.field()
    repetition_penalty: float = p.REPETITION_PENALTY.field()
    min_tokens: int = p.MIN_TOKENS.field()
    bad_words: p.WordList | None = Field(default=None, description=p.BAD_WORDS.description)
    ignore_eos: bool = p.IGNORE_EOS.field()  # vLLM's name and meaning

    def _generation(self, **prompt: Any) -> GenerationInput:
        stop = [self.stop] if isinstance(self.stop, str) else self.stop
        # The OpenAI request declares every sampling parameter under the same name.
        sampling = {q.name: getattr(self, q.name) for q in p.SAMPLING_PARAMETERS}
        return GenerationInput(
            **prompt,
            **sampling,
            # Completions' 0 (echo: the prompt only) reaches the engine as prepare() decides.
            max_tokens=max(1, self.max_tokens),
            stop_words_list=stop,
            bad_words_list=self.bad_words,
            ignore_eos=self.ignore_eos,
        )


class CompletionRequest(_OpenAIRequest):
    prompt: (
        p.Prompt
        | TokenIds
        | Annotated[list[p.Prompt], Field(min_length=1, max_length=MAX_PROMPT_CHOICES)]
        | Annotated[list[TokenIds], Field(min_length=1, max_length=MAX_PROMPT_CHOICES)]
    ) = Field(
        description="The text to continue: a string, a list of token ids, or a list of either "
        f"(each prompt its own `n` choices; prompts x n at most {MAX_PROMPT_CHOICES})."
    )
    # 0 only with echo (vLLM's and OpenAI's way to score a text): checked in `generation()`.
    max_tokens: int = p.MAX_TOKENS.field(
        ge=0, description=p.MAX_TOKENS.description + " 0 with `echo`: score the prompt only."
    )
    echo: bool = Field(
        default=False,
        description="Return the prompt before the completion; with `logprobs`, the prompt's "
        "tokens' log-probs too (the first token's are null).",
    )
    logprobs: int | None = Field(
        default=None,
        ge=0,
        le=MAX_COMPLETION_LOGPROBS,
        description="Return each token's log-prob and this many most likely alternatives.",
    )
    best_of: Literal[1] | None = None
    suffix: None = None

    @property
    def prompt_only(self) -> bool:
        """`echo` with `max_tokens` 0: the prompt scored, nothing generated (vLLM's rule)."""
        return self.echo and self.max_tokens == 0

    def prompts(self) -> list[PromptForm]:
        """Every prompt of the request, in order: a text or a list of token ids each."""
        if isinstance(self.prompt, str):
            return [self.prompt]
        if isinstance(self.prompt[0], int):
            return [[int(i) for i in self.prompt]]
        return list(self.prompt)

    def generation(self) -> GenerationInput:
        """The parameters, with the first prompt's text (IDS_PLACEHOLDER for token ids)."""
        if self.max_tokens == 0 and not self.echo:
            # vLLM's answer too ("max_tokens must be at least 1"): nothing to return.
            raise FieldError("max_tokens", "must be at least 1 (0 only with echo), got 0")
        prompts = self.prompts()
        if len(prompts) * self.n > MAX_PROMPT_CHOICES:
            raise FieldError(
                "prompt",
                f"{len(prompts)} prompts x n={self.n} is more than "
                f"{MAX_PROMPT_CHOICES} choices a request",
            )
        first = prompts[0]
        return self._generation(prompt=first if isinstance(first, str) else IDS_PLACEHOLDER)

    def top_logprobs_asked(self) -> tuple[int | None, str]:
        """None without log-probs, else how many alternatives; and the field that said so."""
        return self.logprobs, "logprobs"


class TextPart(BaseModel):
    type: Literal["text"]
    text: str = Field(max_length=p.MAX_PROMPT_CHARS)


class OpenAIChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")  # `name` and the like carry no meaning here

    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart] = Field(max_length=p.MAX_PROMPT_CHARS)

    def plain(self) -> ChatMessage:
        text = (
            self.content
            if isinstance(self.content, str)
            else "".join(part.text for part in self.content)
        )
        return ChatMessage(role="system" if self.role == "developer" else self.role, content=text)


class ChatCompletionRequest(_OpenAIRequest):
    messages: list[OpenAIChatMessage] = Field(min_length=1, max_length=MAX_MESSAGES)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool | None = Field(default=None, description="Return each token's log-prob.")
    top_logprobs: int | None = Field(
        default=None,
        ge=0,
        le=MAX_TOP_LOGPROBS,
        description="With logprobs: this many most likely alternatives of each token.",
    )

    def generation(self) -> GenerationInput:
        generation = self._generation(messages=[m.plain() for m in self.messages])
        if self.max_completion_tokens is not None:
            generation.max_tokens = self.max_completion_tokens
        return generation

    def top_logprobs_asked(self) -> tuple[int | None, str]:
        """None without log-probs, else how many alternatives; and the field that said so."""
        if not self.logprobs:
            if self.top_logprobs:
                raise FieldError("top_logprobs", "needs logprobs set to true")
            return None, "top_logprobs"
        return self.top_logprobs or 0, "top_logprobs"


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "tritonbox"
    root: str | None = None  # as vLLM: the base model's name, or an adapter's source
    parent: str | None = None  # an adapter's base model (vLLM's field); None for the base


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
