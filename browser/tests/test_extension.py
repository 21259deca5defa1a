"""The extension bridge end to end: real headless Chromium with the unpacked extension, the real
ASGI app (uvicorn) and Redis; commands sent the way the runner's tools send them."""

from __future__ import annotations

import re

import pytest

from browser.bridge import BrowserError, bridge_execute
from browser.tests.conftest import extension_browser, off_thread, pair_device_sync, run_async, wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.browser, pytest.mark.usefixtures("needs_chromium")]

POLICY = {"allowed_origins": [], "blocked_origins": []}


def command(world, op, params, *, key, user=None, deadline_ms=10_000, session_id=1, policy=None):
    """Send one command through the bridge from a fresh event loop (as a worker would)."""
    user = user or world.member
    full = dict(params, session_id=session_id, approved=params.get("approved", False), policy=policy or POLICY)

    async def go():
        return await bridge_execute(tenant_id=world.tenant.pk, user_id=user.pk, op=op, params=full,
                                    deadline_ms=deadline_ms, idempotency_key=key)

    return run_async(go)


def ref_of(snapshot_text: str, pattern: str) -> str:
    match = re.search(r"\[ref=(e\d+)\] " + pattern, snapshot_text)
    assert match, f"{pattern!r} not in snapshot:\n{snapshot_text}"
    return match.group(1)


@pytest.fixture
def connected(world, live_server_url, site, tmp_path):
    """Chromium + extension, paired to world.member and connected."""
    _, token = off_thread(pair_device_sync, tenant=world.tenant, user=world.member)
    with extension_browser(tmp_path) as browser:
        browser.configure(platform_url=live_server_url, token=token)
        browser.wait_connected()
        yield browser


def test_navigate_snapshot_type_click_and_read_results(world, site, connected):
    result = command(world, "navigate", {"url": site.url("/search")}, key="k1", deadline_ms=30_000)
    assert result["url"] == site.url("/search") and result["title"] == "Shop search"
    snap = command(world, "snapshot", {"max_chars": 8000}, key="k2")
    assert snap["text"].splitlines()[0].startswith("[ref=")
    box = ref_of(snap["text"], r'searchbox "Search products"')
    go = ref_of(snap["text"], r'button "Search"')
    typed = command(world, "type", {"ref": box, "text": "kiwi"}, key="k3")
    assert typed["diff"]["added_count"] + typed["diff"]["removed_count"] >= 1  # the value shows in the line
    command(world, "click", {"ref": go}, key="k4")
    waited = command(world, "wait_for", {"text": "3 results", "timeout_ms": 5000}, key="k5")
    assert any('link "Kiwi fruit"' in line for line in waited["diff"]["added"])
    text = command(world, "get_text", {"ref": "page", "max_chars": 2000}, key="k6")
    assert "3 results for kiwi" in text["text"] and "Golden kiwi" in text["text"]
    page = connected.page_with_url("/search")
    assert page.locator("#results li").count() == 3
    assert page.locator("#q").input_value() == "kiwi"
