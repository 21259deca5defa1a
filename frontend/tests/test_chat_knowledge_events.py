""""Add to knowledge" follows the document's status from the chat's event stream, in Debian's
Chromium: while the chat's WebSocket is open, the status line moves (queued → ready, or failed
with the reason and "Try again") on ``document_status_changed`` events without asking the
document API; with the stream down (every WebSocket refused), it falls back to polling the
API and still ends "In your knowledge".

Real ASGI app, PostgreSQL, Redis and a Celery worker for the chat's run; ingestion tasks are not
sent: the test runs each ingestion itself, so the status can only reach the page as an event
(or, stream down, by polling); the fake embedder
stands in for the tenant's default embedding model; the scripted model writes the replies.
"""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from django.db import connection

from frontend.tests.test_chat_flows import log_in, open_page, start_chat
from frontend.tests.test_chat_knowledge_uploads import _agent, _attach_and_send
from knowledge.ingestion import document_ingest
from knowledge.models import Document
from knowledge.tests.fake_embedder import running
from llm.testing import Reply
from tenants.scoping import tenant_scope

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.browser,
    pytest.mark.usefixtures("all_tenants_scope"),
]

T = 20_000
DOCUMENT_GET = re.compile(r"/api/v1/knowledge-bases/\d+/documents/\d+/$")
HARBOUR = b"# Harbour rules\n\nBoats leave the harbour before nine. The crane lifts boats out in October.\n"


@pytest.fixture(autouse=True)
def _needs_chromium():
    from frontend.tests.test_spa import CHROMIUM

    if not Path(CHROMIUM).exists():
        pytest.skip("Debian's chromium is not installed (scripts/ensure_chromium.sh installs it)")


@pytest.fixture
def default_embedder(settings):
    with running() as embedder:
        settings.EMBEDDINGS_BASE_URL = embedder.base_url
        yield embedder


@pytest.fixture
def ingest_by_hand(monkeypatch):
    """Ingestion tasks are not sent: the test ingests (so statuses change when it says)."""
    monkeypatch.setattr("knowledge.tasks.document_ingest_enqueue", lambda **kwargs: None)


def _ingest(world, source: str) -> str:
    """Ingest the document of ``source`` now, on a thread of its own (Playwright's sync API runs
    an event loop on the test's thread, where Django refuses database calls)."""

    def ingest() -> str:
        try:
            with tenant_scope(world.tenant.pk):  # (row-level security: outside a scope no row is seen)
                doc = Document.objects.get(source=source)
                return document_ingest(document_id=doc.pk, generation=doc.generation)
        finally:
            connection.close()

    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(ingest).result(timeout=60)


@pytest.mark.timeout(300)
def test_the_status_line_follows_events_and_polls_only_with_the_stream_down(
        world, fake_llm, default_embedder, ingest_by_hand, celery_worker, live_server_url):
    from playwright.sync_api import expect

    _agent(world, fake_llm, "Harbour helper", {"knowledge_bases": [], "user_uploads": True, "top_k": 3})
    fake_llm.script(Reply("Got your files."))
    with open_page() as page:
        document_gets: list[str] = []
        page.on("request", lambda r: document_gets.append(r.url)
                if r.method == "GET" and DOCUMENT_GET.search(r.url) else None)
        log_in(page, live_server_url, world.member.username)
        start_chat(page, "Harbour helper")
        _attach_and_send(page, [
            {"name": "harbour.md", "mimeType": "text/markdown", "buffer": HARBOUR},
            {"name": "blank.md", "mimeType": "text/markdown", "buffer": b"  \n\n  \n"},
            {"name": "later.md", "mimeType": "text/markdown", "buffer": b"# Later\n\nRead this one later on.\n"},
        ], "Here are my files.")
        page.get_by_test_id("files-toggle").click()
        panel = page.get_by_test_id("files-panel")
        expect(panel.get_by_test_id("file-artifact")).to_have_count(3)

        # The stream is open: the status comes as events, the document API is not asked.
        harbour = panel.locator("li", has_text="harbour.md")
        harbour.get_by_role("button", name="Add harbour.md to your knowledge").click()
        status = harbour.get_by_test_id("knowledge-status")
        expect(status).to_have_text("Queued for your knowledge…", timeout=T)
        assert _ingest(world, "harbour.md") == "ready"
        expect(status).to_have_text("In your knowledge", timeout=T)

        blank = panel.locator("li", has_text="blank.md")
        blank.get_by_test_id("add-to-knowledge").click()
        expect(blank.get_by_test_id("knowledge-status")).to_have_text("Queued for your knowledge…", timeout=T)
        assert _ingest(world, "blank.md") == "failed"
        expect(blank.get_by_test_id("knowledge-status")).to_have_text("Failed: The document has no text.", timeout=T)
        expect(blank.get_by_test_id("add-to-knowledge")).to_have_text("Try again")
        page.wait_for_timeout(2_000)  # more than a poll interval: a poller would have asked by now
        assert document_gets == []

        # The stream down (every WebSocket refused): the status line polls the document API.
        page.route_web_socket(re.compile(r"/ws/"), lambda ws: ws.close(code=1011, reason="down for the test"))
        page.reload()
        expect(page.locator(".conn")).to_have_text(re.compile("Reconnecting|Connecting"), timeout=T)  # not "Live"
        page.get_by_test_id("files-toggle").click()
        later = panel.locator("li", has_text="later.md")
        later.get_by_test_id("add-to-knowledge").click()
        expect(later.get_by_test_id("knowledge-status")).to_have_text("Queued for your knowledge…", timeout=T)
        assert _ingest(world, "later.md") == "ready"
        expect(later.get_by_test_id("knowledge-status")).to_have_text("In your knowledge", timeout=T)
        assert document_gets, "with the stream down the status is polled"
