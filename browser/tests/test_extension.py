"""The extension bridge end to end: real headless Chromium with the unpacked extension, the real
ASGI app (uvicorn) and Redis; commands sent the way the runner's tools send them."""

from __future__ import annotations

import re

import pytest

from browser.bridge import BrowserError, bridge_execute
from browser.tests.conftest import extension_browser, off_thread, pair_device_sync, run_async, wait_until  # noqa: F401

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.browser,
    pytest.mark.usefixtures("needs_chromium"),
    pytest.mark.usefixtures("all_tenants_scope"),
]

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


def test_a_stale_ref_fails_with_a_hint_after_the_list_re_renders(world, site, connected):
    command(world, "navigate", {"url": site.url("/list")}, key="s1", deadline_ms=30_000)
    snap = command(world, "snapshot", {"max_chars": 8000}, key="s2")
    done = ref_of(snap["text"], r'button "Done: Buy milk"')
    shuffle = ref_of(snap["text"], r'button "Shuffle"')
    clicked = command(world, "click", {"ref": shuffle}, key="s3")
    assert clicked["diff"]["removed_count"] >= 3 and clicked["diff"]["added_count"] >= 3
    with pytest.raises(BrowserError) as info:
        command(world, "click", {"ref": done}, key="s4")
    assert info.value.code == "stale_ref" and "take a new browser_snapshot" in info.value.message.lower()
    page = connected.page_with_url("/list")
    assert page.locator("#items li").count() == 3  # the stale click did nothing
    fresh = command(world, "snapshot", {"max_chars": 8000}, key="s5")
    new_done = ref_of(fresh["text"], r'button "Done: Buy milk"')
    assert new_done != done
    command(world, "click", {"ref": new_done}, key="s6")
    assert page.locator("#items li").count() == 2


def test_refs_of_a_previous_page_are_stale_on_the_next(world, site, connected):
    command(world, "navigate", {"url": site.url("/counter")}, key="p1", deadline_ms=30_000)
    add = ref_of(command(world, "snapshot", {}, key="p2")["text"], r'button "Add one"')
    command(world, "navigate", {"url": site.url("/list")}, key="p3", deadline_ms=30_000)
    command(world, "snapshot", {}, key="p4")  # the new document hands out refs of its own
    with pytest.raises(BrowserError) as info:
        command(world, "click", {"ref": add}, key="p5")
    assert info.value.code == "stale_ref"


def test_blocked_origins_are_refused_also_after_a_redirect(world, site, connected):
    policy = {"allowed_origins": [site.origin], "blocked_origins": []}
    with pytest.raises(BrowserError) as info:
        command(world, "navigate", {"url": site.other_url("/search")}, key="o1", deadline_ms=30_000, policy=policy)
    assert info.value.code == "origin_blocked"
    # An allowed URL that redirects to a blocked origin: refused once the tab's URL is committed.
    with pytest.raises(BrowserError) as info:
        command(world, "navigate", {"url": site.url("/redirect?to=" + site.other_url("/search"))}, key="o2",
                deadline_ms=30_000, policy=policy)
    assert info.value.code == "origin_blocked" and "redirected" in info.value.message
    def left_blocked_page():
        urls = connected.worker.evaluate("async () => (await chrome.tabs.query({})).map((t) => t.url)")
        return not any("localhost" in url for url in urls)

    wait_until(left_blocked_page, timeout_seconds=5, what="the tab to leave the blocked page")
    # Acting on a tab that is on a blocked origin is refused at action time too.
    command(world, "navigate", {"url": site.url("/counter")}, key="o3", deadline_ms=30_000)
    blocked_now = {"allowed_origins": [], "blocked_origins": [site.origin]}
    with pytest.raises(BrowserError) as info:
        command(world, "snapshot", {}, key="o4", policy=blocked_now)
    assert info.value.code == "origin_blocked"


