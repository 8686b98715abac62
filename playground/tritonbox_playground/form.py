"""The playground's form: which parameters it shows, and how its values become the api's
`input` and come back from a saved prediction.

Names, defaults, limits and hints all come from tritonbox_common.parameters (one definition for
the api, its docs and this page); only the labels are the playground's own.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tritonbox_common import parameters as p
from tritonbox_playground.adapters import ADAPTER, BASE, adapter_name, sent
from tritonbox_playground.api_client import EngineLimits, PlaygroundError, PredictionView
from tritonbox_playground.json_output import JSON_OUTPUT, json_input, json_restored

PROMPT_MODE, CHAT_MODE = "Prompt", "Chat"
MODES = (PROMPT_MODE, CHAT_MODE)

# Shown first, with Run; the others sit under "More settings".
MAIN_NUMBERS = (p.MAX_TOKENS, p.TEMPERATURE, p.TOP_P, p.TOP_K, p.REPETITION_PENALTY)
MORE_NUMBERS = (p.PRESENCE_PENALTY, p.FREQUENCY_PENALTY, p.MIN_TOKENS)
WORD_LISTS = (p.STOP_WORDS, p.BAD_WORDS)
INTEGERS = frozenset({p.MAX_TOKENS.name, p.TOP_K.name, p.MIN_TOKENS.name, p.SEED.name})

# Adapter first: Compare names the settings that differ in this order, the model first.
LABELS = {
    ADAPTER: "Adapter",
    p.MAX_TOKENS.name: "Max tokens",
    p.TEMPERATURE.name: "Temperature",
    p.TOP_P.name: "Top-p",
    p.TOP_K.name: "Top-k",
    p.REPETITION_PENALTY.name: "Repetition penalty",
    p.PRESENCE_PENALTY.name: "Presence penalty",
    p.FREQUENCY_PENALTY.name: "Frequency penalty",
    p.MIN_TOKENS.name: "Min tokens",
    p.SEED.name: "Seed",
    p.STOP_WORDS.name: "Stop words",
    p.BAD_WORDS.name: "Bad words",
    JSON_OUTPUT: "JSON output",
}

# The order of the form's values everywhere: components, event inputs, restore outputs.
FIELDS: tuple[str, ...] = (
    "mode",
    "system_prompt",
    "prompt",
    ADAPTER,
    *(parameter.name for parameter in MAIN_NUMBERS),
    p.SEED.name,
    *(parameter.name for parameter in WORD_LISTS),
    *(parameter.name for parameter in MORE_NUMBERS),
    JSON_OUTPUT,
)

_ESCAPES = {"\\n": "\n", "\\t": "\t", "\\\\": "\\"}
_UNESCAPES = {value: key for key, value in _ESCAPES.items()}


# Above this, a bound is "any whole number" to a person: nobody types a 19-digit seed.
_UNBOUNDED = 2**31


def _plain(value: float) -> str:
    return f"{int(value):,}" if float(value).is_integer() else f"{value:g}"


def _engine_bound(parameter: p.Parameter, limits: EngineLimits | None) -> str | None:
    """The engine-dependent upper bound, as a number (or a label) a person can act on."""
    if parameter.engine_limit == "MAX_OUTPUT_LEN":
        return None if limits is None else _plain(limits.max_output_tokens)
    if parameter.engine_limit in LABELS:
        return LABELS[parameter.engine_limit]  # "up to Max tokens"
    return None


def plain_limits(parameter: p.Parameter, limits: EngineLimits | None = None) -> str:
    """The range the api accepts, in words and this engine's numbers: "From 1 to 512."."""
    if parameter.size_limit is not None:
        most = p.MAX_WORDS if limits is None else limits.max_words
        chars = p.MAX_WORD_CHARS if limits is None else limits.max_word_chars
        return f"Up to {most} words, each up to {chars} characters."
    low = parameter.ge
    high = parameter.le if parameter.le is not None and parameter.le < _UNBOUNDED else None
    bound = _engine_bound(parameter, limits)
    if parameter.engine_limit and bound is None:
        return f"At least {_plain(low or 0)}; this engine's maximum will show once the api answers."
    top = bound if bound is not None else (None if high is None else _plain(high))
    if low is not None and top is not None:
        from_engine = bound is not None and parameter.engine_limit not in LABELS
        return f"From {_plain(low)} to {top}" + (" on this engine." if from_engine else ".")
    if parameter.name == p.SEED.name:
        return "Any whole number from 0, e.g. 42."
    return "" if low is None else f"At least {_plain(low)}."


def hint(parameter: p.Parameter, extra: str = "", limits: EngineLimits | None = None) -> str:
    """The parameter's plain-language hint, then the range the api accepts."""
    return " ".join(
        part for part in (f"{parameter.hint}{extra}", plain_limits(parameter, limits)) if part
    )


def prompt_hint(limits: EngineLimits | None) -> str:
    if limits is None:
        return "As long as this engine allows (the number shows once the api answers)."
    tokens = limits.max_input_tokens
    return (
        f"Up to {tokens:,} tokens (about {tokens * 3 // 4:,} words) on this engine, "
        "system prompt included."
    )


