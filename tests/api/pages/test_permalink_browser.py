"""The permalink page works in a real Chromium under its strict CSP: the page's own copy script
runs (its hash is allowed), and the browser reports no policy violation."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from playwright.sync_api import Browser, Dialog
from tritonbox_testing.api_process import RunningApi
from tritonbox_testing.browser import chromium

pytestmark = pytest.mark.server
COPIED = "document.querySelector(\"button[data-copy='curl']\").textContent === 'Copied'"


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with chromium() as running:
        yield running


def test_the_copy_button_runs_under_the_policy(api_server: RunningApi, browser: Browser) -> None:
    body = {"input": {"prompt": "<script>alert(1)</script> hi", "max_tokens": 2}}
    made = httpx.post(f"{api_server.url}/v1/predictions", json=body, timeout=120)
    assert made.status_code == 201
    context = browser.new_context()
    context.grant_permissions(["clipboard-read", "clipboard-write"], origin=api_server.url)
    page = context.new_page()
    messages: list[str] = []
    page.on("console", lambda message: messages.append(message.text))
    dialogs: list[str] = []

    def refuse(dialog: Dialog) -> None:
        dialogs.append(dialog.message)
        dialog.dismiss()

    page.on("dialog", refuse)
    try:
        page.goto(f"{api_server.url}/p/{made.json()['id']}")
        button = page.locator("button[data-copy='curl']")
        button.click()
        page.wait_for_function(
            "document.querySelector(\"button[data-copy='curl']\").textContent === 'Copied'"
        )
        copied = page.evaluate("navigator.clipboard.readText()")
        # The styles applied: the stylesheet's hash is allowed too.
        font = page.evaluate("getComputedStyle(document.body).fontFamily")
    finally:
        context.close()
    assert "curl" in copied and "/v1/predictions" in copied
    assert "system-ui" in font  # the page's own font stack: its <style> was allowed
    assert not [m for m in messages if "Content Security Policy" in m], messages
    assert dialogs == []  # the prompt's markup was shown, never run
