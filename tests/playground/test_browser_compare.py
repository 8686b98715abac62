"""Issue 14 as a newcomer meets it, in a real headless Chromium against the real stack: compare
settings side by side and share the comparison, limits as this engine's numbers, an empty prompt
that sends nothing, what the stop words and bad words did, and a phone-sized screen."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import httpx
from playwright.sync_api import Browser, FloatRect, Locator, Page, expect
from tritonbox_testing.playground_process import RunningPlayground

DAYS = "List the days of the week: Monday,"


def fill(page: Page, field: str, value: str) -> None:
    box = page.locator(f"#{field} textarea, #{field} input[type=number]").first
    box.fill(value)
    box.press("Tab")  # numbers and sliders take their value on blur


def permalink_id(page: Page, result: str) -> str:
    link = page.locator(f"#{result} a", has_text="/p/")
    expect(link).to_be_visible()
    return (link.get_attribute("href") or "").rsplit("/", 1)[-1]


def box_of(locator: Locator) -> FloatRect:
    box = locator.bounding_box()
    assert box is not None, "not shown"
    return box


def newest_id(api: httpx.Client) -> str | None:
    results = api.get("/v1/predictions", params={"limit": 1}).json()["results"]
    return results[0]["id"] if results else None


def test_compare_three_settings_side_by_side_and_share_them(
    page: Page,
    playground_server: RunningPlayground,
    api: httpx.Client,
    screenshot: Callable[..., None],
) -> None:
    page.goto(playground_server.url)
    page.get_by_role("tab", name="Compare settings").click()
    page.get_by_role("button", name="Without and with a stop word", exact=True).click()
    expect(page.locator("#compare_prompt textarea")).to_have_value(DAYS)
    expect(page.locator("#stop_words_list_b textarea")).to_have_value("Friday")
    page.locator("#compare_third input[type=checkbox]").check()
    expect(page.locator("#bad_words_list_c textarea")).to_be_visible()
    for column in "abc":
        fill(page, f"max_tokens_{column}", "12")
    fill(page, "stop_words_list_b", "Thursday")
    fill(page, "temperature_c", "0")
    fill(page, "bad_words_list_c", "Thursday")
    page.locator("#compare_run").click()
    expect(page.locator("#compare_share")).to_contain_text("Share this comparison", timeout=180_000)

    answers = [page.locator(f"#compare_answer_{c} textarea").input_value() for c in "abc"]
    assert "Thursday" in answers[0]  # A: no words set
    assert answers[0].startswith(answers[1]) and "Thursday" not in answers[1]  # B: cut there
    assert "Thursday" not in answers[2] and "Friday" in answers[2]  # C: banned, skipped
    result_b = page.locator("#compare_result_b")
    expect(result_b).to_contain_text("Setting B: Stop words “Thursday”")
    expect(result_b).to_contain_text("Ended by the stop word “Thursday”")
    expect(result_b).to_contain_text("Wednesday, ✂ “Thursday”")
    expect(page.locator("#compare_result_c")).to_contain_text(
        "Banned (the model could not write them): “Thursday”"
    )
    expect(page.locator("#compare_result_a")).to_contain_text("it reached max tokens")

    # Each setting is a prediction of its own, with its own permalink; all ran at once.
    ids = [permalink_id(page, f"compare_result_{c}") for c in "abc"]
    saved = [api.get(f"/v1/predictions/{i}").json() for i in ids]
    assert len(set(ids)) == 3 and all(s["source"] == "playground" for s in saved)
    assert [s["output"] for s in saved] == answers
    assert len({s["applied"]["seed"] for s in saved}) == 1  # no seed given: one shared seed
    assert max(s["started_at"] for s in saved) < min(s["completed_at"] for s in saved)

    # One link reopens the whole comparison, from the api's log alone.
    link = page.locator("#compare_link textarea, #compare_link input").first.input_value()
    assert link == f"{playground_server.url}/?compare={','.join(ids)}"
    page.goto(link)
    expect(page.locator("#compare_prompt textarea")).to_have_value(DAYS)
    expect(page.locator("#compare_third input[type=checkbox]")).to_be_checked()
    expect(page.locator("#stop_words_list_b textarea")).to_have_value("Thursday")
    expect(page.locator("#bad_words_list_c textarea")).to_have_value("Thursday")
    for column, text in zip("abc", answers, strict=True):
        expect(page.locator(f"#compare_answer_{column} textarea")).to_have_value(text)
    expect(result_b).to_contain_text("Ended by the stop word “Thursday”")
    expect(page.locator("#compare_link textarea, #compare_link input").first).to_have_value(link)
    page.set_viewport_size({"width": 1280, "height": 1000})
    screenshot(page, "playground-compare.png", full_page=True)


def test_stop_ends_every_setting_of_a_comparison(
    page: Page, playground_server: RunningPlayground, api: httpx.Client
) -> None:
    page.goto(playground_server.url)
    page.get_by_role("tab", name="Compare settings").click()
    fill(
        page,
        "compare_prompt",
        "Once upon a time, in a kingdom by the sea, there lived a dragon who",
    )
    for column in "ab":
        fill(page, f"max_tokens_{column}", "300")
    page.locator("#compare_run").click()
    for column in "ab":
        expect(page.locator(f"#compare_answer_{column} textarea")).not_to_have_value(
            "", timeout=120_000
        )
    page.locator("#compare_stop").click()
    for column in "ab":
        expect(page.locator(f"#compare_result_{column}")).to_contain_text("Stopped", timeout=60_000)
        prediction_id = permalink_id(page, f"compare_result_{column}")
        assert api.get(f"/v1/predictions/{prediction_id}").json()["status"] == "canceled"


def test_limits_are_this_engines_numbers_and_an_empty_prompt_sends_nothing(
    page: Page, playground_server: RunningPlayground, api: httpx.Client
) -> None:
    before = newest_id(api)
    page.goto(playground_server.url)
    # The test engine's MAX_OUTPUT_LEN and MAX_INPUT_LEN are both 512, read from the api.
    # Generous waits: the page asks the api when it opens, and CI machines can be slow.
    expect(page.locator("#max_tokens")).to_contain_text(
        "From 1 to 512 on this engine.", timeout=60_000
    )
    expect(page.locator("#prompt")).to_contain_text("Up to 512 tokens")
    expect(page.locator("#seed")).to_contain_text("Any whole number from 0, e.g. 42.")
    text = page.locator("body").inner_text()
    assert "MAX_OUTPUT_LEN" not in text and "≤" not in text and "≥" not in text
    assert not re.search(r"\d{10,}", text)  # no 63-bit bound anywhere

    page.locator("#run").click()
    expect(page.locator("#result")).to_contain_text("Write a prompt first")
    page.locator("#mode").get_by_text("Chat", exact=True).click()
    fill(page, "system_prompt", "Answer in one word.")
    message, system = page.locator("#prompt"), page.locator("#system_prompt")
    expect(message).to_contain_text("Your message")
    assert box_of(message)["y"] < box_of(system)["y"]
    page.locator("#run").click()
    expect(page.locator("#result")).to_contain_text("Write your message in the “Your message” box")

    page.get_by_role("tab", name="Compare settings").click()
    page.locator("#compare_run").click()
    expect(page.locator("#compare_result_a")).to_contain_text("Write a prompt first")
    assert newest_id(api) == before  # nothing was sent


def test_the_recent_list_shows_what_a_chat_asked(
    page: Page, playground_server: RunningPlayground, api: httpx.Client
) -> None:
    messages = [
        {"role": "system", "content": "Answer in one word."},
        {"role": "user", "content": "Which colour is the sky?"},
    ]
    body: dict[str, Any] = {"input": {"messages": messages, "max_tokens": 2}}
    assert api.post("/v1/predictions", json=body | {"source": "playground"}).status_code == 201
    page.goto(playground_server.url)
    expect(page.locator("#recent")).to_contain_text("Which colour is the sky?", timeout=60_000)


def test_the_page_stays_usable_on_a_phone(
    browser: Browser, playground_server: RunningPlayground, screenshot: Callable[..., None]
) -> None:
    context = browser.new_context(viewport={"width": 390, "height": 844}, is_mobile=True)
    page = context.new_page()
    page.set_default_timeout(60_000)
    try:
        page.goto(playground_server.url)
        fill(page, "prompt", "The capital of France is")
        fill(page, "max_tokens", "4")
        run = page.locator("#run")
        box = box_of(run)
        assert box["x"] >= 0 and box["x"] + box["width"] <= 390  # on screen, no sideways scroll
        run.click()
        expect(page.locator("#result")).to_contain_text("Done", timeout=120_000)
        assert page.evaluate("document.documentElement.scrollWidth") <= 390
        page.locator("#prompt").evaluate("box => box.scrollIntoView()")  # prompt to result
        screenshot(page, "playground-phone.png")

        page.get_by_role("tab", name="Compare settings").click()
        answer_a = box_of(page.locator("#compare_answer_a"))
        answer_b = box_of(page.locator("#compare_answer_b"))
        assert answer_b["y"] >= answer_a["y"] + answer_a["height"] - 1  # stacked, not squeezed
        assert answer_a["width"] > 300
        assert page.evaluate("document.documentElement.scrollWidth") <= 390
    finally:
        context.close()
