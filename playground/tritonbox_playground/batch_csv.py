"""An uploaded file as a batch's input: a CSV (a `prompt` column, optional columns for the
other settings) becomes OpenAI batch lines, one `/v1/chat/completions` body a row; a JSONL file
is passed through as it is (the api checks each line, and a bad line is only that line's error).

Every problem is a PlaygroundError with a message for the person who uploaded the file: the
page shows it instead of starting anything.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tritonbox_common import parameters as p
from tritonbox_playground.adapters import ADAPTER
from tritonbox_playground.api_client import PlaygroundError
from tritonbox_playground.batch_client import CHAT_ROUTE
from tritonbox_playground.form import (
    CHAT_MODE,
    MAIN_NUMBERS,
    MORE_NUMBERS,
    generation_input,
    plain_error,
)
from tritonbox_playground.json_output import JSON_OUTPUT

# The api's default MAX_BATCH_LINES: the limit when the api does not say its own.
DEFAULT_MAX_LINES = 50_000
PROMPT, SYSTEM, STOP, BAD_WORDS = "prompt", "system", "stop", "bad_words"
NUMBER_COLUMNS = tuple(parameter.name for parameter in (*MAIN_NUMBERS, *MORE_NUMBERS))
COLUMNS = (PROMPT, SYSTEM, *NUMBER_COLUMNS, p.SEED.name, STOP, BAD_WORDS, ADAPTER)
# Other names people give the same columns (the form's and the api's names among them).
ALIASES = {
    "system_prompt": SYSTEM,
    "stop_words": STOP,
    p.STOP_WORDS.name: STOP,
    p.BAD_WORDS.name: BAD_WORDS,
    "model": ADAPTER,
}
# Which form field a column's value replaces for its row.
_FORM_FIELD = {SYSTEM: "system_prompt", STOP: p.STOP_WORDS.name, BAD_WORDS: p.BAD_WORDS.name}
DELIMITERS = (",", ";", "\t")  # spreadsheets in some languages write ";"


def _column(name: str) -> str:
    key = name.strip().lower().replace(" ", "_").replace("-", "_")
    return ALIASES.get(key, key)


def _delimiter(header: str) -> str:
    """The delimiter that makes the header hold a prompt column (spreadsheets differ)."""
    for delimiter in DELIMITERS:
        names = next(csv.reader([header], delimiter=delimiter), [])
        if PROMPT in (_column(name) for name in names):
            return delimiter
    shown = ", ".join(repr(name.strip()) for name in next(csv.reader([header]), []))
    raise PlaygroundError(
        f"The CSV has no “prompt” column (its first line names: {shown or 'nothing'}). "
        "Its first line must name the columns, one of them “prompt”."
    )


def _header(names: Sequence[str]) -> list[str]:
    columns = [_column(name) for name in names]
    unknown = [name.strip() for name, column in zip(names, columns, strict=True)
               if column not in COLUMNS]  # fmt: skip
    if unknown:
        raise PlaygroundError(
            f"The CSV has columns this page does not know: {', '.join(map(repr, unknown))}. "
            f"Known columns: {', '.join(COLUMNS)}."
        )
    twice = sorted({column for column in columns if columns.count(column) > 1})
    if twice:
        raise PlaygroundError(f"The CSV names a column twice: {', '.join(twice)}.")
    return columns


def chat_body(api_input: dict[str, Any], model: str) -> dict[str, Any]:
    """The api's prediction `input` (form.generation_input's, chat mode) as the OpenAI chat
    route's body: the same settings under the route's names, the adapter as `model`."""
    body = dict(api_input)
    body["model"] = body.pop(ADAPTER, None) or model
    stop = body.pop(p.STOP_WORDS.name, None)
    if stop:
        body["stop"] = stop
    banned = body.pop(p.BAD_WORDS.name, None)
    if banned:
        body["bad_words"] = banned
    if body.pop(JSON_OUTPUT, None):
        body["response_format"] = {"type": "json_object"}  # the route's "answer in JSON"
    return body


def row_line(number: int, row: dict[str, str], settings: dict[str, Any], model: str) -> Any:
    """Row `number`'s batch line: the page's settings, each non-empty cell replacing its own."""
    values = {**settings, "mode": CHAT_MODE, PROMPT: row.get(PROMPT) or ""}
    if not values[PROMPT].strip():
        raise PlaygroundError(f"Row {number}: the prompt is empty.")
    for column, cell in row.items():
        if column != PROMPT and cell is not None and cell.strip():
            values[_FORM_FIELD.get(column, column)] = cell.strip()
    try:
        body = chat_body(generation_input(values), model)
    except PlaygroundError as failure:
        raise PlaygroundError(f"Row {number}: {plain_error(failure.message)}") from None
    return {"custom_id": str(number), "method": "POST", "url": CHAT_ROUTE, "body": body}


def _too_many(count: int, max_lines: int) -> PlaygroundError:
    return PlaygroundError(
        f"The file has {count:,} rows; this api takes at most {max_lines:,} in a batch "
        "(MAX_BATCH_LINES). Split it into smaller files."
    )


def csv_lines(text: str, settings: dict[str, Any], model: str, max_lines: int) -> bytes:
    """A CSV's rows as batch JSONL; custom_id is the row's number (1: the row under the header)."""
    text = text.lstrip("\ufeff")  # Excel's "CSV UTF-8" starts with a byte order mark
    if not text.strip():
        raise PlaygroundError("The file is empty: nothing to run.")
    header = text.splitlines()[0]
    try:
        reader = csv.reader(io.StringIO(text), delimiter=_delimiter(header))
        columns = _header(next(reader))
        rows = [cells for cells in reader if any(cell.strip() for cell in cells)]
    except csv.Error as error:
        raise PlaygroundError(f"The CSV cannot be read: {error}.") from None
    if not rows:
        raise PlaygroundError("The CSV has a header but no rows: nothing to run.")
    if len(rows) > max_lines:
        raise _too_many(len(rows), max_lines)
    lines = []
    for number, cells in enumerate(rows, 1):
        if len(cells) > len(columns):
            raise PlaygroundError(
                f"Row {number} has {len(cells)} cells but the header names {len(columns)} "
                "columns (a comma inside a cell needs the cell in double quotes)."
            )
        row = dict(zip(columns, cells, strict=False))
        lines.append(json.dumps(row_line(number, row, settings, model)) + "\n")
    return "".join(lines).encode()


def jsonl_lines(content: bytes, max_lines: int) -> bytes:
    """A JSONL file as it is: only an empty file or too many lines are refused here."""
    count = sum(1 for line in content.splitlines() if line.strip())
    if not count:
        raise PlaygroundError("The file is empty: nothing to run.")
    if count > max_lines:
        raise _too_many(count, max_lines)
    return content


def is_jsonl(name: str, text: str) -> bool:
    """JSONL by its name, else by its first character (a CSV's header never starts with {)."""
    suffix = Path(name).suffix.lower()
    if suffix in (".jsonl", ".ndjson", ".json"):
        return True
    return suffix != ".csv" and text.lstrip("\ufeff \r\n\t").startswith("{")


def batch_input(
    path: str, settings: dict[str, Any], model: str, max_lines: int = DEFAULT_MAX_LINES
) -> bytes:
    """The uploaded file at `path` as a batch's JSONL input."""
    try:
        raw = Path(path).read_bytes()
        text = raw.decode("utf-8")
    except OSError as error:
        raise PlaygroundError(f"The uploaded file cannot be read ({error.strerror}).") from None
    except UnicodeDecodeError:
        raise PlaygroundError(
            "The file is not UTF-8 text: save it as “CSV UTF-8” (or JSONL) and upload it again."
        ) from None
    if is_jsonl(path, text):
        return jsonl_lines(raw, max_lines)
    return csv_lines(text, settings, model, max_lines)
