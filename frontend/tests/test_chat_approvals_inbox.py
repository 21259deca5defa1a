"""The approvals inbox in the chat app, in Debian's Chromium (issue 39): a tool call whose
approval rule names the tenant's admins waits; its requester's chat card says a reviewer decides
(no buttons); the admin's top bar counts it, the inbox shows what a reviewer needs (agent, tool,
arguments, the rule's message, who asked) and the admin approves it with a reason. With
SCREENSHOTS=1 it writes docs/chat-approvals-inbox.png.

A run waiting for the member's own account on an OAuth MCP server (kind ``connection``) is in
their inbox only, with Connect (the service's sign-in, then back to the inbox) and Continue
without (a deny, as the chat's card sends), and no Approve. An ``ask_user`` question links to its
chat ("Open the chat"), where it is answered, instead of Approve / Deny."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from asgiref.sync import async_to_sync

from agents.tests.factories import agent_with_route, bind_builtin
from frontend.tests.test_chat_connect_card import librarian_needing_an_account
from frontend.tests.test_chat_flows import log_in, open_page
from llm.testing import Reply, ToolCalls
from sessions.models import Approval, Run, ToolCall
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
        # the app goes to its login form itself once the logout is done: going to "/" before
        # raced it (CI, a loaded machine: still signed in, no login form, the fill timed out)
        expect(page.get_by_test_id("login-username")).to_be_visible(timeout=T)

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


def _waiting_for_an_account(world, fake_llm, no_enqueue, live_server_url, settings, *then):
    """A member's run waiting for their account on an OAuth MCP server (the platform's own
    /mcp/knowledge/, kind ``connection``): the model called its ``ourkb__connect`` stand-in.
    ``then``: what the model answers after."""
    agent, server = librarian_needing_an_account(world, fake_llm, live_server_url, settings)
    fake_llm.script(ToolCalls([("ourkb__connect", {})]), *then)
    run = post_message_sync(agent=agent, user=world.member, content="Which knowledge bases do I have?")
    no_enqueue.clear()  # the test runs it here
    async_to_sync(execute_run)(run.pk)
    assert Run.all_tenants.get(pk=run.pk).status == "awaiting_approval"
    [approval] = Approval.all_tenants.filter(run_id=run.pk)
    assert approval.kind == "connection"
    # Only the run's user gets it: an admin cannot connect someone else's account.
    assert world.client(admin=True).get("/api/v1/approvals/?mine=approver").json() == []
    return run, server, approval


@pytest.mark.timeout(300)
def test_a_connection_waits_with_connect_and_continue_without(world, fake_llm, no_enqueue, live_server_url,
                                                               settings):
    from playwright.sync_api import expect

    run, _, approval = _waiting_for_an_account(world, fake_llm, no_enqueue, live_server_url, settings,
                                               Reply("Without it I cannot see your knowledge bases."))
    with open_page() as page:
        log_in(page, live_server_url, world.member.username)
        expect(page.get_by_test_id("approvals-count")).to_have_text("1", timeout=T)
        page.get_by_test_id("open-approvals").click()
        item = page.get_by_test_id("inbox-item")
        expect(item.get_by_test_id("inbox-title")).to_have_text("Librarian needs your account on Our knowledge",
                                                                timeout=T)
        expect(item.get_by_test_id("inbox-connect")).to_be_visible()
        expect(item.get_by_test_id("inbox-approve")).to_have_count(0)
        expect(item.get_by_test_id("inbox-meta")).to_contain_text("then the agent goes on without it")
        item.get_by_test_id("inbox-reason").fill("Not today.")
        item.get_by_test_id("inbox-without").click()
        expect(item.get_by_test_id("inbox-outcome")).to_have_text("Continued without it — Not today.", timeout=T)
        expect(item.get_by_test_id("inbox-connect")).to_have_count(0)
        expect(page.get_by_test_id("approvals-count")).to_be_hidden()

    approval.refresh_from_db()
    assert (approval.status, approval.decided_by_id, approval.answer) == ("denied", world.member.pk, "Not today.")
    assert no_enqueue == [run.pk]  # queued again, as the chat card's "Continue without" does
    async_to_sync(execute_run)(run.pk)
    run.refresh_from_db()
    assert (run.status, run.reply) == ("completed", "Without it I cannot see your knowledge bases.")
    [call] = ToolCall.all_tenants.filter(run_id=run.pk)
    assert call.status == "failed" and "chose not to connect" in call.error


@pytest.mark.timeout(300)
def test_connect_from_the_inbox_asks_for_the_sign_in_and_comes_back(world, fake_llm, no_enqueue, live_server_url,
                                                                    settings):
    from playwright.sync_api import expect

    run, server, approval = _waiting_for_an_account(world, fake_llm, no_enqueue, live_server_url, settings)
    with open_page() as page:
        log_in(page, live_server_url, world.member.username)
        page.goto(f"{live_server_url}/#/approvals")
        item = page.get_by_test_id("inbox-item")
        expect(item.get_by_test_id("inbox-title")).to_contain_text("Our knowledge", timeout=T)
        with page.expect_request(lambda r: r.method == "POST" and r.url.endswith(
                f"/api/v1/mcp-connections/{server.pk}/connect/")) as asked:
            item.get_by_test_id("inbox-connect").click()
        assert asked.value.post_data_json == {"return_to": "/#/approvals"}
        expect(page.get_by_role("heading", level=1)).to_contain_text("wants to use", timeout=T)  # the consent page
        page.get_by_role("button", name="Allow").click()
        expect(page).to_have_url(f"{live_server_url}/?mcp_connected={server.pk}#/approvals", timeout=T)
        expect(page.get_by_test_id("inbox-status")).to_have_text("Nothing waits for your decision.", timeout=T)

    approval.refresh_from_db()
    assert (approval.status, approval.decided_by_id) == ("answered", world.member.pk)
    assert no_enqueue == [run.pk]  # connecting resumed the run


@pytest.mark.timeout(300)
def test_a_question_links_to_its_chat_instead_of_approve(world, fake_llm, no_enqueue, live_server_url):
    from playwright.sync_api import expect

    agent = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], name="Careful")
    bind_builtin(agent, "ask_user")
    fake_llm.script(ToolCalls([("ask_user", {"question": "Which city should I use?"})]))
    run = post_message_sync(agent=agent, user=world.member, content="Plan a trip")
    no_enqueue.clear()  # the test runs it here
    async_to_sync(execute_run)(run.pk)
    assert Run.all_tenants.get(pk=run.pk).status == "awaiting_approval"

    with open_page() as page:
        log_in(page, live_server_url, world.member.username)
        page.goto(f"{live_server_url}/#/approvals")
        item = page.get_by_test_id("inbox-item")
        expect(item.get_by_test_id("inbox-title")).to_have_text("Careful asks you a question", timeout=T)
        expect(item.get_by_test_id("inbox-message")).to_have_text("Which city should I use?")
        expect(item.get_by_test_id("inbox-approve")).to_have_count(0)
        item.get_by_test_id("inbox-open-chat").click()
        expect(page).to_have_url(f"{live_server_url}/#/sessions/{run.session_id}", timeout=T)
        expect(page.get_by_test_id("approval-card")).to_contain_text("Which city should I use?", timeout=T)
