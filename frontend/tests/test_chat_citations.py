"""Citations in the chat app, in Debian's Chromium: an answer from a knowledge base shows its
numbered sources, the [n] markers of the reply link to them, a click opens the passage (read
from the chunk API), after a reload too; a knowledge_search call's citations show live.

Real ASGI app, Celery worker, PostgreSQL with pgvector, the embedded embedder; the scripted
model writes the replies.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agents.models import CapabilityBinding
from agents.tests.factories import agent_with_route
from frontend.tests.test_chat_flows import ask, log_in, open_page, start_chat
from knowledge.tests.test_kind import KITCHEN, SAILING, _kb
from llm.testing import Reply, ToolCalls

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.browser,
    pytest.mark.usefixtures("all_tenants_scope"),
]

DOCS = Path(__file__).resolve().parents[2] / "docs"
T = 20_000


@pytest.fixture(autouse=True)
def _needs_chromium():
    from frontend.tests.test_spa import CHROMIUM

    if not Path(CHROMIUM).exists():
        pytest.skip("Debian's chromium is not installed (scripts/ensure_chromium.sh installs it)")


@pytest.fixture
def no_ingest_task(monkeypatch):
    monkeypatch.setattr("knowledge.tasks.document_ingest_enqueue", lambda **kwargs: None)


def _agent(world, fake_llm, name, kb, **config):
    agent = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], name=name)
    binding = CapabilityBinding(tenant=world.tenant, agent=agent, kind="knowledge",
                                config={"knowledge_bases": [kb.pk], **config})
    binding.full_clean()
    binding.save()
    return agent


@pytest.mark.timeout(300)
def test_sources_under_the_answer_open_their_passage_after_a_reload_too(
        world, fake_llm, embedding_server, celery_worker, live_server_url, no_ingest_task):
    from playwright.sync_api import expect

    kb = _kb(world.tenant, embedding_server, "Club handbook", SAILING, KITCHEN)
    _agent(world, fake_llm, "Club helper", kb, top_k=2, retrieve_before_first_turn=True)
    _agent(world, fake_llm, "Club searcher", kb, top_k=1)
    fake_llm.script(
        Reply("The boathouse opens at 8 in the morning [1]. Ask at the desk for a dinghy."),
        ToolCalls([("knowledge_search", {"query": "When does the dishwasher run?"})]),
        Reply("The dishwasher runs every evening at six [1]."),
    )
    with open_page() as page:
        log_in(page, live_server_url, world.member.username)
        start_chat(page, "Club helper")
        ask(page, "When does the boathouse open?")
        run = page.get_by_test_id("run").last
        expect(run).to_have_attribute("data-run-status", "completed", timeout=T)

        # Passages retrieved before the first turn, as numbered sources: the one the reply cites.
        sources = run.get_by_test_id("citation-sources")
        expect(sources).to_be_visible(timeout=T)
        expect(sources.locator("summary")).to_have_text("Sources (1)")
        source = sources.get_by_test_id("citation-source")
        expect(source).to_have_count(1)
        # The heading path without the title its first heading repeats.
        expect(source).to_have_text("[1] Sailing club handbook › Opening hours")
        # The reply's [1] links to it; a click opens the passage, read from the chunk API.
        marker = run.get_by_test_id("assistant-reply").get_by_test_id("citation-marker")
        expect(marker).to_have_text("[1]")
        marker.click()
        panel = page.get_by_test_id("passage-panel")
        expect(panel).to_be_visible()
        expect(panel.get_by_test_id("passage-text")).to_contain_text("opens at 8 in the morning")
        expect(panel.locator(".passage-title")).to_have_text("[1] Sailing club handbook")
        if os.environ.get("SCREENSHOTS"):  # docs/*.png are rewritten only on request
            DOCS.mkdir(exist_ok=True)
            page.screenshot(path=str(DOCS / "chat-citations.png"))
        panel.get_by_test_id("passage-close").click()
        expect(panel).to_be_hidden()
        # After a reload the sources come from the stored run (its start context).
        page.reload()
        run = page.get_by_test_id("run").last
        expect(run.get_by_test_id("citation-source")).to_contain_text("[1] Sailing club handbook", timeout=T)
        expect(run.get_by_test_id("citation-marker")).to_have_count(1)

        # A knowledge_search call's citations (the tool_call_succeeded event's data) show live ...
        start_chat(page, "Club searcher")
        expect(page.get_by_test_id("run")).to_have_count(0, timeout=T)  # the new chat is open
        expect(page.get_by_test_id("composer-input")).to_be_enabled(timeout=T)
        ask(page, "When does the dishwasher run?")
        run = page.get_by_test_id("run").last
        expect(run).to_have_attribute("data-run-status", "completed", timeout=T)
        expect(run.get_by_test_id("citation-source")).to_contain_text("[1] Kitchen rules", timeout=T)
        # ... and after a reload, from the stored tool call.
        page.reload()
        run = page.get_by_test_id("run").last
        expect(run.get_by_test_id("citation-source")).to_contain_text("[1] Kitchen rules", timeout=T)
        run.get_by_test_id("citation-source").click()
        expect(panel.get_by_test_id("passage-text")).to_contain_text("dishwasher runs every evening at six")
