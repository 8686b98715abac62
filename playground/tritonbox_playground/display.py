"""What the page says about a prediction: its outcome, permalink and metrics, and its row in
the list of recent predictions. Markdown is built here, with every text from outside escaped."""

from __future__ import annotations

import re
from datetime import datetime

from tritonbox_playground.api_client import Prediction

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


def running(prediction_id: str | None) -> str:
    return "**Generating…**" + (f" (prediction `{prediction_id}`)" if prediction_id else "")


def _seconds(value: float | int | None) -> str:
    return "–" if value is None else f"{value:.2f} s"


def metrics(prediction: Prediction) -> str:
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


def outcome(prediction: Prediction) -> str:
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
    lines = [head]
    web = prediction.urls.get("web")
    if web:
        lines.append(f"Permalink: [{escape(web)}]({web})")
    lines.append(metrics(prediction))
    return "\n\n".join(lines)


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


def prompt_of(prediction: Prediction) -> str:
    """The prompt, or a chat's last message."""
    sent = {**prediction.input, **prediction.applied}
    messages = sent.get("messages")
    if isinstance(messages, list) and messages and isinstance(messages[-1], dict):
        return str(messages[-1].get("content", ""))
    return str(sent.get("prompt") or "")


def recent_row(prediction: Prediction) -> list[str]:
    return [
        _when(prediction.created_at),
        prediction.status,
        prediction.source,
        _short(prompt_of(prediction)),
        _short(prediction.output),
        prediction.id,
    ]
