"""The chat app shows an agent's structured answer (issue 39: an agent with an output schema)
as an indented JSON code block, in Debian's Chromium, against the real app, a Celery worker and
the scripted fake model."""

from __future__ import annotations

import json

import pytest

from agents.tests.factories import agent_with_route
from frontend.tests.test_spa import _needs_chromium, log_in_and_ask, open_page  # noqa: F401  (autouse fixture)
from llm.testing import Reply

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.browser, pytest.mark.usefixtures("all_tenants_scope")]

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
          "required": ["city", "days"]}


def test_a_json_answer_shows_indented_as_a_json_code_block(world, fake_llm, celery_worker, live_server_url):
    from playwright.sync_api import expect

    agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], name="Planner", output_schema=SCHEMA)
    fake_llm.script(Reply('{"city": "Kyoto", "days": 2}'))
    with open_page() as page:
        log_in_and_ask(page, live_server_url, username=world.member.username, agent="Planner", question="Plan it")
        expect(page.get_by_test_id("run").last).to_have_attribute("data-run-status", "completed", timeout=20_000)
        block = page.get_by_test_id("assistant-reply").last.locator(".code-block")
        expect(block).to_have_attribute("data-lang", "json")
        shown = block.locator("pre").inner_text()
        assert shown.strip() == json.dumps({"city": "Kyoto", "days": 2}, indent=2)
    system = fake_llm.requests[0]["messages"][0]["content"]
    assert "valid against this JSON Schema" in system
