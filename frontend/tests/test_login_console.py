"""A fresh load of the chat app by a signed-out visitor logs no console error (issue 25): the page
tells the app there is no session, so it shows the login form without asking ``auth/me/`` first
(whose 401 the browser logged as "Failed to load resource"). In Debian's Chromium, against the
real ASGI app."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest

from frontend.tests.test_spa import CHROMIUM, LAUNCH_ARGS

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.browser,
    pytest.mark.usefixtures("all_tenants_scope"),
]


@pytest.fixture(autouse=True)
def _needs_chromium():
    if not Path(CHROMIUM).exists():
        pytest.skip("Debian's chromium is not installed (scripts/ensure_chromium.sh installs it)")


@contextlib.contextmanager
def watched_page():
    """A page, with every console error, uncaught error and 4xx/5xx answer it meets."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=LAUNCH_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 800})
            page.problems = []
            page.on("console", lambda msg: page.problems.append(f"console {msg.type}: {msg.text}")
                    if msg.type == "error" else None)
            page.on("pageerror", lambda exc: page.problems.append(f"page error: {exc}"))
            page.on("response", lambda r: page.problems.append(f"HTTP {r.status} {r.url}") if r.status >= 400 else None)
            yield page
        finally:
            browser.close()


@pytest.mark.parametrize("path", ["/", "/#/login", "/#/sessions/12"])
def test_a_fresh_load_signed_out_shows_the_login_form_with_no_console_error(world, live_server_url, path):
    from playwright.sync_api import expect

    with watched_page() as page:
        page.goto(live_server_url + path)
        expect(page.get_by_test_id("login-username")).to_be_visible()
        page.wait_for_load_state("networkidle")
        assert page.problems == []
        assert page.evaluate("location.hash") == "#/login"


def test_after_signing_in_a_deep_link_comes_back_and_a_reload_skips_the_form(world, live_server_url):
    from playwright.sync_api import expect

    with watched_page() as page:
        page.goto(live_server_url + "/#/settings")
        page.get_by_test_id("login-username").fill(world.member.username)
        page.get_by_test_id("login-password").fill("pw-user-123")
        page.get_by_test_id("login-submit").click()
        expect(page.get_by_test_id("new-chat")).to_be_visible()
        page.wait_for_url("**/#/settings")  # back where the visitor wanted to go
        page.reload()
        expect(page.get_by_test_id("new-chat")).to_be_visible()  # signed in: no form
        page.wait_for_load_state("networkidle")
        assert page.evaluate("location.hash") == "#/settings"
        assert page.problems == []
