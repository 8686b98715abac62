"""Issue 43 point 5 as a person meets it, in a real headless Chromium: upload a CSV on the Batch
tab, watch it run, download the results as CSV and open each row's permalink; a bad CSV is
named in the page, and Cancel keeps what finished.

The stack is its own: the real playground and api in front of tritonserver's synthetic engine
(the ensemble's tensors, tokens at a fixed pace, no model's CPU), as tests/api/batches use.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Page, expect
from tritonbox_testing.api_process import RunningApi, launch_api
from tritonbox_testing.playground_process import RunningPlayground, launch_playground
from tritonbox_testing.ports import free_port

from tritonbox_playground.batch_results import HEADERS

PROMPTS = ["Name a colour.", "Say hello, politely.", 'Quote "this".']


@pytest.fixture(scope="module")
def batch_api(triton_launcher: Callable[..., Any], tmp_path_factory: Any) -> Iterator[RunningApi]:
    with triton_launcher(engine="synthetic", synthetic_token_interval_s=0.02) as triton:
        running = launch_api(triton, tmp_path_factory.mktemp("batch-api"))
        try:
            running.wait_ready()
            yield running
        finally:
            running.stop()


@pytest.fixture(scope="module")
def batch_playground(batch_api: RunningApi, tmp_path_factory: Any) -> Iterator[RunningPlayground]:
    running = launch_playground(
        batch_api.url,
        tmp_path_factory.mktemp("batch-playground"),
        free_port(),
        public_url=batch_api.url,  # the permalinks' address
    )
    try:
        yield running
    finally:
        running.stop()


def open_tab(page: Page, playground: RunningPlayground) -> None:
    page.goto(playground.url)
    page.get_by_role("tab", name="Batch").click()
    expect(page.locator("#batch_start")).to_be_visible()


def upload(page: Page, path: Path) -> None:
    page.locator("#batch_file input[type=file]").set_input_files(str(path))
    # Its name shows once uploaded (the page may split the stem from the extension).
    expect(page.locator("#batch_file")).to_contain_text(path.stem)


def fill(page: Page, field: str, value: str) -> None:
    box = page.locator(f"#{field} textarea, #{field} input[type=number]").first
    box.fill(value)
    box.press("Tab")  # numbers and sliders take their value on blur


def test_a_csv_runs_as_a_batch_and_its_results_download_with_permalinks(
    page: Page,
    batch_playground: RunningPlayground,
    tmp_path: Path,
    screenshot: Callable[..., None],
) -> None:
    open_tab(page, batch_playground)
    status = page.locator("#batch_status")

    # A CSV without a prompt column: the page says what is wrong, and sends nothing.
    wrong = tmp_path / "wrong.csv"
    wrong.write_text("question\nWhat?\n")
    upload(page, wrong)
    page.locator("#batch_start").click()
    expect(status).to_contain_text("The CSV has no “prompt” column")
    expect(status).not_to_contain_text("Traceback")

    good = tmp_path / "questions.csv"
    with good.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["prompt", "temperature"])
        writer.writerows([prompt, "0"] for prompt in PROMPTS)
    # A fresh page (the file box holds the wrong file); settings made on the Run tab carry over.
    page.goto(batch_playground.url)
    fill(page, "max_tokens", "6")
    page.get_by_role("tab", name="Batch").click()
    page.locator("#batch_copy_settings").click()
    expect(page.locator("#max_tokens_batch input[type=number]")).to_have_value("6")
    upload(page, good)
    page.locator("#batch_start").click()
    expect(status).to_contain_text("Done: 3 answered, 0 failed", timeout=120_000)
    expect(page.locator("#batch_progress_text")).to_contain_text("3 of 3 lines done")
    batch_id = page.locator("#batch_id textarea, #batch_id input").first.input_value()
    assert batch_id.startswith("batch_")
    expect(page.locator("#batch_results")).to_contain_text(PROMPTS[1])
    screenshot(page, "playground-batch.png", full_page=True)

    with page.expect_download() as downloading:
        page.locator("#batch_csv").click()
    saved = Path(downloading.value.path()).read_text()
    table = list(csv.DictReader(io.StringIO(saved)))
    assert list(table[0]) == HEADERS
    assert [row["row"] for row in table] == ["1", "2", "3"]
    assert [row["prompt"] for row in table] == PROMPTS
    for row in table:
        assert row["output"] and row["finish_reason"] and not row["error"], row
        answer = httpx.get(row["permalink"], timeout=30)
        assert answer.status_code == 200, row["permalink"]

    with page.expect_download() as downloading:
        page.locator("#batch_jsonl").click()
    output = Path(downloading.value.path()).read_text().splitlines()
    assert len(output) == 3 and all('"status_code": 200' in line for line in output)
    expect(page.locator("#batch_errors")).to_be_hidden()  # every line answered: no error file


def test_cancel_keeps_what_finished_and_stops_the_rest(
    page: Page, batch_playground: RunningPlayground, tmp_path: Path
) -> None:
    open_tab(page, batch_playground)
    slow = tmp_path / "slow.csv"
    slow.write_text("prompt,max_tokens\n" + "".join(f"Line {i},400\n" for i in range(40)))
    upload(page, slow)
    page.locator("#batch_start").click()
    status = page.locator("#batch_status")
    expect(status).to_contain_text("Running", timeout=60_000)
    page.locator("#batch_cancel").click()
    expect(status).to_contain_text("Cancelled", timeout=60_000)
    with page.expect_download() as downloading:
        page.locator("#batch_csv").click()
    table = list(csv.DictReader(io.StringIO(Path(downloading.value.path()).read_text())))
    assert len(table) == 40
    assert any("cancelled" in row["error"] for row in table)
