"""A run paused for a tool the API client runs (OpenAI-compatible API, an Approval of kind
``client_tool``), seen in the chat app in Debian's Chromium: the card says the run waits for the
API client and offers no Approve / Deny (the chat app's approval endpoint refuses that kind)."""

from __future__ import annotations

import pytest

from agents.tests.factories import agent_with_route
from frontend.tests.test_chat_flows import log_in, open_page
from llm.testing import ToolCalls
from sessions.models import Run
from sessions.tests.test_openai_client_tools import WEATHER, sdk

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.browser,
    pytest.mark.usefixtures("all_tenants_scope"),
]

T = 20_000


@pytest.mark.timeout(300)
def test_a_client_tool_pause_shows_as_waiting_for_the_api_client(world, fake_llm, celery_worker, live_server_url):
    from playwright.sync_api import expect

    agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], name="Forecaster")
    fake_llm.script(ToolCalls([("get_weather", {"city": "Paris"})]))
    answer = sdk(live_server_url, world.member_token).chat.completions.create(
        model="forecaster", messages=[{"role": "user", "content": "Weather in Paris?"}], tools=[WEATHER])
    assert answer.choices[0].finish_reason == "tool_calls"
    chat_id = Run.all_tenants.get(pk=int(answer.id.removeprefix("chatcmpl-"))).session_id

    with open_page() as page:
        log_in(page, live_server_url, world.member.username)
        page.goto(f"{live_server_url}/#/sessions/{chat_id}")
        card = page.get_by_test_id("approval-card")
        expect(card).to_contain_text("Waiting for the API client to run get_weather", timeout=T)
        expect(card.get_by_test_id("approval-approve")).to_have_count(0)
        expect(card.get_by_test_id("approval-deny")).to_have_count(0)
