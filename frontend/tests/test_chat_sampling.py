"""An MCP server's request for the agent's model in the chat app (issue 37; binding
``sampling.require_approval``), in Debian's Chromium: the approval card shows what the server
would send the model (its system prompt, messages, token cap, no tools offered); Approve lets the
model answer and the run go on; Deny with a reason tells the server (the model is not called).
With ``SCREENSHOTS=1`` it writes docs/chat-sampling.png (the card waiting for an answer)."""

from __future__ import annotations

import os

import pytest

from agents.models import CapabilityBinding, CapabilityKind
from agents.tests.factories import agent_with_route
from capabilities.services import mcp_server_save
from capabilities.tests.prog_test_server import serve_prog
from frontend.tests.test_chat_flows import DOCS, T, _needs_chromium, ask, log_in, open_page, start_chat  # noqa: F401
from llm.testing import Reply, ToolCalls
from sessions.models import LLMCall, ToolCall

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.browser,
    pytest.mark.usefixtures("all_tenants_scope"),
]


def test_approve_then_deny_a_servers_use_of_the_model(world, fake_llm, celery_worker, live_server_url):
    from playwright.sync_api import expect

    agent = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], name="Summarizer")
    with serve_prog() as (url, _state):
        server = mcp_server_save(tenant=world.tenant, env=None, name="prog", alias="prog",
                                 transport="streamable_http", url=url)
        CapabilityBinding.all_tenants.create(tenant=world.tenant, agent=agent, kind=CapabilityKind.MCP_SERVER,
                                             mcp_server=server,
                                             config={"sampling": {"allowed": True, "require_approval": True}})
        fake_llm.script(ToolCalls([("prog__summarize", {"text": "a long text"})]), Reply("Short."),
                        Reply("Summarized."), ToolCalls([("prog__summarize", {"text": "secret"})]),
                        Reply("Not summarized."))
        with open_page() as page:
            log_in(page, live_server_url, world.member.username)
            start_chat(page, "Summarizer")
            ask(page, "Summarize a long text")
            card = page.get_by_test_id("approval-card")
            expect(card).to_contain_text("Allow prog to use the agent's model?", timeout=T)
            expect(card).to_contain_text("The MCP server prog asks, during prog__summarize:")
            request = card.get_by_test_id("sampling-request")
            expect(request).to_contain_text("System prompt: You write one-line summaries.")
            expect(request).to_contain_text("user: Summarize: a long text")
            expect(request).to_contain_text("Up to 1024 tokens; no tools")
            if os.environ.get("SCREENSHOTS"):  # docs/*.png are rewritten only on request
                page.get_by_test_id("run").last.screenshot(path=str(DOCS / "chat-sampling.png"))
            card.get_by_test_id("approval-approve").click()
            expect(card.get_by_test_id("approval-outcome")).to_have_text("Approved", timeout=T)
            expect(page.get_by_test_id("assistant-reply").last).to_have_text("Summarized.", timeout=T)

            ask(page, "Summarize my secret")
            second = page.get_by_test_id("approval-card").last
            expect(second.get_by_test_id("sampling-request")).to_contain_text("user: Summarize: secret", timeout=T)
            second.get_by_test_id("approval-deny-reason").fill("private")
            second.get_by_test_id("approval-deny").click()
            expect(second.get_by_test_id("approval-outcome")).to_have_text("Denied — private", timeout=T)
            expect(page.get_by_test_id("assistant-reply").last).to_have_text("Not summarized.", timeout=T)
    approved, denied = ToolCall.all_tenants.filter(run__session__agent=agent).order_by("id")
    assert approved.status == "succeeded" and "summary: Short." in approved.result
    assert denied.status == "failed" and "Their reason: private" in denied.error
    purposes = list(LLMCall.all_tenants.filter(run__session__agent=agent).order_by("id")
                    .values_list("purpose", flat=True))
    assert purposes.count("sampling") == 1  # the denied request never reached the model
