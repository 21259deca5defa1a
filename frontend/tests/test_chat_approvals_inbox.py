"""The approvals inbox in the chat app, in Debian's Chromium (issue 39): a tool call whose
approval rule names the tenant's admins waits; its requester's chat card says a reviewer decides
(no buttons); the admin's top bar counts it, the inbox shows what a reviewer needs (agent, tool,
arguments, the rule's message, who asked) and the admin approves it with a reason. With
SCREENSHOTS=1 it writes docs/chat-approvals-inbox.png."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from asgiref.sync import async_to_sync

from agents.tests.factories import agent_with_route, bind_builtin
from frontend.tests.test_chat_flows import log_in, open_page
from llm.testing import Reply, ToolCalls
from sessions.models import Approval, Run
from sessions.runner.loop import execute_run
from sessions.tests.conftest import post_message_sync

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.browser,
    pytest.mark.usefixtures("all_tenants_scope"),
]

T = 20_000
DOCS = Path(__file__).resolve().parents[2] / "docs"


@pytest.mark.timeout(300)
def test_a_reviewer_approves_from_the_inbox(world, fake_llm, no_enqueue, live_server_url):
    from playwright.sync_api import expect

    agent = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], name="Payments")
    bind_builtin(agent, "test_echo", approval_policy=[{
        "pattern": "test_*", "action": "ask", "approvers": {"roles": ["admin"]},
        "message": "Finance must approve echoes.", "timeout_seconds": 86400, "on_timeout": "deny",
    }])
    fake_llm.script(ToolCalls([("test_echo", {"text": "pay 40 EUR"})]), Reply("Paid."))
    run = post_message_sync(agent=agent, user=world.member, content="Pay the invoice")
    no_enqueue.clear()  # the test runs it here
    async_to_sync(execute_run)(run.pk)
    assert Run.all_tenants.get(pk=run.pk).status == "awaiting_approval"

    with open_page() as page:
        # The requester's chat: the card says who decides, and offers no buttons.
        log_in(page, live_server_url, world.member.username)
        page.goto(f"{live_server_url}/#/sessions/{run.session_id}")
        card = page.get_by_test_id("approval-card")
        expect(card.get_by_test_id("approval-waiting-reviewer")).to_contain_text("role admin", timeout=T)
        expect(card.get_by_test_id("approval-approve")).to_have_count(0)
        page.get_by_test_id("logout").click()

        # The admin: the top bar counts it; the inbox shows it; approve with a reason.
        log_in(page, live_server_url, world.admin.username, password="pw-admin-123")
        expect(page.get_by_test_id("approvals-count")).to_have_text("1", timeout=T)
        page.get_by_test_id("open-approvals").click()
        item = page.get_by_test_id("inbox-item")
        expect(item).to_contain_text("Payments wants to run test_echo", timeout=T)
        expect(item.get_by_test_id("inbox-message")).to_have_text("Finance must approve echoes.")
        expect(item).to_contain_text("pay 40 EUR")
        expect(item.get_by_test_id("inbox-meta")).to_contain_text(f"Asked by {world.member.username}")
        item.get_by_test_id("inbox-reason").fill("Budget ok.")
        if os.environ.get("SCREENSHOTS"):  # docs/*.png are rewritten only on request
            page.screenshot(path=str(DOCS / "chat-approvals-inbox.png"))
        item.get_by_test_id("inbox-approve").click()
        expect(item.get_by_test_id("inbox-outcome")).to_have_text("Approved — Budget ok.", timeout=T)
        expect(page.get_by_test_id("approvals-count")).to_be_hidden()

    approval = Approval.all_tenants.get(run_id=run.pk)
    assert (approval.status, approval.decided_by_id, approval.answer) == ("approved", world.admin.pk, "Budget ok.")
    assert no_enqueue == [run.pk]  # queued again for any worker
