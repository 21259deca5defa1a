"""The chat app's "Details" on an answer (frontend/static/frontend/trace.js): the run's trace
for its own user, without the admin-only fields (Chromium, real ASGI app and worker)."""

from __future__ import annotations

from pathlib import Path

import pytest

from agents.tests.factories import agent_with_route, bind_builtin
from frontend.tests.axe import assert_no_serious_axe_violations
from frontend.tests.test_spa import CHROMIUM, log_in_and_ask, open_page
from llm.testing import Fail, Reply, ToolCalls

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.browser,
    pytest.mark.usefixtures("all_tenants_scope"),
]


@pytest.fixture(autouse=True)
def _needs_chromium():
    if not Path(CHROMIUM).exists():
        pytest.skip("Debian's chromium is not installed (scripts/ensure_chromium.sh installs it)")


def test_member_opens_the_details_of_an_answer(world, fake_llm, second_fake_llm, celery_worker, live_server_url):
    from playwright.sync_api import expect

    import sessions.tests.tools_for_tests  # noqa: F401  (test_echo)

    agent = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url, second_fake_llm.base_url],
                             name="Helper", system_prompt="SECRET-SYSTEM-PROMPT")
    bind_builtin(agent, "test_echo")
    fake_llm.script(Fail(500, body={"error": {"message": "provider secret detail"}}), Reply("Echoed: hello."))
    second_fake_llm.script(ToolCalls([("test_echo", {"text": "hello"})]))
    with open_page() as page:
        log_in_and_ask(page, live_server_url, username=world.member.username, agent="Helper", question="echo hello")
        expect(page.get_by_test_id("run").last).to_have_attribute("data-run-status", "completed", timeout=20_000)
        page.get_by_test_id("run-details").last.click()
        dialog = page.get_by_test_id("trace-dialog")
        expect(dialog).to_be_visible()
        expect(page.get_by_test_id("trace-step")).to_have_count(2)
        expect(dialog).to_contain_text("Switched to model-1")
        expect(page.get_by_test_id("trace-tool")).to_contain_text("Tool test_echo: answered")
        page.get_by_test_id("trace-tool").locator("summary").click()
        expect(page.get_by_test_id("trace-tool")).to_contain_text('"text": "hello"')
        expect(dialog).not_to_contain_text("SECRET-SYSTEM-PROMPT")
        expect(dialog).not_to_contain_text("provider secret detail")
        expect(page.get_by_test_id("trace-add-to-dataset")).to_have_count(0)  # a member: no evaluation
        assert_no_serious_axe_violations(page, label="answer details")
        page.keyboard.press("Escape")
        expect(dialog).to_be_hidden()


def test_admin_adds_an_answer_to_a_dataset(world, fake_llm, celery_worker, live_server_url):
    from playwright.sync_api import expect

    from evaluation.models import Dataset, DatasetItem

    agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], name="Helper")
    fake_llm.script(Reply("Port 8082."))
    Dataset.all_tenants.create(tenant=world.tenant, name="older set")
    world.admin.set_password("pw-user-123")  # log_in_and_ask's
    world.admin.save()
    with open_page() as page:
        log_in_and_ask(page, live_server_url, username=world.admin.username, agent="Helper", question="Which port?")
        expect(page.get_by_test_id("run").last).to_have_attribute("data-run-status", "completed", timeout=20_000)
        page.get_by_test_id("run-details").last.click()
        section = page.get_by_test_id("trace-add-to-dataset")
        expect(section).to_be_visible()
        expect(page.get_by_test_id("trace-dataset")).to_contain_text("older set")
        page.get_by_test_id("trace-dataset-add").click()
        expect(page.get_by_test_id("trace-dataset-status")).to_have_text("Pick a dataset or name a new one.")
        page.get_by_test_id("trace-dataset-new").fill("from the chat")
        page.get_by_test_id("trace-dataset-add").click()
        expect(page.get_by_test_id("trace-dataset-status")).to_contain_text("Added to “from the chat” as item")
        assert_no_serious_axe_violations(page, label="answer details, add to a dataset")
    item = DatasetItem.all_tenants.get(dataset__name="from the chat", tenant=world.tenant)
    assert (item.input, item.expected) == ("Which port?", {"reference": "Port 8082."})
