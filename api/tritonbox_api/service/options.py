"""A generation request's options, built once by its route and read by every step after it.

One object instead of a dozen keyword arguments handed on by hand through each signature from
the route (routes/common.py) to the prediction's start (runner.py) and the engine request
(prepare.py): a new option is added here and where it is read, nowhere in between.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from tritonbox_api.db.models import Source
from tritonbox_api.protocol.generation import GenerationInput
from tritonbox_api.service.prompts import PromptInput


@dataclass(frozen=True)
class GenerationOptions:
    params: GenerationInput  # what to generate, validated (every sampling parameter)
    source: Source  # the route it came by, for the row
    stream: bool  # the client reads the answer as it comes
    sent: dict[str, Any] = field(default_factory=dict)  # the body as the client sent it, saved
    # Whether the client chose max_tokens: None for whether `params` has it set (a route that
    # builds `params` itself knows better). A default max_tokens may be clamped to the engine's
    # MAX_OUTPUT_LEN; one the client chose is refused above it.
    max_tokens_given: bool | None = None
    # None: no log-probs; N: each token's log-prob and (N > 0) its N most likely rivals.
    logprobs: int | None = None
    logprobs_field: str = "logprobs"  # what the client called N, for the errors that name it
    n: int = 1  # choices of each prompt, each an engine request of its own
    echo: bool = False  # the prompt's text (with `logprobs` its tokens' entries) comes first
    prompt_only: bool = False  # echo with max_tokens 0: the prompt is only scored
    # The completions' prompts (several, or token ids), each with `n` choices, prompt-major;
    # None: `params`' one prompt (or its messages).
    prompts: list[PromptInput] | None = None

    def with_params(self, **update: Any) -> GenerationOptions:
        """The same options with these parameters changed (the seed settled by the first
        prompt, for the others)."""
        return replace(self, params=self.params.model_copy(update=update))
