"""MCP resources pinned to a chat (issue 37), in Debian's Chromium: a resource attached with "@"
is pinned with its chip's pin button and shows in the row of pinned chips above the box (still
there after a reload); every later answer's run reads it (the model's system message holds its
text) without attaching it again; a pin the last answer read again because its server said it
changed shows "updated"; × unpins it. The picture is docs/chat-pinned-resources.png
(written with ``SCREENSHOTS=1``)."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from agents.models import CapabilityBinding, CapabilityKind
from agents.tests.factories import agent_with_route
from capabilities.services import mcp_server_save
from capabilities.tests.pins_mcp_server import URI_A, serve_pins
from frontend.tests.axe import assert_no_serious_axe_violations
from frontend.tests.test_chat_flows import T, _needs_chromium, log_in, open_page, start_chat  # noqa: F401
from llm.testing import Reply
from sessions.models import PinnedResource, Run
from tenants.scoping import tenant_scope

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.browser,
    pytest.mark.usefixtures("all_tenants_scope"),
]

DOCS = Path(__file__).resolve().parents[2] / "docs"


def _mark_last_run_updated(tenant_id: int) -> None:
    """The chat's last run as if it had read its pins again after their server said they changed."""
    from django.db import connection

    try:
        with tenant_scope(tenant_id):
            last = Run.objects.order_by("-pk").first()
            last.context = [{**b, "data": {"resource": {**b["data"]["resource"], "updated": True}}}
                            for b in last.context]
            last.save(update_fields=["context"])
    finally:
        connection.close()


def test_pin_a_resource_to_the_chat(world, fake_llm, celery_worker, live_server_url):
    from playwright.sync_api import expect

    agent = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], name="Librarian")
    with serve_pins() as mcp:
        server = mcp_server_save(tenant=world.tenant, env=None, name="pins", alias="pins",
                                 transport="streamable_http", url=mcp.url)
        CapabilityBinding.all_tenants.create(tenant=world.tenant, agent=agent, kind=CapabilityKind.MCP_SERVER,
                                             mcp_server=server)
        fake_llm.script(Reply("A says version 1."), Reply("Still version 1."))
        with open_page() as page:
            log_in(page, live_server_url, world.member.username)
            start_chat(page, "Librarian")
            box = page.get_by_test_id("composer-input")
            box.fill("@")
            box.type("a")
            options = page.get_by_test_id("resource-option")
            expect(options.first).to_have_attribute("data-uri", URI_A, timeout=T)
            box.press("Enter")
            page.get_by_test_id("resource-chip-pin").click()
            pinned = page.get_by_test_id("pinned-chip")
            expect(pinned).to_have_count(1, timeout=T)
            expect(pinned).to_have_text("a×")
            expect(pinned).to_have_attribute("title", f"pins · {URI_A} · pinned: every answer reads it")
            expect(page.get_by_test_id("resource-chip")).to_have_count(0)
            box.fill("What does a say?")
            box.press("Enter")
            expect(page.get_by_test_id("assistant-reply").last).to_have_text("A says version 1.", timeout=T)
            expect(page.get_by_test_id("sent-resource-chip")).to_have_count(0)  # pinned, not attached
            assert_no_serious_axe_violations(page, label="chat with a pinned resource")
            if os.environ.get("SCREENSHOTS"):
                page.screenshot(path=str(DOCS / "chat-pinned-resources.png"))

            page.reload()
            expect(page.get_by_test_id("pinned-chip")).to_have_count(1, timeout=T)
            box = page.get_by_test_id("composer-input")
            box.fill("And now?")
            box.press("Enter")
            expect(page.get_by_test_id("assistant-reply").last).to_have_text("Still version 1.", timeout=T)

            expect(page.get_by_test_id("pinned-chip-updated")).to_have_count(0)
            # The server said the resource changed and the last answer read it again: its chip says so.
            with ThreadPoolExecutor(max_workers=1) as pool:  # no ORM on Playwright's event-loop thread
                pool.submit(_mark_last_run_updated, world.tenant.pk).result(timeout=30)
            page.reload()
            expect(page.get_by_test_id("pinned-chip-updated")).to_have_text("updated", timeout=T)
            page.get_by_test_id("pinned-chip-unpin").click()
            expect(page.get_by_test_id("pinned-chip")).to_have_count(0, timeout=T)
            expect(page.get_by_test_id("pinned-chips")).to_be_hidden()
    assert not PinnedResource.all_tenants.exists()
    systems = [request["messages"][0]["content"] for request in fake_llm.requests]
    assert len(systems) == 2 and all("Version 1 of a." in system for system in systems), "both runs read the pin"
    assert mcp.state.reads == [URI_A], "the second run used the worker's kept contents (subscribed, unchanged)"
