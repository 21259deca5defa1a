""""Add to knowledge" in the chat app, in Debian's Chromium: a file attached to a chat with an
agent that allows user uploads is added from the Files panel, its status moves to "In your
knowledge" as the Celery worker ingests it (or "Failed: <reason>"), the agent's knowledge_search
then finds it (a citation of it under the answer), "My knowledge" lists the user's documents
and deletes one; an agent that does not allow it offers no button.

Real ASGI app, Celery worker, PostgreSQL with pgvector, the embedded embedder (the tenant's
default provider points at it); the scripted model writes the replies.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agents.models import CapabilityBinding
from agents.tests.factories import agent_with_route
from frontend.tests.axe import assert_no_serious_axe_violations
from frontend.tests.test_chat_flows import ask, log_in, open_page, start_chat
from knowledge.models import Document
from llm.testing import Reply, ToolCalls

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.browser,
    pytest.mark.usefixtures("all_tenants_scope"),
]

DOCS = Path(__file__).resolve().parents[2] / "docs"
T = 20_000
INGEST_T = 120_000  # ms: the worker parses and embeds the file on two busy cores

LOCKERS = b"""# Locker rules

Every member gets a locker in the west corridor. The locker code is changed each spring;
the current code is 2468, and lost keys are replaced at the front desk for five euros.
"""


@pytest.fixture(autouse=True)
def _needs_chromium():
    from frontend.tests.test_spa import CHROMIUM

    if not Path(CHROMIUM).exists():
        pytest.skip("Debian's chromium is not installed (scripts/ensure_chromium.sh installs it)")


def _agent(world, fake_llm, name, config):
    agent = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], name=name)
    if config is not None:
        binding = CapabilityBinding(tenant=world.tenant, agent=agent, kind="knowledge", config=config)
        binding.full_clean()
        binding.save()
    return agent


def _attach_and_send(page, files, text):
    from playwright.sync_api import expect

    page.get_by_test_id("composer-file").set_input_files(files=files)
    expect(page.get_by_test_id("attachment-chip")).to_have_count(len(files))
    ask(page, text)
    expect(page.get_by_test_id("run").last).to_have_attribute("data-run-status", "completed", timeout=T)


@pytest.mark.timeout(300)
def test_add_an_attachment_to_knowledge_see_its_status_and_find_it(world, fake_llm, embedding_server, celery_worker,
                                                                   live_server_url, settings):
    from playwright.sync_api import expect

    settings.EMBEDDINGS_BASE_URL = embedding_server  # the tenant's default embedder, made on first use
    _agent(world, fake_llm, "Locker helper", {"knowledge_bases": [], "user_uploads": True, "top_k": 3})
    _agent(world, fake_llm, "Plain helper", None)
    fake_llm.script(
        Reply("Got your files."),
        ToolCalls([("knowledge_search", {"query": "What is the locker code?"})]),
        Reply("The locker code is 2468 [1]."),
        Reply("Got it."),
    )
    with open_page() as page:
        log_in(page, live_server_url, world.member.username)
        start_chat(page, "Locker helper")
        _attach_and_send(page, [
            {"name": "lockers.md", "mimeType": "text/markdown", "buffer": LOCKERS},
            {"name": "blank.md", "mimeType": "text/markdown", "buffer": b"   \n\n   \n"},
        ], "Here are my files.")

        page.get_by_test_id("files-toggle").click()
        panel = page.get_by_test_id("files-panel")
        expect(panel.get_by_test_id("file-artifact")).to_have_count(2)
        lockers = panel.locator("li", has_text="lockers.md")
        blank = panel.locator("li", has_text="blank.md")
        lockers.get_by_role("button", name="Add lockers.md to your knowledge").click()
        status = lockers.get_by_test_id("knowledge-status")
        expect(status).to_be_visible()
        expect(status).to_have_text("In your knowledge", timeout=INGEST_T)  # queued → … → ready, polled
        blank.get_by_test_id("add-to-knowledge").click()
        expect(blank.get_by_test_id("knowledge-status")).to_have_text("Failed: The document has no text.",
                                                                      timeout=INGEST_T)
        expect(blank.get_by_test_id("add-to-knowledge")).to_have_text("Try again")
        if os.environ.get("SCREENSHOTS"):  # docs/*.png are rewritten only on request
            DOCS.mkdir(exist_ok=True)
            page.screenshot(path=str(DOCS / "chat-add-to-knowledge.png"))

        # The agent's knowledge_search finds the file, for this user: a citation under the answer.
        ask(page, "What is the locker code?")
        run = page.get_by_test_id("run").last
        expect(run).to_have_attribute("data-run-status", "completed", timeout=T)
        expect(run.get_by_test_id("citation-source")).to_contain_text("[1] Locker rules", timeout=T)

        # After a reload the Files panel shows the stored status (matched by content).
        page.reload()
        page.get_by_test_id("files-toggle").click()
        expect(panel.locator("li", has_text="lockers.md").get_by_test_id("knowledge-status")).to_have_text(
            "In your knowledge", timeout=T)

        # "My knowledge": both documents with their status; delete the failed one.
        panel.get_by_test_id("open-my-knowledge").click()
        dialog = page.get_by_test_id("my-knowledge")
        expect(dialog).to_be_visible()
        items = dialog.get_by_test_id("my-knowledge-item")
        expect(items).to_have_count(2, timeout=T)
        expect(items.filter(has_text="Locker rules")).to_contain_text("In your knowledge")
        failed = items.filter(has_text="blank.md")
        expect(failed).to_contain_text("Failed: The document has no text.")
        assert_no_serious_axe_violations(page, include='[data-testid="my-knowledge"]', label="My knowledge")
        failed.get_by_test_id("my-knowledge-delete").click()
        expect(failed.get_by_test_id("my-knowledge-delete")).to_have_text("Delete? Click again")
        failed.get_by_test_id("my-knowledge-delete").click()
        expect(items).to_have_count(1)
        expect(dialog.get_by_test_id("my-knowledge-message")).to_contain_text("Deleted “blank.md”")
        dialog.get_by_test_id("my-knowledge-close").click()
        # The Files panel behind it was refreshed: the deleted file may be added again.
        expect(panel.locator("li", has_text="blank.md").get_by_test_id("add-to-knowledge")).to_have_text(
            "Add to knowledge", timeout=T)

        # An agent without user uploads: the attachment is listed, with no "Add to knowledge".
        start_chat(page, "Plain helper")
        expect(page.get_by_test_id("run")).to_have_count(0, timeout=T)
        expect(page.get_by_test_id("composer-input")).to_be_enabled(timeout=T)
        _attach_and_send(page, [{"name": "other.md", "mimeType": "text/markdown", "buffer": b"# Other\n\nText."}],
                         "One more.")
        page.get_by_test_id("files-toggle").click()
        expect(panel.get_by_test_id("file-artifact")).to_have_count(1)
        expect(panel.get_by_test_id("open-my-knowledge")).to_have_count(1)  # their knowledge is still reachable
        expect(panel.get_by_test_id("add-to-knowledge")).to_have_count(0)

    assert list(Document.all_tenants.values_list("title", "status")) == [("Locker rules", "ready")]
