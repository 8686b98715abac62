"""What the page says about a prediction: its outcome, permalink and metrics, and its row in
the list of recent predictions. Markdown is built here, with every text from outside escaped."""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import datetime

from tritonbox_common.snippets import SHORT_SHA
from tritonbox_playground.api_client import PredictionView
from tritonbox_playground.form import text_from_words

_FINISH = {
    "stop": "the model finished its answer",
    "length": "it reached max tokens",
    "stop_word": "it reached a stop word",
    "canceled": "it was stopped",
    "error": "of an error",
}
RECENT_HEADERS = ["when", "status", "from", "prompt", "answer", "id"]


def escape(text: str) -> str:
    """`text` shown literally in Markdown: no links, emphasis or HTML of its own."""
    # Brackets cover links and images; the rest is emphasis, code, HTML, headings and tables.
    # Line breaks go: a line starting with "-", "1." or "#" would become a list or a heading.
    return re.sub(r"([\\`*_{}\[\]<>#|~])", r"\\\1", " ".join(text.splitlines()))


def error(message: str) -> str:
    return f"**Error:** {escape(message)}"


def hint(message: str) -> str:
    """A nudge, not a failure: `message` is the page's own Markdown."""
    return f"→ {message}"


def running(prediction_id: str | None) -> str:
    return "**Generating…**" + (f" (prediction `{prediction_id}`)" if prediction_id else "")


def _seconds(value: float | int | None) -> str:
    return "–" if value is None else f"{value:.2f} s"


def metrics(prediction: PredictionView) -> str:
    m = prediction.metrics
    rate = m.get("tokens_per_second")
    tokens = m.get("completion_tokens")
    prompt_tokens = m.get("prompt_tokens")
    parts = [
        f"time to first token **{_seconds(m.get('time_to_first_token_s'))}**",
        f"**{'–' if rate is None else f'{rate:.1f}'}** tokens/s",
        f"**{'–' if tokens is None else tokens}** tokens"
        + ("" if prompt_tokens is None else f" (prompt: {prompt_tokens})"),
        f"total **{_seconds(m.get('total_time_s'))}**",
    ]
    return " · ".join(parts)


def outcome(prediction: PredictionView) -> str:
    """Status, why it ended, the permalink and the metrics of a finished prediction."""
    why = _FINISH.get(prediction.finish_reason or "", "")
    if prediction.status == "succeeded":
        head = "**Done**" + (f": {why}." if why else ".")
    elif prediction.status == "canceled":
        head = "**Stopped.** The partial answer is saved."
    elif prediction.status == "failed":
        head = error(prediction.error or "the prediction failed")
    else:
        head = f"**{escape(prediction.status.capitalize())}…**"
    lines = [head, *words_notes(prediction)]
    web, made_by = prediction.urls.get("web"), adapter(prediction)
    if web:
        lines.append(f"Permalink: [{escape(web)}]({web})" + (f" · {made_by}" if made_by else ""))
    elif made_by:
        lines.append(f"Made with the {made_by}")
    lines.append(metrics(prediction))
    return "\n\n".join(lines)


def adapter(prediction: PredictionView) -> str:
    """Which fine-tune answered: "adapter **name** (sha256 `1a2b3c4d5e6f`)"; "" for the base."""
    made_by = prediction.adapter
    if made_by is None:
        return ""
    sha = made_by.sha256[:SHORT_SHA]
    digest = f" (sha256 `{sha}`)" if re.fullmatch(r"[0-9a-f]+", sha) else ""
    return f"adapter **{escape(made_by.name)}**{digest}"


def _quoted(words: Sequence[str]) -> str:
    # Written as in the form (\\n for a line break), so a blank-looking word is visible.
    return ", ".join(f"“{escape(text_from_words([word]))}”" for word in words)


def _words(prediction: PredictionView, name: str) -> list[str]:
    words = {**prediction.input, **prediction.applied}.get(name)
    return [str(word) for word in words] if isinstance(words, list) else []


def words_notes(prediction: PredictionView) -> list[str]:
    """What the stop words and bad words did to this answer, in plain words."""
    notes = []
    stops = _words(prediction, "stop_words_list")
    if prediction.finish_reason == "stop_word":
        # The api cuts the answer right before the stop word: it ended where the text ends.
        word = prediction.stop_word or (stops[0] if len(stops) == 1 else None)
        which = f"the stop word {_quoted([word])}" if word else f"one of {_quoted(stops)}"
        tokens = prediction.metrics.get("completion_tokens")
        notes.append(
            f"✂️ Ended by {which}: the answer stops right before it, after "
            f"{len(prediction.output):,} characters"
            + ("" if tokens is None else f" ({tokens} tokens)")
            + "; the stop word itself is not shown."
        )
        flat = " ".join(prediction.output.split())
        tail = flat if len(flat) <= 40 else "…" + flat[-39:]  # the answer's last words
        cut = _quoted([word]) if word else "the stop word"
        notes.append(f"Where: {escape(tail)} ✂ {cut}")
    elif stops and prediction.status == "succeeded":
        notes.append(f"Stop words {_quoted(stops)}: not reached.")
    bans = _words(prediction, "bad_words_list")
    if bans:
        notes.append(f"Banned (the model could not write them): {_quoted(bans)}.")
    return notes


def _short(text: str, limit: int = 60) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def _when(created_at: str | None) -> str:
    if not created_at:
        return ""
    try:
        moment = datetime.fromisoformat(created_at)
    except ValueError:
        return created_at
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC")


def prompt_of(prediction: PredictionView) -> str:
    """The prompt, or a chat's last message from the user (what was asked)."""
    for sent in (prediction.input, prediction.applied):
        messages = sent.get("messages")
        if isinstance(messages, list):
            asked = [m for m in messages if isinstance(m, dict) and m.get("role") == "user"]
            if asked:
                return str(asked[-1].get("content") or "")
        if sent.get("prompt"):
            return str(sent["prompt"])
    return ""


def recent_row(prediction: PredictionView) -> list[str]:
    return [
        _when(prediction.created_at),
        prediction.status,
        # Which fine-tune answered, so base and adapter runs of one prompt tell apart.
        prediction.source + (f" · {prediction.adapter.name}" if prediction.adapter else ""),
        _short(prompt_of(prediction)),
        _short(prediction.output),
        prediction.id,
    ]
