"""A finished batch as people read it: one row per input line (its prompt, the answer, why it
ended, its permalink, any error) for the page's table and the CSV download; and the progress
bar with an estimate of the time left while it runs."""

from __future__ import annotations

import csv
import html
import io
import json
from dataclasses import astuple, dataclass
from typing import Any

from tritonbox_playground.batch_client import BatchView

HEADERS = ["row", "prompt", "output", "finish_reason", "permalink", "error"]


@dataclass(frozen=True)
class ResultRow:
    row: str  # the line's custom_id: the CSV's row number for a CSV made here
    prompt: str
    output: str
    finish_reason: str
    permalink: str
    error: str


def _lines(content: bytes) -> list[dict[str, Any]]:
    # The api writes these files; a line that is not an object is skipped, not a failure.
    lines = []
    for raw in content.splitlines():
        try:
            value = json.loads(raw)
        except ValueError:
            continue
        if isinstance(value, dict):
            lines.append(value)
    return lines


def _text(content: Any) -> str:
    """A message's content: a string, or OpenAI's list of text parts."""
    if isinstance(content, list):
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return "" if content is None else str(content)


def prompt_of(body: Any) -> str:
    """What a line asked: a chat's last user message, or a completion's prompt."""
    if not isinstance(body, dict):
        return ""
    messages = body.get("messages")
    if isinstance(messages, list):
        asked = [m for m in messages if isinstance(m, dict) and m.get("role") == "user"]
        return _text(asked[-1].get("content")) if asked else ""
    prompt = body.get("prompt")
    return prompt if isinstance(prompt, str) else json.dumps(prompt) if prompt else ""


def _answer(body: Any) -> tuple[str, str]:
    """(the first choice's text, its finish reason) of a route's answer."""
    choices = body.get("choices") if isinstance(body, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return "", ""
    first = choices[0]
    message = first.get("message")
    text = _text(message.get("content")) if isinstance(message, dict) else _text(first.get("text"))
    return text, str(first.get("finish_reason") or "")


def _error(line: dict[str, Any], response: dict[str, Any]) -> str:
    """The line's error: its own (expired, cancelled, stopped) or the route's 4xx/5xx body's."""
    found = line.get("error")
    if isinstance(found, dict) and found.get("message"):
        return str(found["message"])
    status = response.get("status_code")
    if isinstance(status, int) and status >= 400:
        body = response.get("body")
        detail = body.get("error") if isinstance(body, dict) else None
        message = detail.get("message") if isinstance(detail, dict) else None
        return f"{status}: {message}" if message else f"the api answered {status}"
    return ""


def result_rows(
    input_file: bytes, output_file: bytes, error_file: bytes, public_url: str
) -> list[ResultRow]:
    """Every answered line, in the input file's order (lines without a custom_id last)."""
    prompts: dict[str, str] = {}
    for line in _lines(input_file):
        prompts.setdefault(str(line.get("custom_id")), prompt_of(line.get("body")))
    order = {custom_id: index for index, custom_id in enumerate(prompts)}
    rows = []
    for line in _lines(output_file) + _lines(error_file):
        custom_id = str(line.get("custom_id") or "")
        response = line.get("response") if isinstance(line.get("response"), dict) else {}
        assert isinstance(response, dict)  # for mypy: checked above
        text, finish = _answer(response.get("body"))
        request_id = response.get("request_id")
        link = f"{public_url}/p/{request_id}" if isinstance(request_id, str) and request_id else ""
        rows.append(
            ResultRow(
                custom_id, prompts.get(custom_id, ""), text, finish, link, _error(line, response)
            )
        )
    return sorted(rows, key=lambda row: order.get(row.row, len(order)))


def results_csv(rows: list[ResultRow]) -> str:
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(HEADERS)
    writer.writerows(astuple(row) for row in rows)
    return out.getvalue()


def table(rows: list[ResultRow], limit: int) -> list[list[str]]:
    """The page's table: the first `limit` rows, each permalink a link (Markdown)."""
    return [
        [r.row, r.prompt, r.output, r.finish_reason, _link(r.permalink), r.error]
        for r in rows[:limit]
    ]


def _link(url: str) -> str:
    return f"[{url.rsplit('/', 1)[-1]}]({url})" if url else ""


def time_left(done: int, total: int, elapsed_s: float) -> float | None:
    """Seconds left at the pace so far (None: no line has ended yet, so no pace to go by)."""
    if done <= 0 or elapsed_s <= 0:
        return None
    return max(0.0, (total - done) * elapsed_s / done)


def _duration(seconds: float) -> str:
    seconds = round(seconds)
    if seconds < 90:
        return f"{seconds} s"
    if seconds < 5400:
        return f"{round(seconds / 60)} min"
    return f"{seconds / 3600:.1f} h"


def progress(batch: BatchView, now: float) -> str:
    """The progress bar and its line of text (HTML; every number is the api's)."""
    counts = batch.request_counts
    done, total = counts.done, counts.total
    started = batch.in_progress_at or batch.created_at
    text = f"{done:,} of {total:,} lines done"
    if counts.failed:
        text += f" ({counts.failed:,} failed)"
    if not batch.ended:
        left = time_left(done, total, now - started) if started else None
        text += (
            " · estimating the time left…" if left is None else f" · about {_duration(left)} left"
        )
    return (
        f'<progress value="{done}" max="{max(total, 1)}" style="width:100%"></progress>'
        f'<div id="batch_progress_text">{html.escape(text)}</div>'
    )