def missing_prompt(values: dict[str, Any]) -> str | None:
    """What to tell a person who pressed Run with nothing to send (None: there is something)."""
    if str(values.get("prompt") or "").strip():
        return None
    if values.get("mode") == CHAT_MODE:
        return "Write your message in the “Your message” box first: nothing was sent."
    return "Write a prompt first (the text the model should continue): nothing was sent."


def plain_error(message: str) -> str:
    """The api's message with a parameter's name replaced by the label the page shows."""
    name, colon, rest = message.partition(":")
    return f"{LABELS[name]}:{rest}" if colon and name in LABELS else message


def words_from_text(text: str | None) -> list[str]:
    """One word per line; empty lines skipped, `\\n` and `\\t` for a line break and a tab."""
    words = []
    for line in (text or "").splitlines():
        word = re.sub(r"\\[nt\\]", lambda m: _ESCAPES[m.group(0)], line.strip())
        if word:
            words.append(word)
    return words


def text_from_words(words: Sequence[str] | None) -> str:
    return "\n".join(re.sub(r"[\n\t\\]", lambda m: _UNESCAPES[m.group(0)], w) for w in words or ())


def _seed(value: Any) -> int | None:
    text = str(value if value is not None else "").strip()
    if not text:
        return None
    if not text.isdigit():
        raise PlaygroundError(
            f"Seed: write a whole number (e.g. 42) or leave it empty, not {text!r}."
        )
    return int(text)


def _number(name: str, value: Any) -> int | float | None:
    if value is None or value == "":
        return None  # left empty: the api's default applies
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise PlaygroundError(f"{LABELS[name]}: write a number, not {value!r}.") from None
    return int(number) if name in INTEGERS and number.is_integer() else number


def generation_input(
    values: dict[str, Any], earlier: Sequence[dict[str, str]] = ()
) -> dict[str, Any]:
    """The api's `input` for the form's values (limits are the api's to check and explain).

    `earlier`: the messages of a restored chat between its system prompt and its last question.
    """
    prompt = str(values.get("prompt") or "")
    body: dict[str, Any] = {}
    if values.get("mode") == CHAT_MODE:
        system = str(values.get("system_prompt") or "").strip()
        messages = [{"role": "system", "content": system}] if system else []
        messages += [dict(message) for message in earlier]
        messages.append({"role": "user", "content": prompt})
        body["messages"] = messages
    else:
        body["prompt"] = prompt
    adapter = sent(values.get(ADAPTER))
    if adapter:
        body[ADAPTER] = adapter
    for parameter in (*MAIN_NUMBERS, *MORE_NUMBERS):
        number = _number(parameter.name, values.get(parameter.name))
        if number is not None:
            body[parameter.name] = number
    seed = _seed(values.get(p.SEED.name))
    if seed is not None:
        body[p.SEED.name] = seed
    for parameter in WORD_LISTS:
        words = words_from_text(values.get(parameter.name))
        if words:
            body[parameter.name] = words
    return body | json_input(values.get(JSON_OUTPUT))


@dataclass(frozen=True)
class Restored:
    values: dict[str, Any]
    earlier: list[dict[str, str]]


def defaults() -> dict[str, Any]:
    values: dict[str, Any] = {"mode": PROMPT_MODE, "system_prompt": "", "prompt": ""}
    values[ADAPTER] = BASE
    for parameter in (*MAIN_NUMBERS, *MORE_NUMBERS):
        values[parameter.name] = parameter.default
    values[p.SEED.name] = "" if p.SEED.default is None else str(p.SEED.default)
    for parameter in WORD_LISTS:
        values[parameter.name] = text_from_words(parameter.default)
    return values | {JSON_OUTPUT: False}


def from_prediction(prediction: PredictionView) -> Restored:
    """The form as it was for `prediction`: every parameter as applied (the input as sent for
    predictions saved without them), so running it again asks the same."""
    source = {**prediction.input, **prediction.applied}
    values = defaults()
    earlier: list[dict[str, str]] = []
    messages = source.get("messages")
    if isinstance(messages, list) and messages:
        chat = [
            {"role": str(m.get("role", "user")), "content": str(m.get("content", ""))}
            for m in messages
            if isinstance(m, dict)
        ]
        values["mode"] = CHAT_MODE
        if chat and chat[0]["role"] == "system":
            values["system_prompt"] = chat.pop(0)["content"]
        if chat and chat[-1]["role"] == "user":
            values["prompt"] = chat.pop()["content"]
        earlier = chat
    else:
        values["prompt"] = str(source.get("prompt") or "")
    values[ADAPTER] = adapter_name(prediction) or BASE
    for parameter in (*MAIN_NUMBERS, *MORE_NUMBERS):
        if source.get(parameter.name) is not None:
            values[parameter.name] = source[parameter.name]
    if source.get(p.SEED.name) is not None:
        values[p.SEED.name] = str(source[p.SEED.name])
    for parameter in WORD_LISTS:
        words = source.get(parameter.name)
        if isinstance(words, list):
            values[parameter.name] = text_from_words([str(w) for w in words])
    values[JSON_OUTPUT] = json_restored(source)
    return Restored(values=values, earlier=earlier)
