"""A tripped output guardrail in the chat app, in Debian's Chromium: the answer streams, the
guardrail trips before it is final, and the streamed text is replaced by a retraction notice; the
error says which guardrail stopped it, in its own words, after a reload too."""

from __future__ import annotations

import pytest

from agents.tests.factories import agent_with_route
from frontend.tests.test_chat_flows import ask, log_in, open_page, start_chat
from guardrails.models import Guardrail
from llm.testing import Reply

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.browser,
    pytest.mark.usefixtures("all_tenants_scope"),
]

T = 20_000
CARD = "4111 1111 1111 1111"


@pytest.mark.timeout(300)
def test_an_output_guardrail_retracts_the_streamed_answer(world, fake_llm, celery_worker, live_server_url):
    from playwright.sync_api import expect

    agent = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], name="Cashier",
                             read_timeout_seconds=60)
    Guardrail.all_tenants.create(tenant=world.tenant, agent=agent, name="No cards", point="output", kind="pii",
                                 config={"types": ["card"]}, message="I cannot share card numbers.")
    fake_llm.script(Reply(f"Your card is {CARD}. " + "Here is more detail. " * 20, chunk_size=4,
                          chunk_interval_seconds=0.01))
    with open_page() as page:
        log_in(page, live_server_url, world.member.username)
        start_chat(page, "Cashier")
        ask(page, "What is my card number?")
        expect(page.get_by_test_id("assistant-reply").last).to_contain_text("Your card is", timeout=T)  # it streamed
        notice = page.get_by_test_id("run-retracted")
        expect(notice).to_have_text("Answer withdrawn. I cannot share card numbers. (guardrail “No cards”)",
                                    timeout=T)
        expect(page.get_by_test_id("assistant-reply")).to_have_count(0)
        error = page.get_by_test_id("run-error")
        expect(error).to_contain_text("I cannot share card numbers. (guardrail “No cards”)")
        expect(error).to_contain_text("guardrail_tripped")
        assert CARD not in page.get_by_test_id("run").last.inner_text()

        page.reload()
        expect(page.get_by_test_id("run-error")).to_contain_text("(guardrail “No cards”)", timeout=T)
        expect(page.get_by_test_id("assistant-reply")).to_have_count(0)
        assert CARD not in page.get_by_test_id("run").last.inner_text()
