"""The generation parameters every native route accepts, built from `parameters`."""

from __future__ import annotations

from typing import Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from tritonbox_common import parameters as p
from tritonbox_common.guided import GuidedDecoding

MAX_MESSAGES = 256

# "Exactly one of prompt and messages" stated in the JSON schema, so that generated clients and
# contract tests (schemathesis) know it: either a prompt and no messages (absent or null), or
# messages and no prompt. The two branches exclude each other, so anyOf says "exactly one".
_PROMPT_OR_MESSAGES: dict[str, Any] = {
    "anyOf": [
        {
            "required": ["prompt"],
            "properties": {"prompt": {"type": "string"}, "messages": {"type": "null"}},
        },
        {
            "required": ["messages"],
            "properties": {"messages": {"type": "array"}, "prompt": {"type": "null"}},
        },
    ]
}


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: Literal["system", "user", "assistant"]
    content: str = Field(max_length=p.MAX_PROMPT_CHARS)


class GenerationInput(BaseModel):
    """A prompt (or chat messages) and how to answer it."""

    model_config = ConfigDict(extra="forbid", json_schema_extra=_PROMPT_OR_MESSAGES)

    prompt: p.Prompt | None = Field(default=None, description="The text to continue.")
    messages: list[ChatMessage] | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_MESSAGES,
        description="A chat instead of a prompt; the model's chat template turns it into one.",
    )
    max_tokens: int = p.MAX_TOKENS.field()
    temperature: float = p.TEMPERATURE.field()
    top_p: float = p.TOP_P.field()
    top_k: int = p.TOP_K.field()
    repetition_penalty: float = p.REPETITION_PENALTY.field()
    presence_penalty: float = p.PRESENCE_PENALTY.field()
    frequency_penalty: float = p.FREQUENCY_PENALTY.field()
    min_tokens: int = p.MIN_TOKENS.field()
    seed: int | None = p.SEED.field()
    beam_width: int = p.BEAM_WIDTH.field()
    ignore_eos: bool = p.IGNORE_EOS.field()
    stop_words_list: p.WordList | None = p.STOP_WORDS.field()
    bad_words_list: p.WordList | None = p.BAD_WORDS.field()
    adapter: p.AdapterName | None = p.ADAPTER.field()
    guided_decoding: GuidedDecoding | None = p.GUIDED_DECODING.field()

    @model_validator(mode="after")
    def _prompt_or_messages(self) -> Self:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give either `prompt` or `messages`, not both and not neither")
        return self

    def sent(self) -> dict[str, Any]:
        """The parameters as the client sent them (defaults left out)."""
        return self.model_dump(mode="json", exclude_unset=True)
