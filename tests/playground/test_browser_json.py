"""The playground's "JSON output" switch in a real headless Chromium against the real stack: the
answer is JSON, the prediction records the guide, and its link reopens the switch on."""

from __future__ import annotations

import json

import httpx
from playwright.sync_api import Page, expect
from tritonbox_testing.playground_process import RunningPlayground

PROMPT = "Describe a cat as a JSON object with its name and age:"


def test_json_output_answers_json_and_restores(
    page: Page, playground_server: RunningPlayground, api: httpx.Client
) -> None:
    page.goto(playground_server.url)
    page.locator("#prompt textarea").fill(PROMPT)
    for field, value in (("max_tokens", "120"), ("temperature", "0")):
        box = page.locator(f"#{field} input[type=number]").first
        box.fill(value)
        box.press("Tab")
    switch = page.locator("#json_output input[type=checkbox]")
    expect(switch).not_to_be_checked()
    switch.check()
    page.locator("#run").click()
    expect(page.locator("#result")).to_contain_text("Done", timeout=120_000)
    link = page.locator("#result a", has_text="/p/")
    href = link.get_attribute("href")
    assert href is not None
    saved = api.get(f"/v1/predictions/{href.rsplit('/', 1)[-1]}").json()
    assert saved["applied"]["guided_decoding"] == {"guide_type": "json", "guide": None}
    answer = page.locator("#answer textarea").input_value()
    assert answer == saved["output"]
    if saved["finish_reason"] == "stop":
        json.loads(answer)
    else:  # cut by max tokens: still the start of a JSON value
        assert answer.lstrip()[:1] in set('{["-0123456789tfn'), answer

    page.goto(f"{playground_server.url}/?p={saved['id']}")
    expect(page.locator("#prompt textarea")).to_have_value(PROMPT)
    expect(page.locator("#json_output input[type=checkbox]")).to_be_checked()