def test_password_fields_need_approval(world, site, connected):
    command(world, "navigate", {"url": site.url("/login")}, key="w1", deadline_ms=30_000)
    snap = command(world, "snapshot", {}, key="w2")
    password = ref_of(snap["text"], r'textbox "Password" type=password')
    with pytest.raises(BrowserError) as info:
        command(world, "type", {"ref": password, "text": "hunter2"}, key="w3")
    assert info.value.code == "approval_required" and "password field on " + site.origin in info.value.message
    page = connected.page_with_url("/login")
    assert page.locator("input[name=pw]").input_value() == ""
    command(world, "type", {"ref": password, "text": "hunter2", "approved": True}, key="w4")
    assert page.locator("input[name=pw]").input_value() == "hunter2"
    # Submitting the form that now holds a password needs approval as well.
    sign_in = ref_of(snap["text"], r'button "Sign in"')
    with pytest.raises(BrowserError) as info:
        command(world, "click", {"ref": sign_in}, key="w5")
    assert info.value.code == "approval_required"
    navigated = command(world, "click", {"ref": sign_in, "approved": True}, key="w6")
    assert navigated["navigated"] is True and "/welcome" in navigated["url"]


def test_a_replayed_command_returns_the_stored_result(world, site, connected):
    command(world, "navigate", {"url": site.url("/counter")}, key="r1", deadline_ms=30_000)
    add = ref_of(command(world, "snapshot", {}, key="r2")["text"], r'button "Add one"')
    first = command(world, "click", {"ref": add}, key="r3-same")
    again = command(world, "click", {"ref": add}, key="r3-same")
    assert again == first
    page = connected.page_with_url("/counter")
    assert page.evaluate("window.count") == 1


def test_service_worker_killed_mid_command_reconnects_and_does_not_act_twice(world, site, connected):
    command(world, "navigate", {"url": site.url("/counter")}, key="k1", deadline_ms=30_000)
    snap = command(world, "snapshot", {}, key="k2")
    slow = ref_of(snap["text"], r'button "Slow add"')
    page = connected.page_with_url("/counter")
    cdp = page.context.new_cdp_session(page)

    def slow_click():
        return command(world, "click", {"ref": slow}, key="k3-slow", deadline_ms=10_000)

    from browser.tests.conftest import submit

    pending = submit(slow_click)
    wait_until(site.server.hit_event.is_set, timeout_seconds=10, what="the slow click")
    cdp.send("ServiceWorker.enable")
    cdp.send("ServiceWorker.stopAllWorkers")
    # Something wakes the worker (here: the popup asks for its state; otherwise the 30-s alarm).
    popup = connected.open_extension_page("popup.html")
    wait_until(pending.done, timeout_seconds=30, what="the interrupted click's answer")
    with pytest.raises(BrowserError) as info:
        pending.result()
    # The server resent the command with the same key; the restarted worker found it started
    # and never finished, and said so instead of clicking again.
    assert info.value.code == "interrupted", info.value.message
    from playwright.sync_api import expect

    # (Not the worker's own state: evaluating in a stopped worker can hang; the popup has timeouts.)
    expect(popup.get_by_test_id("status")).to_have_text("Connected", timeout=15_000)
    assert page.evaluate("window.count") == 1
    add = ref_of(command(world, "snapshot", {}, key="k4")["text"], r'button "Add one"')
    command(world, "click", {"ref": add}, key="k5")
    assert page.evaluate("window.count") == 2
    popup.close()


