"""The api key the playground's server sends never reaches the browser: not in the page, its
scripts, its config or any answer the browser receives while the page is used."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from playwright.sync_api import Page, Response, expect
from tritonbox_testing.api_process import RunningApi
from tritonbox_testing.playground_process import RunningPlayground

KEY = "s3cret-playground-key-0123456789"


def test_the_api_key_never_reaches_the_browser(
    launch: Callable[..., RunningPlayground], playground_api: RunningApi, page: Page
) -> None:
    # The api of this module runs without a key, so the runs below succeed; the playground still
    # holds one and would send it: what matters is that the browser never sees it.
    playground = launch(playground_api.url, api_key=KEY)
    bodies: list[str] = []

    def keep(response: Response) -> None:
        kind = response.headers.get("content-type", "")
        if any(text in kind for text in ("html", "javascript", "json", "text", "event-stream")):
            # A stream still open when the page moves on has no body to read.
            with contextlib.suppress(Exception):
                bodies.append(response.text())

    page.on("response", keep)
    page.goto(playground.url)
    box = page.locator("#prompt textarea").first
    box.fill("The capital of France is")
    box.press("Tab")
    page.locator("#run").click()
    expect(page.locator("#result")).to_contain_text("Done", timeout=120_000)
    page.get_by_text("Copy as curl / Python / openai").click()
    html = page.content()
    assert len(bodies) > 3, "the browser received almost nothing: the check would be vacuous"
    assert KEY not in html
    assert not [body[:200] for body in bodies if KEY in body]
    # The snippets name the variable to set, never its value.
    expect(page.locator("body")).to_contain_text("$API_KEY")
