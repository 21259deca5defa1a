"""The SPA's browser parts in Chromium: browser_operation cards in the chat, and the
"Browser devices" panel (approve a pairing code, see and revoke devices)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from agents.models import CapabilityBinding, CapabilityKind
from agents.tests.factories import agent_with_route
from browser.tests.conftest import off_thread
from frontend.tests.test_spa import log_in_and_ask, open_page
from llm.testing import Reply, ToolCalls

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.browser,
    pytest.mark.usefixtures("needs_chromium"),
    pytest.mark.usefixtures("all_tenants_scope"),
]

SHOTS = Path(__file__).resolve().parents[2] / "var" / "test-artifacts"
"""Screenshots land here (not in docs/, which keeps a reviewed copy)."""


def test_chat_shows_browser_operations(world, fake_llm, celery_worker, live_server_url, site):
    from playwright.sync_api import expect

    from browser.tests.test_runs import _shutdown_server_browsers

    agent = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], name="Shopper")
    CapabilityBinding.all_tenants.create(tenant=world.tenant, agent=agent, kind=CapabilityKind.BROWSER,
                                         config={"backend": "server"})

    def respond(body):
        step = sum(1 for m in body["messages"] if m.get("role") == "assistant")
        last = [m for m in body["messages"] if m.get("role") == "tool"]
        text = last[-1]["content"] if last else ""
        if step == 0:
            return ToolCalls([("browser_navigate", {"url": site.url("/search")})])
        if step == 1:
            return ToolCalls([("browser_snapshot", {})])
        if step == 2:
            box = re.search(r'\[ref=(e\d+)\] searchbox', text).group(1)
            return ToolCalls([("browser_type", {"ref": box, "text": "kiwi", "submit": False})])
        if step == 3:
            go = re.search(r'\[ref=(e\d+)\] button "Search"', body["messages"][-3]["content"]).group(1)
            return ToolCalls([("browser_click", {"ref": go})])
        if step == 4:
            return ToolCalls([("browser_wait_for", {"text": "results for kiwi"})])
        return Reply("There are 3 kiwi products: Kiwi fruit, Kiwi jam and Golden kiwi.")

    fake_llm.respond(respond)
    try:
        with open_page() as page:
            log_in_and_ask(page, live_server_url, username=world.member.username, agent="Shopper",
                           question="Which kiwi products does the shop have?")
            expect(page.get_by_test_id("run").last).to_have_attribute("data-run-status", "completed", timeout=60_000)
            ops = page.get_by_test_id("browser-operation")
            expect(ops).to_have_count(5)
            expect(ops.nth(0)).to_have_attribute("data-op", "navigate")
            expect(ops.nth(0)).to_contain_text(site.url("/search"))
            expect(ops.nth(2)).to_contain_text("(4 characters)")
            for i in range(5):
                expect(ops.nth(i)).to_have_attribute("data-status", "succeeded")
            SHOTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(SHOTS / "chat-browser.png"))
    finally:
        _shutdown_server_browsers()


def test_devices_panel_approves_a_code_and_revokes_the_device(world, live_server_url):
    from playwright.sync_api import expect

    from browser.services import browser_pairing_claim, browser_pairing_create

    issued = off_thread(browser_pairing_create, name="Home Chrome")
    with open_page() as page:
        page.goto(live_server_url + "/")
        page.get_by_test_id("login-username").fill(world.member.username)
        page.get_by_test_id("login-password").fill("pw-user-123")
        page.get_by_test_id("login-submit").click()
        page.get_by_test_id("open-devices").click()
        panel = page.get_by_test_id("devices-panel")
        expect(panel).to_be_visible()
        expect(panel).to_contain_text("No paired browsers yet.")
        page.get_by_test_id("pairing-code-input").fill("WRONG-CODE")
        page.get_by_test_id("pairing-approve").click()
        expect(page.get_by_test_id("devices-message")).to_contain_text("No pending pairing has this code")
        page.get_by_test_id("pairing-code-input").fill(issued.code.lower())
        page.get_by_test_id("pairing-approve").click()
        expect(page.get_by_test_id("devices-message")).to_contain_text("Approved")
        claim = off_thread(browser_pairing_claim, pairing_id=issued.pairing.pk, poll_secret=issued.poll_secret)
        assert claim.status == "approved" and claim.device.user_id == world.member.pk
        device = page.get_by_test_id("device")
        expect(device).to_contain_text("Home Chrome", timeout=10_000)
        expect(device).to_have_attribute("data-state", "offline")
        page.get_by_test_id("device-revoke").click()
        expect(device).to_have_attribute("data-state", "revoked")
