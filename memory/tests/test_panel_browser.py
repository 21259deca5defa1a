"""The chat app's Memory dialog in Debian's Chromium, against the real ASGI app: a member opens
it from a chat's header, sees what this agent remembers about them (not a colleague's, not
another agent's), forgets one memory (after a confirming second click) and then all of them
(after a confirmation); the database follows."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.contrib.auth import get_user_model

from agents.tests.factories import agent_with_route
from frontend.tests.axe import assert_no_serious_axe_violations
from frontend.tests.test_chat_flows import T, log_in, open_page, start_chat
from frontend.tests.test_spa import CHROMIUM
from memory.models import Memory
from memory.tests.factories import memory_binding, memory_make

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.browser,
    pytest.mark.usefixtures("all_tenants_scope"),
]


def _in_thread(fn):
    """Run ``fn`` (ORM reads) off this thread: Playwright's sync API runs an event loop here."""
    from concurrent.futures import ThreadPoolExecutor

    from django.db import connection

    from tenants.scoping import system_scope

    def call():
        try:
            with system_scope():  # a new thread starts outside the test's scope
                return fn()
        finally:
            connection.close()

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(call).result()


@pytest.fixture(autouse=True)
def _needs_chromium():
    if not Path(CHROMIUM).exists():
        pytest.skip("Debian's chromium is not installed (scripts/ensure_chromium.sh installs it)")


def test_the_memory_dialog_lists_and_forgets(world, live_server_url):
    from playwright.sync_api import expect

    agent = agent_with_route(tenant=world.tenant, base_urls=["http://127.0.0.1:9/v1"], name="Remembering helper")
    memory_binding(agent)
    other_agent = agent_with_route(tenant=world.tenant, base_urls=["http://127.0.0.1:9/v1"], name="Other helper")
    colleague = get_user_model().objects.create_user(username="colleague", password="pw-colleague-123")
    french = memory_make(tenant=world.tenant, user=world.member, agent=agent, text="Prefers answers in French.",
                         category="preference")
    memory_make(tenant=world.tenant, user=world.member, agent=agent, text="Is vegetarian.")
    memory_make(tenant=world.tenant, user=world.member, agent=agent, text="Has two cats.")
    memory_make(tenant=world.tenant, user=colleague, agent=agent, text="Colleague's memory.")
    memory_make(tenant=world.tenant, user=world.member, agent=other_agent, text="Other agent's memory.")

    with open_page() as page:
        log_in(page, live_server_url, world.member.username)
        start_chat(page, "Remembering helper")
        page.get_by_test_id("open-memory").click()
        dialog = page.get_by_test_id("memory-panel")
        expect(dialog).to_be_visible()
        items = dialog.get_by_test_id("memory-item")
        expect(items).to_have_count(3, timeout=T)
        texts = sorted(items.locator(".memory-text").all_inner_texts())
        assert texts == ["Has two cats.", "Is vegetarian.", "Prefers answers in French."]
        expect(dialog.get_by_test_id("memory-intro")).to_contain_text("Remembering helper remembers")
        assert_no_serious_axe_violations(page, label="the Memory dialog")

        row = dialog.locator(f'[data-testid="memory-item"][data-id="{french.pk}"]')
        row.get_by_test_id("memory-forget").click()
        expect(row).to_contain_text("Forget? Click again")  # nothing forgotten yet
        expect(items).to_have_count(3)
        assert _in_thread(lambda: Memory.all_tenants.filter(pk=french.pk).exists())
        row.get_by_test_id("memory-forget").click()
        expect(items).to_have_count(2, timeout=T)
        assert not _in_thread(lambda: Memory.all_tenants.filter(pk=french.pk).exists())

        dialog.get_by_test_id("memory-clear").click()
        confirm = dialog.get_by_test_id("memory-confirm")
        expect(confirm).to_contain_text("Forget all 2 things")
        dialog.get_by_test_id("memory-clear-cancel").click()
        expect(confirm).to_be_hidden()
        assert _in_thread(lambda: Memory.all_tenants.filter(user=world.member, agent=agent).count()) == 2
        dialog.get_by_test_id("memory-clear").click()
        dialog.get_by_test_id("memory-clear-confirm").click()
        expect(dialog.get_by_test_id("memory-empty")).to_be_visible(timeout=T)
        expect(dialog.get_by_test_id("memory-message")).to_contain_text("Forgotten: 2 items.")
        dialog.get_by_test_id("memory-close").click()
        expect(dialog).to_be_hidden()

    assert Memory.all_tenants.filter(user=world.member, agent=agent).count() == 0
    assert set(Memory.all_tenants.values_list("text", flat=True)) == {"Colleague's memory.", "Other agent's memory."}
