"""A remote A2A agent's tool call in the chat, in Debian's Chromium: while the remote agent
streams its answer, the tool card shows the call's progress (``tool_call_progress``: the remote
task's state, then the characters received); once it ends, the progress line goes and the
result is shown.

Real ASGI app, PostgreSQL, Redis and a Celery worker; agent A is bound (capability kind ``a2a``)
to agent B of this same server at ``/a2a/<b>/``; the scripted model writes A's tool call, B's
slow answer and A's reply.
"""

from __future__ import annotations

import pytest

from agents.tests.factories import agent_with_route
from frontend.tests.test_chat_flows import T, ask, log_in, open_page, start_chat
from llm.testing import Reply, ToolCalls

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.browser,
    pytest.mark.usefixtures("all_tenants_scope"),
]


@pytest.fixture(autouse=True)
def _needs_chromium():
    from pathlib import Path

    from frontend.tests.test_spa import CHROMIUM

    if not Path(CHROMIUM).exists():
        pytest.skip("Debian's chromium is not installed (scripts/ensure_chromium.sh installs it)")


def test_the_tool_card_shows_a_remote_agents_progress(world, fake_llm, celery_worker, live_server_url):
    from playwright.sync_api import expect

    agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], name="Paris Expert", read_timeout_seconds=60)
    asker = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], name="Asker", read_timeout_seconds=60)
    admin = world.client(admin=True)
    remote = admin.post("/api/v1/admin/a2a-agents/", {
        "name": "Paris", "card_url": f"{live_server_url}/a2a/paris-expert/.well-known/agent-card.json",
        "headers": {"Authorization": f"Bearer {world.member_token}"}}, format="json")
    assert remote.status_code == 201, remote.content
    bound = admin.post("/api/v1/admin/bindings/", {"agent": asker.pk, "kind": "a2a",
                                                   "config": {"a2a_agent": remote.json()["id"]}}, format="json")
    assert bound.status_code == 201, bound.content
    fake_llm.script(
        ToolCalls([("paris-expert", {"message": "Tell me about Paris"})]),
        Reply("Paris " * 80, chunk_size=6, chunk_interval_seconds=0.05),  # B: about 4 s of chunks
        Reply("The expert has spoken."),
    )
    with open_page() as page:
        log_in(page, live_server_url, world.member.username)
        start_chat(page, "Asker")
        ask(page, "Ask the expert")
        card = page.get_by_test_id("tool-call-card")
        expect(card).to_have_attribute("data-status", "running", timeout=T)
        expect(card.get_by_test_id("tool-progress")).to_contain_text("characters received", timeout=T)
        expect(card).to_have_attribute("data-status", "succeeded", timeout=T)
        expect(card.get_by_test_id("tool-progress")).to_be_hidden()
        expect(page.get_by_test_id("assistant-reply").last).to_have_text("The expert has spoken.", timeout=T)
