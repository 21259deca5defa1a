"""An MCP server's request for input in the chat app (issue 37), in Debian's Chromium: the form
built from the server's schema (required field refused by the server's schema check, default
shown), Accept, and the run going on with the answer; then a URL request whose card shows the
whole URL with its domain highlighted, as a link that opens only on a click, and Decline. With
``SCREENSHOTS=1`` it writes docs/chat-elicitation-url.png (the URL card)."""

from __future__ import annotations

import os

import pytest

from agents.models import CapabilityBinding, CapabilityKind
from agents.tests.factories import agent_with_route
from capabilities.services import mcp_server_save
from capabilities.tests.elicit_test_server import SIGN_IN_URL, serve_travel
from frontend.tests.test_chat_flows import (  # noqa: F401
    DOCS,
    T,
    _needs_chromium,
    ask,
    log_in,
    open_page,
    shot,
    start_chat,
)
from llm.testing import Reply, ToolCalls
from sessions.models import ToolCall

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.browser,
    pytest.mark.usefixtures("all_tenants_scope"),
]


def test_a_form_and_a_url_from_an_mcp_server(world, fake_llm, celery_worker, live_server_url):
    from playwright.sync_api import expect

    agent = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], name="Traveller")
    with serve_travel() as url:
        server = mcp_server_save(tenant=world.tenant, env=None, name="travel", alias="travel",
                                 transport="streamable_http", url=url)
        CapabilityBinding.all_tenants.create(tenant=world.tenant, agent=agent, kind=CapabilityKind.MCP_SERVER,
                                             mcp_server=server)
        fake_llm.script(ToolCalls([("travel__book", {})]), Reply("Booked Oslo."),
                        ToolCalls([("travel__connect", {"account": "files"})]), Reply("Not connected."))
        with open_page() as page:
            log_in(page, live_server_url, world.member.username)
            start_chat(page, "Traveller")
            ask(page, "Book me a trip")
            card = page.get_by_test_id("approval-card")
            expect(card).to_contain_text("Where to, and for how long?", timeout=T)
            expect(card).to_contain_text("The MCP server travel asks (travel__book):")
            expect(card.get_by_test_id("elicit-days")).to_have_value("3")  # the schema's default
            card.get_by_test_id("elicit-accept").click()  # city is required: the server's schema says so
            expect(card.locator(".approval-error")).to_contain_text("city: required")
            card.get_by_test_id("elicit-city").fill("Oslo")
            card.get_by_test_id("elicit-days").fill("2")
            shot(page, "chat-elicitation-form.png")
            card.get_by_test_id("elicit-accept").click()
            expect(card.get_by_test_id("approval-outcome")).to_have_text("Accepted", timeout=T)
            expect(page.get_by_test_id("assistant-reply").last).to_have_text("Booked Oslo.", timeout=T)

            ask(page, "Connect my files")
            url_card = page.get_by_test_id("approval-card").last
            expect(url_card).to_contain_text("Sign in to your files", timeout=T)
            link = url_card.get_by_test_id("elicit-url")
            expect(link).to_have_text(SIGN_IN_URL)  # the whole URL
            expect(link.get_by_test_id("elicit-domain")).to_have_text("auth.example.com")
            assert link.get_attribute("href") == SIGN_IN_URL and link.get_attribute("target") == "_blank"
            assert link.get_attribute("rel") == "noopener noreferrer"
            assert len(page.context.pages) == 1  # nothing was opened without a click
            if os.environ.get("SCREENSHOTS"):  # docs/*.png are rewritten only on request
                page.get_by_test_id("run").last.screenshot(path=str(DOCS / "chat-elicitation-url.png"))
            url_card.get_by_test_id("elicit-decline").click()
            expect(url_card.get_by_test_id("approval-outcome")).to_have_text("Declined", timeout=T)
            expect(page.get_by_test_id("assistant-reply").last).to_have_text("Not connected.", timeout=T)
    book, connect = ToolCall.all_tenants.filter(run__session__agent=agent).order_by("id")
    assert book.status == "succeeded" and "booked Oslo for 2 days" in book.result
    assert connect.status == "failed" and "declined to open the page" in connect.error
