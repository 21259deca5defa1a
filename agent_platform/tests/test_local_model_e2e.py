"""End to end on the embedded model: seed_demo's "Assistant" (Qwen2.5-Coder-0.5B-Instruct via
llama.cpp, text tool calls) asked for the time in Tokyo, through the API and a real worker,
with the real mcp-server-time over stdio.

The small model's wording is not asserted: the run must end within its timeout, completed or
failed for a reason the model's own behaviour explains (:data:`MODEL_BEHAVIOUR_REASONS`; never
``internal_error``, ``configuration``, ``capability_unavailable``...: those are the platform's
faults), and its LLM calls must be recorded.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.core.management import call_command
from django.test import override_settings
from rest_framework.test import APIClient

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.local_model]

MODEL_BEHAVIOUR_REASONS = frozenset({
    "max_loop_count", "model_error", "turn_timeout", "run_timeout", "context_window", "compaction_failed",
})
"""Reasons a 0.5B model may cause by itself (looping on tools, an empty answer, slowness, a long
history); any other reason fails the test."""


@pytest.fixture(scope="session")
def local_model_url():
    import importlib.util

    if importlib.util.find_spec("llama_cpp") is None:
        pytest.skip("llama-cpp-python is not installed (the 'llm' extra; make test installs it)")
    sys.path.insert(0, str(ROOT / "scripts"))
    import llm_server
    import setup_model

    model = setup_model.default_model_path()
    if not model.exists():
        pytest.skip(f"the model is not set up at {model} (make test runs scripts/setup_model.py)")
    from conftest import free_port, stop_process

    port = free_port()
    log = open(ROOT / "var" / "test-llm.log", "w")
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "scripts" / "llm_server.py")],
        env={**os.environ, "LLM_PORT": str(port), "LLM_VERBOSE": "false"}, stdout=log, stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}/v1"
    try:
        if not llm_server.wait_ready(url, timeout_seconds=180):
            raise RuntimeError(f"the model server did not start; see {log.name}")
        yield url
    finally:
        stop_process(proc, timeout_seconds=20)
        log.close()


def test_demo_assistant_answers_the_time_in_tokyo(local_model_url, celery_worker):
    with override_settings(LLM_BASE_URL=local_model_url):
        call_command("seed_demo")
    from tenants.models import Membership
    from tenants.services import api_token_create

    membership = Membership.all_tenants.get(user__username="demo-user")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {api_token_create(membership=membership).raw}")
    [agent] = [a for a in client.get("/api/v1/agents/").json()["results"] if a["name"] == "Assistant"]
    session = client.post("/api/v1/sessions/", {"agent": agent["id"]}, format="json").json()
    posted = client.post(
        f"/api/v1/sessions/{session['id']}/messages/", {"content": "What time is it in Tokyo? Use the tool."},
        format="json",
    ).json()
    run_id = posted["run"]["id"]

    deadline = time.monotonic() + 240
    while True:
        run = client.get(f"/api/v1/runs/{run_id}/").json()
        if run["status"] in ("completed", "failed"):
            break
        assert time.monotonic() < deadline, f"run still {run['status']} after 240 s"
        time.sleep(0.5)
    assert run["status"] == "completed" or run["reason"] in MODEL_BEHAVIOUR_REASONS, run
    activities = client.get(f"/api/v1/runs/{run_id}/activities/").json()["results"]
    llm_calls = [a for a in activities if a["kind"] == "llm_call"]
    assert llm_calls and all(c["model"] == "qwen2.5-coder-0.5b-instruct" for c in llm_calls)
    assert llm_calls[0]["latency_ms"] > 0 and llm_calls[0]["completion_tokens"] > 0
    # Reported, not asserted (a 0.5B model): what the run did.
    print("run:", run["status"], run["reason"], repr(run["reply"][:200]))
    print("tool calls:", [(c["name"], c["status"], c["result"][:80]) for c in run["tool_calls"]])


def _wait_for_documents_ready(tenant_slug: str, timeout_seconds: float) -> list:
    """The demo knowledge base's documents once every one is ready (ingested by the Celery worker)."""
    from knowledge.models import Document

    deadline = time.monotonic() + timeout_seconds
    while True:
        docs = list(Document.all_tenants.filter(tenant__slug=tenant_slug, knowledge_base__name="Platform documentation"))
        assert not [d for d in docs if d.status == "failed"], [(d.title, d.status_reason) for d in docs]
        if docs and all(d.status == "ready" for d in docs):
            return docs
        assert time.monotonic() < deadline, [(d.title, d.status, d.embedded_count, d.chunk_count) for d in docs]
        time.sleep(1)


