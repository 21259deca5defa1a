"""Helpers of the console's browser tests: a Chromium page, logging in to the console, axe,
and screenshots (``CONSOLE_SCREENSHOTS_DIR``: where the README's screenshots go, e.g. docs/)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

CHROMIUM = os.environ.get("CHROMIUM_PATH", "/usr/lib/chromium/chromium")
ARTIFACTS = Path(__file__).resolve().parents[2] / "var" / "test-artifacts"
LAUNCH_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
    "--disable-sync", "--no-first-run", "--disable-quic",
]


@contextlib.contextmanager
def open_page(*, width: int = 1280, height: int = 860) -> Iterator[Any]:
    """A Chromium page that records console errors (``page.console_errors``). Start it after
    the test's database work (Playwright's sync API runs an event loop in this thread)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=LAUNCH_ARGS)
        try:
            page = browser.new_page(viewport={"width": width, "height": height})
            page.console_errors = []
            page.on("console", lambda m: m.type == "error" and page.console_errors.append(m.text))
            yield page
        finally:
            browser.close()


def log_in(page: Any, base_url: str, username: str, password: str = "pw-admin-123") -> None:
    """Log in to the console with its login form, as a person does."""
    from playwright.sync_api import expect

    page.goto(base_url + "/admin/")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Log in").click()
    expect(page.locator("#site-name")).to_contain_text("Agent Platform console")


def check_axe(page: Any, label: str) -> None:
    """No serious or critical axe-core violation on the page."""
    from frontend.tests.axe import assert_no_serious_axe_violations

    assert_no_serious_axe_violations(page, label=label)


def screenshot(page: Any, name: str, **kwargs: Any) -> Path:
    """Save a screenshot of ``page`` (a Playwright page, or a locator: that element only) as
    ``name`` in ``CONSOLE_SCREENSHOTS_DIR`` (the docs' images) or var/test-artifacts."""
    folder = Path(os.environ.get("CONSOLE_SCREENSHOTS_DIR") or ARTIFACTS)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    page.screenshot(path=str(path), **kwargs)
    return path
