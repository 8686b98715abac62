"""Debian's headless Chromium through Playwright (never a browser Playwright downloads)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from playwright.sync_api import Browser, sync_playwright

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]


@contextmanager
def chromium() -> Iterator[Browser]:
    """Playwright's sync API runs an event loop in this thread while open: keep it to one test
    module (a module-scoped fixture), or asyncio.run() in later tests fails."""
    if not CHROMIUM.exists():
        raise RuntimeError(f"{CHROMIUM} is missing: scripts/install_browser installs it")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()
