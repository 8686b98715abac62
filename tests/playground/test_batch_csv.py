"""The Batch tab's file handling without a browser: a CSV -> OpenAI batch lines, a JSONL file
passed through, bad files refused with a message a person can act on; results read back into
rows (prompt, output, finish reason, permalink, error); the time left from the counts."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

import pytest

from tritonbox_playground.adapters import BASE
from tritonbox_playground.api_client import PlaygroundError
from tritonbox_playground.batch_client import BatchView
from tritonbox_playground.batch_csv import batch_input, csv_lines, is_jsonl
from tritonbox_playground.batch_results import (
    HEADERS,
    progress,
    result_rows,
    results_csv,
    time_left,
)
from tritonbox_playground.batch_tab import BATCH_FIELDS
from tritonbox_playground.form import defaults
from tritonbox_playground.json_output import JSON_OUTPUT

MODEL = "served-model"


def settings(**changes: Any) -> dict[str, Any]:
    values = defaults()
    return {name: values[name] for name in BATCH_FIELDS} | changes


def lines(text: str, max_lines: int = 100, **changes: Any) -> list[dict[str, Any]]:
    content = csv_lines(text, settings(**changes), MODEL, max_lines)
    return [json.loads(line) for line in content.decode().splitlines()]


def test_each_row_is_a_chat_line_numbered_by_its_row_with_the_pages_settings() -> None:
    made = lines("prompt\nWhat is 2+2?\nName a colour.\n", max_tokens=7, temperature=0.5)
    assert [line["custom_id"] for line in made] == ["1", "2"]
    first = made[0]
    assert first["method"] == "POST" and first["url"] == "/v1/chat/completions"
    body = first["body"]
    assert body["model"] == MODEL
    assert body["messages"] == [{"role": "user", "content": "What is 2+2?"}]
    assert body["max_tokens"] == 7 and body["temperature"] == 0.5
    assert "stop" not in body and "adapter" not in body and "prompt" not in body


def test_cells_replace_the_settings_for_their_row_only() -> None:
    text = (
        "Prompt,System,max_tokens,temperature,top_p,stop,seed\n"
        'Hello,Be brief.,5,0,0.9,".\n\\n",42\n'
        "Bye,,,,,,\n"
    )
    first, second = lines(text, system_prompt="Be kind.", max_tokens=30, stop_words_list="")
    body = first["body"]
    assert body["messages"][0] == {"role": "system", "content": "Be brief."}
    assert body["max_tokens"] == 5 and body["temperature"] == 0 and body["top_p"] == 0.9
    assert body["stop"] == [".", "\n"] and body["seed"] == 42
    other = second["body"]
    assert other["messages"][0] == {"role": "system", "content": "Be kind."}
    assert other["max_tokens"] == 30 and "stop" not in other and "seed" not in other


def test_the_adapter_is_the_model_and_json_output_the_response_format() -> None:
    chosen: dict[str, Any] = {"adapter": "tiny", JSON_OUTPUT: True, "bad_words_list": "x"}
    (line,) = lines("prompt\nhi\n", **chosen)
    assert line["body"]["model"] == "tiny"
    assert line["body"]["response_format"] == {"type": "json_object"}
    assert line["body"]["bad_words"] == ["x"]
    (per_row,) = lines("prompt;adapter\nhi;other\n", adapter=BASE)  # a ";" spreadsheet
    assert per_row["body"]["model"] == "other"


def test_excel_csv_with_a_byte_order_mark_and_quoted_commas() -> None:
    (line,) = lines('\ufeffprompt\n"One, two, three"\n')
    assert line["body"]["messages"][-1]["content"] == "One, two, three"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "The file is empty"),
        ("  \n\n", "The file is empty"),
        ("question,answer\nhi,there\n", "no “prompt” column"),
        ("prompt\n", "a header but no rows"),
        ("prompt,temprature\nhi,1\n", "columns this page does not know: 'temprature'"),
        ("prompt,Prompt\nhi,ho\n", "names a column twice: prompt"),
        ("prompt,max_tokens\nhi,many\n", "Row 1: Max tokens: write a number, not 'many'"),
        ("prompt,seed\nhi,\nho,x\n", "Row 2: Seed: write a whole number"),
        ("prompt,system\nhi,\n ,be brief\n", "Row 2: the prompt is empty"),
        ("prompt\nhi,there\n", "Row 1 has 2 cells but the header names 1 columns"),
        ("prompt\n" + "hi\n" * 4, "The file has 4 rows; this api takes at most 3"),
    ],
)
def test_a_bad_csv_is_refused_with_a_plain_message(text: str, message: str) -> None:
    with pytest.raises(PlaygroundError) as refused:
        lines(text, max_lines=3)
    assert message in refused.value.message


def test_jsonl_is_passed_through_and_only_its_size_checked(tmp_path: Path) -> None:
    raw = b'{"custom_id": "a", "url": "/v1/chat/completions", "body": {"x": 1}}\nnot json\n\n'
    path = tmp_path / "mine.jsonl"
    path.write_bytes(raw)
    assert batch_input(str(path), settings(), MODEL) == raw  # the api judges each line
    with pytest.raises(PlaygroundError, match="2 rows; this api takes at most 1"):
        batch_input(str(path), settings(), MODEL, max_lines=1)
    path.write_bytes(b"\n \n")
    with pytest.raises(PlaygroundError, match="empty"):
        batch_input(str(path), settings(), MODEL)
    assert is_jsonl("upload", '{"custom_id": 1}') and not is_jsonl("a.csv", "{weird")


def test_a_file_that_is_not_utf8_is_named_so(tmp_path: Path) -> None:
    path = tmp_path / "latin.csv"
    path.write_bytes("prompt\ncafé\n".encode("latin-1"))
    with pytest.raises(PlaygroundError, match="not UTF-8"):
        batch_input(str(path), settings(), MODEL)


def _answer(custom_id: str, request_id: str | None, text: str, status: int = 200) -> str:
    body: Any = {"choices": [{"message": {"content": text}, "finish_reason": "length"}]}
    if status >= 400:
        body = {"error": {"message": "temperature: too hot"}}
    response = {"status_code": status, "request_id": request_id, "body": body}
    return json.dumps({"id": "r", "custom_id": custom_id, "response": response, "error": None})


def test_results_follow_the_input_order_with_permalinks_and_errors() -> None:
    asked = csv_lines("prompt\nfirst\nsecond\nthird\n", settings(), MODEL, 10)
    answers = "\n".join([_answer("3", "p3", "three"), _answer("1", "p1", "one")]).encode()
    cancelled = {"code": "batch_cancelled", "message": "not run: cancelled"}
    errors = "\n".join(
        [
            _answer("2", None, "", status=400),
            json.dumps({"custom_id": "4", "response": None, "error": cancelled}),
        ]
    ).encode()
    rows = result_rows(asked, answers, errors, "http://api:8080")
    assert [row.row for row in rows] == ["1", "2", "3", "4"]
    assert rows[0].prompt == "first" and rows[0].output == "one"
    assert rows[0].finish_reason == "length" and rows[0].permalink == "http://api:8080/p/p1"
    assert rows[1].error == "400: temperature: too hot" and rows[1].permalink == ""
    assert rows[3].error == "not run: cancelled"
    table = list(csv.reader(io.StringIO(results_csv(rows))))
    assert table[0] == HEADERS and len(table) == 5
    assert table[3] == ["3", "third", "three", "length", "http://api:8080/p/p3", ""]


def test_the_time_left_comes_from_the_pace_so_far() -> None:
    assert time_left(0, 10, 5.0) is None
    assert time_left(5, 10, 10.0) == pytest.approx(10.0)
    assert time_left(10, 10, 10.0) == 0.0
    batch = BatchView.model_validate(
        {
            "id": "batch_x",
            "status": "in_progress",
            "input_file_id": "file-x",
            "created_at": 100,
            "in_progress_at": 100,
            "request_counts": {"total": 30, "completed": 9, "failed": 1},
        }
    )
    shown = progress(batch, now=120.0)
    assert '<progress value="10" max="30"' in shown
    assert "10 of 30 lines done (1 failed) · about 40 s left" in shown
    ended = batch.model_copy(update={"status": "completed"})
    assert "left" not in progress(ended, now=120.0)
