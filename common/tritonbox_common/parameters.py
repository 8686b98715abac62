"""Every generation parameter, defined once: name, default, limits and a plain-language hint.

The api's request models build their fields from these (so validation and the OpenAPI schema
agree), the playground builds its controls and hints from them, and the README's table is
generated from them. Limits that depend on the engine (max_tokens, min_tokens, beam_width) have
a static bound here and are checked against the running engine's settings by the service, which
names the setting in its message.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import Field, StringConstraints

from tritonbox_common.guided import MAX_GUIDE_CHARS

MAX_WORDS = 32  # per stop-word or bad-word list
MAX_WORD_CHARS = 256
# Tokens in one stop or bad word (each spelling of it, word_lists.py): checked by the api with
# the engine's tokenizer, after the characters; GET /v1/limits shows it.
MAX_WORD_TOKENS = 32
MAX_PROMPT_CHARS = 200_000  # a first, cheap bound; the token count is checked against the engine


@dataclass(frozen=True)
class Parameter:
    name: str
    default: Any
    hint: str
    ge: float | None = None
    le: float | None = None
    engine_limit: str | None = None  # the engine setting that bounds it further, if any
    size_limit: str | None = None  # for lists: how many items, how long each

    @property
    def description(self) -> str:
        """The hint, and for lists their size limits: the OpenAPI schema's description."""
        return f"{self.hint} Limits: {self.size_limit}." if self.size_limit else self.hint

    def field(self, **overrides: Any) -> Any:
        """A pydantic Field with this parameter's default, limits and description."""
        options: dict[str, Any] = {"default": self.default, "description": self.description}
        if self.ge is not None:
            options["ge"] = self.ge
        if self.le is not None:
            options["le"] = self.le
        options.update(overrides)
        return Field(**options)

    def limits(self) -> str:
        parts = []
        if self.ge is not None:
            parts.append(f"≥ {_number(self.ge)}")
        if self.le is not None:
            parts.append(f"≤ {_number(self.le)}")
        if self.engine_limit:
            parts.append(f"≤ {self.engine_limit}")
        if self.size_limit:
            parts.append(self.size_limit)
        return ", ".join(parts)


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


MAX_TOKENS = Parameter(
    "max_tokens",
    50,
    "Longest answer, in tokens (about ¾ of a word each).",
    ge=1,
    engine_limit="MAX_OUTPUT_LEN",
)
TEMPERATURE = Parameter(
    "temperature",
    0.7,
    "Randomness: 0 always picks the most likely next token (same answer every time); "
    "higher gives more varied answers.",
    ge=0.0,
    le=2.0,
)
TOP_P = Parameter(
    "top_p",
    0.95,
    "Pick only among the most likely tokens that together reach this probability (1 = all).",
    ge=0.0,
    le=1.0,
)
TOP_K = Parameter(
    "top_k",
    0,
    "Pick only among this many most likely tokens (0 = no limit, 1 = always the most likely).",
    ge=0,
    le=1000,
)
REPETITION_PENALTY = Parameter(
    "repetition_penalty",
    1.0,
    "Above 1 discourages repeating tokens already written; 1 = off.",
    ge=0.01,
    le=2.0,
)
PRESENCE_PENALTY = Parameter(
    "presence_penalty",
    0.0,
    "Positive values push towards new topics (penalise any token already used once).",
    ge=-2.0,
    le=2.0,
)
FREQUENCY_PENALTY = Parameter(
    "frequency_penalty",
    0.0,
    "Positive values penalise tokens by how often they already appeared.",
    ge=-2.0,
    le=2.0,
)
MIN_TOKENS = Parameter(
    "min_tokens",
    0,
    "Do not stop before this many tokens (stop words still end the answer).",
    ge=0,
    engine_limit="max_tokens",
)
SEED = Parameter(
    "seed",
    None,
    "Same seed + same settings = same answer; leave empty for a random one.",
    ge=0,
    le=2**63 - 1,
)
BEAM_WIDTH = Parameter(
    "beam_width",
    1,
    "Beam search width (1 = off); needs an engine built for it and cannot stream.",
    ge=1,
    le=64,
    engine_limit="MAX_BEAM_WIDTH",
)
IGNORE_EOS = Parameter(
    "ignore_eos",
    False,
    "Keep writing past the model's end of answer, up to max_tokens (stop words still end it).",
)
_WORD_LIMITS = (
    f"≤ {MAX_WORDS} words of 1–{MAX_WORD_CHARS} characters and ≤ {MAX_WORD_TOKENS} tokens each"
)
STOP_WORDS = Parameter(
    "stop_words_list",
    None,
    "The answer ends before any of these (they are never shown in the output).",
    size_limit=_WORD_LIMITS,
)
BAD_WORDS = Parameter(
    "bad_words_list",
    None,
    "Words the model may never write.",
    size_limit=_WORD_LIMITS,
)
# Structured output: TensorRT-LLM's guide (guided.py). The OpenAI routes take OpenAI's
# `response_format` and vLLM's guided_* fields instead and translate them into this.
GUIDED_DECODING = Parameter(
    "guided_decoding",
    None,
    "Make the answer follow a format: any JSON, a JSON schema, a regular expression or a grammar.",
    size_limit=f"guide_type json, json_schema, regex or ebnf_grammar; guide ≤ {MAX_GUIDE_CHARS} "
    "characters",
)

# Not a sampling parameter (so in none of the tuples below): which registered LoRA adapter of
# the base model answers, by name (`input.adapter`; on the OpenAI routes, `model`).
ADAPTER = Parameter(
    "adapter",
    None,
    "A fine-tune of the model (a LoRA adapter registered on the api); none = the base model.",
)
# What an adapter may be called: safe in a URL path, a file name and an OpenAI `model` field.
ADAPTER_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
AdapterName = Annotated[str, StringConstraints(pattern=ADAPTER_NAME_PATTERN)]

SAMPLING_PARAMETERS = (
    TEMPERATURE,
    TOP_P,
    TOP_K,
    REPETITION_PENALTY,
    PRESENCE_PENALTY,
    FREQUENCY_PENALTY,
    MIN_TOKENS,
    SEED,
)
# ignore_eos is no engine input of its own: it sets the engine's `end_id` to -1 (no end id),
# as TensorRT-LLM's own `ignore_eos` does (tensorrt_llm/executor/worker.py).
ALL_PARAMETERS = (
    MAX_TOKENS, *SAMPLING_PARAMETERS, BEAM_WIDTH, IGNORE_EOS, STOP_WORDS, BAD_WORDS,
    GUIDED_DECODING,
)  # fmt: skip

Word = Annotated[str, StringConstraints(min_length=1, max_length=MAX_WORD_CHARS)]
WordList = Annotated[list[Word], Field(max_length=MAX_WORDS)]
Prompt = Annotated[str, StringConstraints(min_length=1, max_length=MAX_PROMPT_CHARS)]
