"""The chat app's "Scheduled" dialog (frontend/static/frontend/schedules.js) in Debian's
Chromium, against the real ASGI app: a member opens it from a chat's header, sees only their
own schedules of this agent, adds one (a bad cron first: the API's message), pauses it and
deletes it; the database follows."""

from __future__ import annotations

from pathlib import Path

import pytest

from agents.tests.factories import agent_with_route
from automations.models import Schedule
from frontend.tests.axe import assert_no_serious_axe_violations
from frontend.tests.test_chat_flows import T, log_in, open_page, start_chat
from frontend.tests.test_spa import CHROMIUM
from memory.tests.test_panel_browser import _in_thread

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.browser,
    pytest.mark.usefixtures("all_tenants_scope"),
]


@pytest.fixture(autouse=True)
def _needs_chromium():
    if not Path(CHROMIUM).exists():
        pytest.skip("Debian's chromium is not installed (scripts/ensure_chromium.sh installs it)")


def test_the_scheduled_dialog_adds_pauses_and_deletes(world, live_server_url):
    from playwright.sync_api import expect

    agent = agent_with_route(tenant=world.tenant, base_urls=["http://127.0.0.1:9/v1"], name="Reporter")
    other = agent_with_route(tenant=world.tenant, base_urls=["http://127.0.0.1:9/v1"], name="Other")
    common = {"tenant": world.tenant, "cron": "0 9 * * *", "timezone": "UTC"}
    Schedule.all_tenants.create(agent=agent, owner=world.member, message="Daily digest", **common)
    Schedule.all_tenants.create(agent=agent, owner=world.admin, message="The admin's own", **common)
    Schedule.all_tenants.create(agent=other, owner=world.member, message="Another agent's", **common)

    with open_page() as page:
        log_in(page, live_server_url, world.member.username)
        start_chat(page, "Reporter")
        page.get_by_test_id("open-schedules").click()
        dialog = page.get_by_test_id("schedules-panel")
        items = dialog.get_by_test_id("schedule-item")
        expect(items).to_have_count(1, timeout=T)
        expect(items.first).to_contain_text("Daily digest")
        expect(items.first).to_contain_text("0 9 * * * (UTC) · next ")
        dialog.get_by_test_id("schedule-message").fill("Morning report, please")
        dialog.get_by_test_id("schedule-cron").fill("61 8 * * *")
        dialog.get_by_test_id("schedule-zone").fill("Europe/Berlin")
        dialog.get_by_test_id("schedule-add").click()
        expect(dialog.get_by_test_id("schedules-message")).not_to_have_text("", timeout=T)
        expect(dialog.get_by_test_id("schedules-message")).not_to_have_text("Scheduled.")
        dialog.get_by_test_id("schedule-cron").fill("30 8 * * 1-5")
        dialog.get_by_test_id("schedule-add").click()
        expect(dialog.get_by_test_id("schedules-message")).to_have_text("Scheduled.", timeout=T)
        expect(items).to_have_count(2, timeout=T)
        assert_no_serious_axe_violations(page, label="the Scheduled dialog")
        added = dialog.locator('[data-testid="schedule-item"]', has_text="Morning report, please")
        expect(added).to_contain_text("30 8 * * 1-5 (Europe/Berlin) · next ")
        added.get_by_test_id("schedule-toggle").click()
        expect(added).to_contain_text("· paused", timeout=T)
        added.get_by_test_id("schedule-delete").click()
        added.get_by_test_id("schedule-delete").click()
        expect(items).to_have_count(1, timeout=T)

    rows = _in_thread(lambda: sorted(Schedule.all_tenants.values_list("message", "paused")))
    assert rows == [("Another agent's", False), ("Daily digest", False), ("The admin's own", False)]