def test_pairing_end_to_end_through_the_options_page_then_revocation(world, live_server_url, site, tmp_path):
    from pathlib import Path

    from playwright.sync_api import expect

    with extension_browser(tmp_path) as browser:
        options = browser.open_extension_page("options.html")
        options.get_by_test_id("platform-url").fill(live_server_url)
        options.get_by_test_id("device-name").fill("Work laptop")
        options.get_by_test_id("pair").click()
        code = options.get_by_test_id("pairing-code")
        expect(code).to_have_text(re.compile(r"^[A-Z2-9]{4}-[A-Z2-9]{4}$"))
        shown = code.inner_text()
        resp = off_thread(lambda: world.client().post("/api/v1/browser/pairings/approve/", {"code": shown},
                                                      format="json"))
        assert resp.status_code == 200, resp.content
        expect(options.get_by_test_id("status")).to_have_text("connected", timeout=15_000)
        expect(options.get_by_test_id("account")).to_contain_text(f"as {world.member.username} in acme (Work laptop)")

        command(world, "navigate", {"url": site.url("/counter")}, key="e1", deadline_ms=30_000)
        add = ref_of(command(world, "snapshot", {}, key="e1b")["text"], r'button "Add one"')
        command(world, "click", {"ref": add}, key="e1c")
        popup = browser.open_extension_page("popup.html")
        popup.set_viewport_size({"width": 360, "height": 420})
        expect(popup.get_by_test_id("status")).to_have_text("Connected")
        expect(popup.get_by_test_id("account")).to_contain_text(world.member.username)
        expect(popup.get_by_test_id("log-entry").last).to_contain_text("navigate — ok")
        expect(popup.get_by_test_id("log-entry").first).to_contain_text("click — ok")
        shots = Path(__file__).resolve().parents[2] / "var" / "test-artifacts"  # docs/ has a copy
        shots.mkdir(parents=True, exist_ok=True)
        popup.screenshot(path=str(shots / "extension-popup.png"))

        listed = off_thread(lambda: world.client().get("/api/v1/browser/devices/").json()["results"])
        assert [(d["name"], d["connected"]) for d in listed] == [("Work laptop", True)]
        off_thread(lambda: world.client().delete(f"/api/v1/browser/devices/{listed[0]['id']}/"))
        expect(popup.get_by_test_id("status")).to_have_text("Not paired", timeout=10_000)
        expect(popup.get_by_test_id("error")).to_contain_text("unpaired")
        with pytest.raises(BrowserError) as info:
            command(world, "snapshot", {}, key="e2")
        assert info.value.code == "browser_not_connected"


def test_stop_in_the_popup_cancels_a_pending_command(world, site, connected):
    from playwright.sync_api import expect

    from browser.tests.conftest import submit

    command(world, "navigate", {"url": site.url("/counter")}, key="x1", deadline_ms=30_000)
    popup = connected.open_extension_page("popup.html")
    pending = submit(command, world, "wait_for", {"seconds": 8, "timeout_ms": 8000}, key="x2", deadline_ms=9_000)
    stop = popup.get_by_test_id("stop")
    expect(stop).to_be_enabled(timeout=5_000)  # enabled while a command is pending
    stop.click()
    wait_until(pending.done, timeout_seconds=5, what="the cancelled command's answer")
    with pytest.raises(BrowserError) as info:
        pending.result()
    assert info.value.code == "cancelled_by_user"
    expect(popup.get_by_test_id("log-entry").first).to_contain_text("wait_for — cancelled")
    expect(stop).to_be_disabled()


def test_the_user_hands_a_tab_to_the_agent(world, site, connected):
    from playwright.sync_api import expect

    mine = connected.context.new_page()
    mine.goto(site.url("/counter"))
    mine.bring_to_front()
    popup = connected.open_extension_page("popup.html")
    popup.get_by_test_id("hand-tab").click()
    expect(popup.get_by_test_id("hand-message")).to_contain_text("Handed over: Counter")
    snap = command(world, "snapshot", {}, key="h1", session_id=77)  # the first chat adopts it
    add = ref_of(snap["text"], r'button "Add one"')
    command(world, "click", {"ref": add}, key="h2", session_id=77)
    assert mine.evaluate("window.count") == 1
    # Tabs the agent did not open and was not handed stay out of reach.
    with pytest.raises(BrowserError) as info:
        command(world, "snapshot", {}, key="h3", session_id=78)
    assert info.value.code == "no_tab"
