"""The Connect card in Debian's Chromium (issue 37): an agent bound to an MCP server that needs
each person's OAuth account (the platform's own /mcp/knowledge/, on the real ASGI app), which the
member has not connected. The model calls the server's stand-in ``ourkb__connect``; the chat shows
the card; Connect goes through the service's consent page and back to the chat, and the run goes on
by itself with the server's tools (a Celery worker resumes it). With ``SCREENSHOTS=1`` it writes
docs/chat-connect-card.png (the card, pending)."""

from __future__ import annotations

import os

import pytest

from agents.models import CapabilityBinding, CapabilityKind
from agents.tests.factories import agent_with_route
from capabilities.models import McpServer
from frontend.tests.test_chat_flows import DOCS, T, _needs_chromium, ask, log_in, open_page, start_chat  # noqa: F401
from llm.testing import Reply, ToolCalls
from sessions.models import Approval, ToolCall

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.browser,
    pytest.mark.usefixtures("all_tenants_scope"),
]


def librarian_needing_an_account(world, fake_llm, live_server_url, settings):
    """Agent "Librarian" bound to MCP server "Our knowledge" (alias ``ourkb``): the platform's
    own /mcp/knowledge/ on this test's server, with each person's OAuth account
    (``oauth_user``), which nobody has connected. Returns ``(agent, server)``."""
    settings.OUTBOUND_ALLOWED_CIDRS = ["127.0.0.1/32"]  # the "remote" server is this test's own
    agent = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], name="Librarian")
    server = McpServer.all_tenants.create(tenant=world.tenant, name="Our knowledge", alias="ourkb",
                                          transport="streamable_http", url=f"{live_server_url}/mcp/knowledge/",
                                          auth_mode="oauth_user")
    CapabilityBinding.all_tenants.create(tenant=world.tenant, agent=agent, kind=CapabilityKind.MCP_SERVER,
                                         mcp_server=server)
    return agent, server


def test_connect_from_the_card_and_the_run_goes_on(world, fake_llm, celery_worker, live_server_url, settings):
    from playwright.sync_api import expect

    agent, server = librarian_needing_an_account(world, fake_llm, live_server_url, settings)
    fake_llm.script(ToolCalls([("ourkb__connect", {})]), ToolCalls([("ourkb__knowledge_bases", {})]),
                    Reply("You have no knowledge bases yet."))
    with open_page() as page:  # (its event loop: no ORM calls inside)
        log_in(page, live_server_url, world.member.username)
        start_chat(page, "Librarian")
        ask(page, "Which knowledge bases do I have?")
        card = page.get_by_test_id("approval-card")
        expect(card).to_contain_text("Connect Our knowledge?", timeout=T)
        expect(card).to_contain_text("The agent needs your Our knowledge account")
        expect(card.get_by_test_id("connection-card-without")).to_be_visible()
        if os.environ.get("SCREENSHOTS"):  # docs/*.png are rewritten only on request
            page.get_by_test_id("run").last.screenshot(path=str(DOCS / "chat-connect-card.png"))
        chat_url = page.url

        card.get_by_test_id("connection-card-connect").click()
        expect(page.get_by_role("heading", level=1)).to_contain_text("wants to use", timeout=T)  # the consent page
        page.get_by_role("button", name="Allow").click()
        expect(page).to_have_url(f"{chat_url.split('#')[0]}?mcp_connected={server.pk}#{chat_url.split('#')[1]}",
                                 timeout=T)  # back in the same chat
        expect(page.get_by_test_id("assistant-reply").last).to_have_text("You have no knowledge bases yet.",
                                                                         timeout=T)
        expect(page.get_by_test_id("approval-card").get_by_test_id("approval-outcome")).to_have_text("Connected")
    [approval] = Approval.all_tenants.filter(run__session__agent=agent)
    assert (approval.kind, approval.status, approval.decided_by_id) == ("connection", "answered", world.member.pk)
    connect, listed = ToolCall.all_tenants.filter(run__session__agent=agent).order_by("id")
    assert connect.status == "succeeded" and listed.status == "succeeded"