@pytest.mark.timeout(1500)  # ingestion (~400 chunks on the embedded embedder) and a 0.5B model on 2 busy cores
def test_docs_assistant_answers_from_the_documentation_with_citations(local_model_url, embedding_server,
                                                                      celery_worker):
    """seed_demo's knowledge base (README.md, ARCHITECTURE.md) ingested by the worker with the
    embedded embedder, and its "Docs assistant" (retrieval before the first turn) asked how to
    start the platform: the run completes, the retrieved passages went into the model input
    (stored as the run's context, part of the first call's prompt tokens) and they cite README
    chunks; any [n] in the reply names one of them."""
    import re

    from knowledge.models import Chunk

    with override_settings(LLM_BASE_URL=local_model_url, EMBEDDINGS_BASE_URL=embedding_server):
        call_command("seed_demo")
    docs = _wait_for_documents_ready("demo", timeout_seconds=600)
    assert sorted(d.source for d in docs) == ["ARCHITECTURE.md", "README.md"]
    readme_id = next(d.pk for d in docs if d.source == "README.md")
    from tenants.models import Membership
    from tenants.services import api_token_create

    membership = Membership.all_tenants.get(user__username="demo-user")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {api_token_create(membership=membership).raw}")
    [agent] = [a for a in client.get("/api/v1/agents/").json()["results"] if a["name"] == "Docs assistant"]
    session = client.post("/api/v1/sessions/", {"agent": agent["id"]}, format="json").json()
    posted = client.post(f"/api/v1/sessions/{session['id']}/messages/",
                         {"content": "How do I start the platform?"}, format="json").json()
    run_id = posted["run"]["id"]
    deadline = time.monotonic() + 300
    while True:
        run = client.get(f"/api/v1/runs/{run_id}/").json()
        if run["status"] in ("completed", "failed"):
            break
        assert time.monotonic() < deadline, f"run still {run['status']} after 300 s"
        time.sleep(0.5)
    assert run["status"] == "completed", run
    assert run["reply"].strip()

    detail = client.get(f"/api/v1/sessions/{session['id']}/").json()
    [stored] = [r for r in detail["runs"] if r["id"] == run_id]
    [block] = stored["context"]
    assert block["source"] == "knowledge" and block["title"].startswith("Passages from “Platform documentation”")
    citations = block["data"]["citations"]
    assert len(citations) == 4 and [c["n"] for c in citations] == [1, 2, 3, 4]
    readme = [c for c in citations if c["document_id"] == readme_id]
    assert readme, citations
    chunks = {c.pk: c for c in Chunk.all_tenants.filter(pk__in=[c["chunk_id"] for c in citations])}
    assert any("make run" in chunks[c["chunk_id"]].text for c in readme), [chunks[c["chunk_id"]].text[:80] for c in readme]
    for c in citations:  # the model read each passage: "[n] title › heading" + its text
        assert f"[{c['n']}] {c['document_title']}" in block["text"]
        assert chunks[c["chunk_id"]].text.strip()[:200] in block["text"]
    activities = client.get(f"/api/v1/runs/{run_id}/activities/").json()["results"]
    first_call = [a for a in activities if a["kind"] == "llm_call"][0]
    assert first_call["prompt_tokens"] > len(block["text"]) // 6, first_call  # the passages were in the prompt
    # Reported, not asserted (a 0.5B model): whether it cited, and what.
    cited = sorted({int(n) for n in re.findall(r"\[(\d+)\]", run["reply"])})
    print("reply:", repr(run["reply"][:400]), "cited:", cited, "known:", [c["n"] for c in citations])
