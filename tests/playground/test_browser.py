"""The playground as a person uses it: a real headless Chromium (Debian's `chromium`, driven by
Playwright) against the real stack: playground process -> api process -> Triton."""

from __future__ import annotations

import re
import time
from collections.abc import Callable

import httpx
from playwright.sync_api import Page, expect
from tritonbox_testing.api_process import RunningApi
from tritonbox_testing.playground_process import RunningPlayground

DAYS = "List the days of the week: Monday,"


def fill(page: Page, field: str, value: str) -> None:
    box = page.locator(f"#{field} textarea, #{field} input[type=number]").first
    box.fill(value)
    box.press("Tab")  # numbers and sliders take their value on blur


def answer(page: Page) -> str:
    return page.locator("#answer textarea").input_value()


def permalink(page: Page) -> str:
    link = page.locator("#result a", has_text="/p/")
    expect(link).to_be_visible()
    href = link.get_attribute("href")
    assert href is not None
    return href


def test_run_stream_share_and_restore(
    page: Page,
    playground_server: RunningPlayground,
    playground_api: RunningApi,
    api: httpx.Client,
    screenshot: Callable[..., None],
) -> None:
    page.goto(playground_server.url)
    fill(page, "prompt", DAYS)
    fill(page, "max_tokens", "40")
    fill(page, "temperature", "0")
    fill(page, "stop_words_list", "Saturday")
    page.locator("#run").click()

    # The answer streams in: text shows while the run still says it is generating.
    seen: list[str] = []
    deadline = time.monotonic() + 120
    while "Done" not in page.locator("#result").inner_text():
        assert time.monotonic() < deadline, "the run did not finish"
        if "Generating" in page.locator("#result").inner_text() and answer(page):
            seen.append(answer(page))
        page.wait_for_timeout(30)
    final = answer(page)
    assert seen and all(final.startswith(partial) for partial in seen)
    assert "Friday" in final and "Saturday" not in final
    expect(page.locator("#result")).to_contain_text("it reached a stop word")
    expect(page.locator("#result")).to_contain_text("Ended by the stop word “Saturday”")
    expect(page.locator("#result")).to_contain_text("Friday, ✂ “Saturday”")
    expect(page.locator("#result")).to_contain_text("time to first token")
    expect(page.locator("#result")).to_contain_text("tokens/s")
    web = permalink(page)
    prediction_id = web.rsplit("/", 1)[-1]
    assert web == f"{playground_api.url}/p/{prediction_id}"
    expect(page.locator("#recent")).to_contain_text(prediction_id)  # the list refreshed
    page.set_viewport_size({"width": 1280, "height": 1130})  # down to the stop words
    page.evaluate("window.scrollTo(0, 0)")  # from the title, as a newcomer first sees it
    screenshot(page, "playground.png")

    saved = api.get(f"/v1/predictions/{prediction_id}").json()
    assert saved["source"] == "playground" and saved["output"] == final

    # Shared: the permalink page's "open in playground" link restores the form, ready to run.
    page.goto(web)
    page.locator(f"a[href$='?p={prediction_id}']").first.click()
    expect(page.locator("#prompt textarea")).to_have_value(DAYS)
    expect(page.locator("#stop_words_list textarea")).to_have_value("Saturday")
    expect(page.locator("#max_tokens input")).to_have_value("40")
    expect(page.locator("#temperature input[type=number]")).to_have_value("0")
    expect(page.locator("#answer textarea")).to_have_value(final)
    expect(page.locator("#seed textarea, #seed input").first).to_have_value(
        str(saved["applied"]["seed"])
    )
    page.locator("#run").click()
    # The restored result already says "Done": wait for the new run's own permalink.
    link = page.locator("#result a", has_text="/p/")
    expect(link).not_to_have_attribute("href", web, timeout=120_000)
    expect(page.locator("#result")).to_contain_text("Done", timeout=120_000)
    assert answer(page) == final  # same settings, same seed, same answer


def test_stop_cancels_on_the_server(
    page: Page, playground_server: RunningPlayground, api: httpx.Client
) -> None:
    page.goto(playground_server.url)
    page.locator("#mode").get_by_text("Chat", exact=True).click()
    expect(page.locator("#system_prompt textarea")).to_be_visible()
    fill(page, "system_prompt", "You are a storyteller.")
    fill(page, "prompt", "Tell me a long story about a dragon who learns to cook.")
    fill(page, "max_tokens", "400")
    page.get_by_text("More settings").click()
    fill(page, "min_tokens", "390")  # no early end: Stop ends it
    page.locator("#run").click()
    expect(page.locator("#answer textarea")).not_to_have_value("", timeout=90_000)
    first = answer(page)
    expect(page.locator("#answer textarea")).not_to_have_value(first)  # still streaming
    page.locator("#stop").click()
    expect(page.locator("#result")).to_contain_text("Stopped", timeout=60_000)
    prediction_id = permalink(page).rsplit("/", 1)[-1]
    saved = api.get(f"/v1/predictions/{prediction_id}").json()
    assert saved["status"] == "canceled" and saved["finish_reason"] == "canceled"
    assert saved["source"] == "playground"
    assert saved["input"]["messages"][0] == {"role": "system", "content": "You are a storyteller."}
    assert saved["output"] == answer(page) and saved["metrics"]["completion_tokens"] < 390


def test_an_api_error_is_shown_in_plain_words(
    page: Page, playground_server: RunningPlayground
) -> None:
    page.goto(playground_server.url)
    fill(page, "prompt", "Hello")
    fill(page, "max_tokens", "100000")
    page.locator("#run").click()
    expect(page.locator("#result")).to_contain_text(
        re.compile(r"Error: Max tokens: must be at most 512 \(MAX_OUTPUT_LEN\), got 100000")
    )
    # Still usable: a corrected run goes through.
    fill(page, "max_tokens", "3")
    page.locator("#run").click()
    expect(page.locator("#result")).to_contain_text("Done", timeout=120_000)


def test_examples_recent_list_and_snippets(
    page: Page, playground_server: RunningPlayground, api: httpx.Client
) -> None:
    earlier_prompt = "A recent prompt to open again"
    body = {"input": {"prompt": earlier_prompt, "max_tokens": 2}, "source": "playground"}
    assert api.post("/v1/predictions", json=body).status_code == 201
    page.goto(playground_server.url)
    page.get_by_text("Three fruits that are red:").first.click()  # an example
    expect(page.locator("#prompt textarea")).to_have_value("Three fruits that are red:")
    expect(page.locator("#bad_words_list textarea")).to_have_value("cherry")
    page.get_by_text("Copy as curl / Python / openai").click()
    expect(page.locator("#curl")).to_contain_text('"bad_words_list"')
    expect(page.locator("#curl")).to_contain_text("Three fruits that are red:")
    # A row of the recent list opens that prediction.
    # The table keeps a hidden copy of its cells for measuring; click the visible one.
    page.locator("#recent").get_by_text(earlier_prompt).locator("visible=true").click()
    expect(page.locator("#prompt textarea")).to_have_value(earlier_prompt)
    expect(page.locator("#max_tokens input")).to_have_value("2")
    expect(page.locator("#bad_words_list textarea")).to_have_value("")
    expect(page.locator("#curl")).to_contain_text('"max_tokens": 2')
