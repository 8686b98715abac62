"""Fixtures: the real playground in front of the real api in front of the session's Triton,
and a real headless Chromium (Debian's `chromium`, driven by Playwright)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Browser, Page, expect
from tritonbox_testing.api_process import RunningApi, launch_api
from tritonbox_testing.browser import chromium
from tritonbox_testing.playground_process import RunningPlayground, launch_playground
from tritonbox_testing.ports import free_port

DOCS = Path(__file__).resolve().parents[2] / "docs"
# Screenshots for docs/ are written only when asked: TRITONBOX_SCREENSHOTS=1 scripts/test ...
SCREENSHOTS = os.environ.get("TRITONBOX_SCREENSHOTS") == "1"
# The page fills itself from the api when it opens (limits, restores, the recent list): on a
# busy machine that takes longer than Playwright's 5 s default for expect().
expect.set_options(timeout=30_000)


@pytest.fixture(scope="session")
def playground_port() -> int:
    return free_port()


@pytest.fixture(scope="session")
def playground_api(
    triton_server: Any, tmp_path_factory: pytest.TempPathFactory, playground_port: int
) -> Iterator[RunningApi]:
    """An api of the playground's own (its list of predictions holds only these tests' runs),
    whose permalink pages link to the test playground."""
    running = launch_api(
        triton_server,
        tmp_path_factory.mktemp("playground-api"),
        playground_url=f"http://127.0.0.1:{playground_port}",
    )
    try:
        running.wait_ready()
        yield running
    finally:
        running.stop()


@pytest.fixture(scope="session")
def playground_server(
    playground_api: RunningApi, tmp_path_factory: pytest.TempPathFactory, playground_port: int
) -> Iterator[RunningPlayground]:
    running = launch_playground(
        playground_api.url,
        tmp_path_factory.mktemp("playground"),
        playground_port,
        public_url=playground_api.url,  # for snippets; unset would be 127.0.0.1:API_PORT
    )
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture
def api(playground_api: RunningApi) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=playground_api.url, timeout=120) as client:
        yield client


@pytest.fixture
def launch(tmp_path: Path) -> Iterator[Callable[..., RunningPlayground]]:
    """Start extra playgrounds with their own settings; all are stopped after the test."""
    started: list[RunningPlayground] = []

    def start(api_url: str, **settings: str) -> RunningPlayground:
        running = launch_playground(
            api_url, tmp_path / f"playground{len(started)}", free_port(), **settings
        )
        started.append(running)
        return running

    yield start
    for running in started:
        running.stop()


# Module scope: Playwright's sync API runs an event loop in this thread while it is open, and
# asyncio.run() in any later test would fail; the browser tests live in one module.
@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with chromium() as running:
        yield running


@pytest.fixture
def screenshot() -> Callable[..., None]:
    """`screenshot(page, name)` writes docs/<name> only when TRITONBOX_SCREENSHOTS=1: a plain
    test run leaves docs/ alone, and whoever regenerates them looks at them before committing."""

    def take(page: Page, name: str, *, full_page: bool = False) -> None:
        if SCREENSHOTS:
            page.screenshot(path=str(DOCS / name), full_page=full_page)

    return take


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.set_default_timeout(60_000)
    try:
        yield page
    finally:
        context.close()
