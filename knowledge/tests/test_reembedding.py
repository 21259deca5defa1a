"""Re-embedding when a knowledge base's embedding model changes: every chunk records the model
that made its vector (its fingerprint); a model change (or an admin's "re-embed") queues a job
that re-embeds the chunks document by document (embedding → ready), resumable after a failure;
searches meanwhile compare only the chunks of the current model (never two models' vectors,
of the same size or not) and say so; another tenant's knowledge is untouched.

The fake embedder (:mod:`knowledge.tests.fake_embedder`) gives each ``hash-<seed>-<size>`` model
its own deterministic vector space.
"""

from __future__ import annotations

import math

import pytest

from knowledge import document_status
from knowledge.ingestion import document_ingest
from knowledge.models import Chunk, Document, DocumentStatus, KnowledgeBase
from knowledge.reembedding import ReembedRetry, knowledge_base_reembed
from knowledge.retrieval import search
from knowledge.selectors import knowledge_base_embedding_progress
from knowledge.services import document_add_text, knowledge_base_reembed_request, knowledge_base_update
from knowledge.tests import builders
from knowledge.tests.fake_embedder import fake_embedding, running
from tenants.scoping import tenant_scope

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("all_tenants_scope")]

BOATS = "# Boats\n\nThe harbour keeps twelve sailing boats. Sailing lessons start at the harbour in May."
BIKES = "# Bikes\n\nThe garage rents mountain bikes. Bike tours leave the garage every Sunday morning."


@pytest.fixture
def fake_embedder():
    with running() as embedder:
        yield embedder


@pytest.fixture
def queued(monkeypatch):
    """Tasks recorded, not sent: ``{"ingest": [...], "reembed": [...]}`` (the tests run them)."""
    calls: dict[str, list[dict]] = {"ingest": [], "reembed": []}
    monkeypatch.setattr("knowledge.tasks.document_ingest_enqueue", lambda **kw: calls["ingest"].append(kw))
    monkeypatch.setattr("knowledge.tasks.knowledge_base_reembed_enqueue", lambda **kw: calls["reembed"].append(kw))
    return calls


@pytest.fixture
def statuses(monkeypatch):
    """Every committed document status change, as the listeners get it: ``[(document_id, status,
    embedded_count)]``."""
    seen: list[tuple[int, str, int]] = []
    monkeypatch.setattr(document_status, "_status_listeners",
                        [*document_status._status_listeners,
                         lambda c: seen.append((c.document_id, c.status, c.embedded_count))])
    return seen


def _kb(world, fake, model="hash-a-384", dimensions=384, name="Leisure") -> KnowledgeBase:
    kb = builders.knowledge_base(world.tenant, name, base_url=fake.base_url, dimensions=dimensions,
                                 chunk_size=200, chunk_overlap=20)
    KnowledgeBase.all_tenants.filter(pk=kb.pk).update(embedding_model=model)
    return KnowledgeBase.all_tenants.get(pk=kb.pk)


def _ingested(kb, title, text) -> Document:
    with tenant_scope(kb.tenant_id):
        doc = document_add_text(knowledge_base=kb, title=title, text=text).document
        doc.refresh_from_db()
        assert document_ingest(document_id=doc.pk, generation=doc.generation) == DocumentStatus.READY
    return Document.all_tenants.get(pk=doc.pk)


def _change_model(kb, model, dimensions) -> KnowledgeBase:
    with tenant_scope(kb.tenant_id):
        return knowledge_base_update(knowledge_base=kb, embedding_model=model, dimensions=dimensions)


def _reembed(kb, **kwargs) -> str:
    kb = KnowledgeBase.all_tenants.get(pk=kb.pk)
    with tenant_scope(kb.tenant_id):
        return knowledge_base_reembed(knowledge_base_id=kb.pk, fingerprint=kb.embedding_fingerprint, **kwargs)


def _search(kb, query, **kwargs):
    return search(tenant_id=kb.tenant_id, knowledge_base_ids=[kb.pk], query=query, top_k=10, **kwargs)


def _fingerprints(kb) -> set[str]:
    return set(Chunk.all_tenants.filter(knowledge_base_id=kb.pk).values_list("embedding_fingerprint", flat=True))


def _cosine_distance(a, b) -> float:
    return 1.0 - sum(x * y for x, y in zip(a, b, strict=True))


def test_ingested_chunks_carry_their_models_fingerprint(world, fake_embedder, queued):
    kb = _kb(world, fake_embedder)
    _ingested(kb, "Boats", BOATS)
    assert _fingerprints(kb) == {kb.embedding_fingerprint} == {f"{kb.embedding_provider_id}:384:0:hash-a-384"}
    assert not kb.reembedding


@pytest.mark.parametrize(("model", "dimensions"), [("hash-b-64", 64), ("hash-b-384", 384)])
def test_a_model_change_re_embeds_every_chunk_and_search_uses_the_new_vectors(
        world, fake_embedder, queued, statuses, model, dimensions):
    kb = _kb(world, fake_embedder)
    boats, bikes = _ingested(kb, "Boats", BOATS), _ingested(kb, "Bikes", BIKES)
    old = kb.embedding_fingerprint
    statuses.clear()

    kb = _change_model(kb, model, dimensions)
    assert kb.embedding_fingerprint != old and kb.reembedding
    assert queued["reembed"] == [{"tenant_id": world.tenant.pk, "knowledge_base_id": kb.pk,
                                  "fingerprint": kb.embedding_fingerprint}]
    with tenant_scope(world.tenant.pk):
        progress = knowledge_base_embedding_progress(knowledge_base=kb)
    total = Chunk.all_tenants.filter(knowledge_base_id=kb.pk).count()
    assert (progress.reembedding, progress.embedded, progress.total) == (True, 0, total)

    # Before the job: no chunk is of the new model, so no vector list; the words still find them.
    with tenant_scope(world.tenant.pk):
        hits = _search(kb, "sailing lessons at the harbour")
    assert hits and hits[0].document_id == boats.pk
    assert all(h.vector_rank is None and h.lexical_rank is not None for h in hits)

    assert _reembed(kb) == "done"
    assert _fingerprints(kb) == {kb.embedding_fingerprint}
    assert set(Chunk.all_tenants.filter(knowledge_base_id=kb.pk).values_list("dimensions", flat=True)) == {dimensions}
    for doc in (boats, bikes):
        doc.refresh_from_db()
        assert (doc.status, doc.reembedding, doc.embedded_count) == ("ready", False, doc.chunk_count)
        # Each document went embedding (from 0) → … → ready, once.
        mine = [(s, n) for d, s, n in statuses if d == doc.pk]
        assert mine[0] == ("embedding", 0) and mine[-1] == ("ready", doc.chunk_count)
        assert {s for s, _ in mine[1:-1]} <= {"embedding"}
    kb.refresh_from_db()
    assert not kb.reembedding
    with tenant_scope(world.tenant.pk):
        assert knowledge_base_embedding_progress(knowledge_base=kb).embedded == total

    # The vector list is back, with the new model's vectors: the distance is the new model's.
    with tenant_scope(world.tenant.pk):
        hits = _search(kb, "sailing lessons at the harbour")
    top = hits[0]
    assert top.document_id == boats.pk and top.vector_rank == 1
    chunk = Chunk.all_tenants.get(pk=top.chunk_id)
    expected = _cosine_distance(fake_embedding(model, "sailing lessons at the harbour"),
                                fake_embedding(model, f"{chunk.heading}\n{chunk.text}" if chunk.heading else chunk.text))
    assert math.isclose(top.vector_distance, expected, abs_tol=1e-3)
    assert {m for m, _ in fake_embedder.requests} == {"hash-a-384", model}

    requests = len(fake_embedder.requests)
    assert _reembed(kb) == "done"  # idempotent: nothing left, no request
    assert len(fake_embedder.requests) == requests


@pytest.mark.parametrize(("model", "dimensions"), [("hash-b-64", 64), ("hash-b-384", 384)])
def test_search_mid_job_compares_only_the_current_models_vectors_and_the_job_resumes(
        world, fake_embedder, queued, model, dimensions):
    kb = _kb(world, fake_embedder)
    boats, bikes = _ingested(kb, "Boats", BOATS), _ingested(kb, "Bikes", BIKES)
    kb = _change_model(kb, model, dimensions)

    fake_embedder.fail_after = len(fake_embedder.requests) + 1  # the first document's batch, then 503s
    with pytest.raises(ReembedRetry, match="Re-embedding with hash-b"):
        _reembed(kb)
    fake_embedder.fail_after = None  # up again (the task retries later)
    boats.refresh_from_db()
    bikes.refresh_from_db()
    assert (boats.status, bikes.status) == ("ready", "embedding") and bikes.reembedding
    assert set(Chunk.all_tenants.filter(document=boats).values_list("embedding_fingerprint", flat=True)) == {
        kb.embedding_fingerprint}
    assert kb.embedding_fingerprint not in set(
        Chunk.all_tenants.filter(document=bikes).values_list("embedding_fingerprint", flat=True))

    # Mid-job: the bikes' chunks (old model, maybe another size) are never vector-compared;
    # the lexical list still finds them. A query vector of the new model is what is compared.
    with tenant_scope(world.tenant.pk):
        hits = _search(kb, "mountain bike tours from the garage sailing")
    vectored = [h for h in hits if h.vector_rank is not None]
    assert vectored and {h.document_id for h in vectored} == {boats.pk}
    assert any(h.document_id == bikes.pk and h.lexical_rank is not None for h in hits)
    with tenant_scope(world.tenant.pk):
        with pytest.raises(ValueError, match=f"query_vector must be {dimensions} finite numbers"):
            _search(kb, "bikes", query_vector=[0.1] * (448 - dimensions))

    # The task's retry goes on where it was: only the stale document's chunks are embedded.
    before = len(fake_embedder.requests)
    assert _reembed(kb) == "done"
    assert len(fake_embedder.requests) == before + 1  # bikes' one batch
    bikes.refresh_from_db()
    assert (bikes.status, bikes.reembedding) == ("ready", False)
    assert _fingerprints(kb) == {kb.embedding_fingerprint}
    with tenant_scope(world.tenant.pk):
        hits = _search(kb, "mountain bike tours from the garage")
    assert hits[0].document_id == bikes.pk and hits[0].vector_rank == 1


def test_a_job_that_keeps_failing_ends_its_documents_failed_with_the_reason(world, fake_embedder, queued):
    kb = _kb(world, fake_embedder)
    boats, bikes = _ingested(kb, "Boats", BOATS), _ingested(kb, "Bikes", BIKES)
    kb = _change_model(kb, "hash-b-64", 64)
    fake_embedder.fail_after = len(fake_embedder.requests)
    assert _reembed(kb, final_attempt=True) == "failed"
    for doc in (boats, bikes):
        doc.refresh_from_db()
        assert doc.status == "failed" and doc.status_reason.startswith("Re-embedding with hash-b-64 failed")
        assert "Ingest the document again" in doc.status_reason
    assert Chunk.all_tenants.filter(knowledge_base_id=kb.pk).count() == 0
    kb.refresh_from_db()
    assert not kb.reembedding


def test_a_job_for_an_older_model_stops_and_a_slice_continues(world, fake_embedder, queued):
    kb = _kb(world, fake_embedder)
    _ingested(kb, "Boats", BOATS)
    first = _change_model(kb, "hash-b-64", 64).embedding_fingerprint
    kb = _change_model(kb, "hash-c-64", 64)
    with tenant_scope(world.tenant.pk):
        assert knowledge_base_reembed(knowledge_base_id=kb.pk, fingerprint=first) == "stale"
    assert _fingerprints(kb) != {kb.embedding_fingerprint}
    assert _reembed(kb, slice_seconds=0) == "continue"  # time is up before the first batch
    doc = Document.all_tenants.get(knowledge_base_id=kb.pk)
    assert (doc.status, doc.reembedding) == ("embedding", True)
    assert _reembed(kb) == "done" and _fingerprints(kb) == {kb.embedding_fingerprint}


def test_a_document_being_ingested_when_the_model_changes_is_ingested_again_with_the_new_model(
        world, fake_embedder, queued):
    kb = _kb(world, fake_embedder)
    with tenant_scope(world.tenant.pk):
        doc = document_add_text(knowledge_base=kb, title="Boats", text=BOATS).document
    doc.refresh_from_db()
    old_generation = doc.generation
    kb = _change_model(kb, "hash-b-64", 64)
    doc.refresh_from_db()
    assert doc.generation == old_generation + 1 and doc.status == "queued"
    assert [c["generation"] for c in queued["ingest"]] == [old_generation, doc.generation]
    with tenant_scope(world.tenant.pk):
        assert document_ingest(document_id=doc.pk, generation=old_generation) == "stale"
        assert document_ingest(document_id=doc.pk, generation=doc.generation) == "ready"
    assert _fingerprints(kb) == {kb.embedding_fingerprint}
    assert set(Chunk.all_tenants.filter(document=doc).values_list("dimensions", flat=True)) == {64}


def test_re_embed_request_bumps_the_revision_and_re_embeds_with_the_same_model(world, fake_embedder, queued):
    kb = _kb(world, fake_embedder)
    _ingested(kb, "Boats", BOATS)
    old = kb.embedding_fingerprint
    with tenant_scope(world.tenant.pk):
        kb = knowledge_base_reembed_request(knowledge_base=kb)
    assert kb.embedding_revision == 1 and kb.reembedding and kb.embedding_fingerprint != old
    assert kb.embedding_fingerprint.startswith(f"{kb.embedding_provider_id}:384:1:")
    assert _reembed(kb) == "done" and _fingerprints(kb) == {kb.embedding_fingerprint}


def test_another_tenants_knowledge_is_untouched(world, other_world, fake_embedder, queued):
    ours = _kb(world, fake_embedder)
    theirs = _kb(other_world, fake_embedder)
    _ingested(ours, "Boats", BOATS)
    _ingested(theirs, "Boats", BOATS)
    before = {c.pk: (c.embedding_fingerprint, list(c.embedding))
              for c in Chunk.all_tenants.filter(knowledge_base_id=theirs.pk)}
    ours = _change_model(ours, "hash-b-64", 64)

    # A job run in the other tenant's scope (a forged task) finds no knowledge base: no work.
    from knowledge.tasks import knowledge_base_reembed as task

    assert task(tenant_id=other_world.tenant.pk, knowledge_base_id=ours.pk,
                fingerprint=ours.embedding_fingerprint) == "stale"
    assert _fingerprints(ours) != {ours.embedding_fingerprint}
    assert task(tenant_id=world.tenant.pk, knowledge_base_id=ours.pk, fingerprint=ours.embedding_fingerprint) == "done"
    assert _fingerprints(ours) == {ours.embedding_fingerprint}
    after = {c.pk: (c.embedding_fingerprint, list(c.embedding))
             for c in Chunk.all_tenants.filter(knowledge_base_id=theirs.pk)}
    assert after == before
    theirs.refresh_from_db()
    assert not theirs.reembedding and theirs.embedding_model == "hash-a-384"
    with tenant_scope(other_world.tenant.pk):
        hits = _search(theirs, "sailing lessons at the harbour")
    assert hits and hits[0].vector_rank == 1


# --- API and console ------------------------------------------------------------------------------


def test_api_changes_the_model_shows_progress_and_re_embeds_on_request(world, other_world, fake_embedder, queued):
    kb = _kb(world, fake_embedder)
    _ingested(kb, "Boats", BOATS)
    admin, member = world.client(admin=True), world.client()
    base = f"/api/v1/knowledge-bases/{kb.pk}/"
    assert admin.get(base).json()["embedding_progress"] is None

    r = admin.patch(base, {"embedding_model": "hash-b-64", "dimensions": 64}, format="json")
    assert r.status_code == 200, r.content
    body = r.json()
    total = Chunk.all_tenants.filter(knowledge_base_id=kb.pk).count()
    assert (body["reembedding"], body["embedding_progress"]) == (True, {"embedded": 0, "total": total})
    found = admin.post(f"{base}search/", {"query": "sailing boats"}, format="json").json()
    assert "being re-embedded" in found["notice"] and found["hits"]

    assert _reembed(kb) == "done"
    body = admin.get(base).json()
    assert (body["reembedding"], body["embedding_progress"]) == (False, None)
    assert admin.post(f"{base}search/", {"query": "sailing boats"}, format="json").json()["notice"] == ""

    assert member.post(f"{base}reembed/").status_code == 403  # a tenant-wide knowledge base: admins only
    assert other_world.client(admin=True).post(f"{base}reembed/").status_code == 404
    r = admin.post(f"{base}reembed/")
    assert r.status_code == 202 and r.json()["embedding_revision"] == 1 and r.json()["reembedding"] is True
    assert len(queued["reembed"]) == 2


def test_console_shows_re_embedding_progress_and_re_embeds(world, fake_embedder, queued):
    from django.test import Client

    kb = _kb(world, fake_embedder)
    _ingested(kb, "Boats", BOATS)
    console = Client()
    console.force_login(world.admin)
    page = console.get(f"/admin/knowledge/knowledgebase/{kb.pk}/change/").content.decode()
    assert "current" in page and 'data-testid="kb-reembed"' in page
    assert console.get(f"/admin/knowledge/knowledgebase/{kb.pk}/reembed/").status_code == 200
    r = console.post(f"/admin/knowledge/knowledgebase/{kb.pk}/reembed/")
    assert r.status_code == 302 and len(queued["reembed"]) == 1
    total = Chunk.all_tenants.filter(knowledge_base_id=kb.pk).count()
    assert f"re-embedding 0/{total}" in console.get(f"/admin/knowledge/knowledgebase/{kb.pk}/change/").content.decode()
    found = console.get(f"/admin/knowledge/knowledgebase/{kb.pk}/test-search/", {"query": "sailing"}).content.decode()
    assert 'data-testid="kb-search-notice"' in found
    assert _reembed(kb) == "done"
    assert f"re-embedding 0/{total}" not in console.get(
        f"/admin/knowledge/knowledgebase/{kb.pk}/change/").content.decode()


def test_knowledge_search_tells_the_model_while_a_knowledge_base_is_re_embedded(
        world, fake_llm, fake_embedder, queued, no_enqueue):
    from knowledge.tests.test_kind import _agent, _calls, run_now
    from llm.testing import Reply, ToolCalls
    from sessions.models import Run
    from sessions.tests.conftest import post_message_sync

    kb = _kb(world, fake_embedder)
    _ingested(kb, "Boats", BOATS)
    agent = _agent(world, fake_llm, {"knowledge_bases": [kb.pk], "top_k": 2})
    question = "When do sailing lessons start?"
    fake_llm.script(ToolCalls([("knowledge_search", {"query": question})]), Reply("In May [1]."),
                    ToolCalls([("knowledge_search", {"query": question})]), Reply("In May [2]."))
    run = post_message_sync(agent=agent, user=world.member, content=question)
    run_now(run.pk)
    [call] = _calls(run.pk)
    assert call.status == "succeeded" and "re-embedded" not in call.result

    _change_model(kb, "hash-b-64", 64)
    run = post_message_sync(agent=agent, user=world.member, content=question)
    run_now(run.pk)
    assert Run.all_tenants.get(pk=run.pk).status == "completed"
    [call] = _calls(run.pk)
    assert call.status == "succeeded" and "Sailing lessons start" in call.result  # the words still find it
    assert call.result.endswith("“Leisure” is being re-embedded with a new embedding model; until that is done, "
                                "passages not yet re-embedded are found by their words only, not by meaning.")


def test_the_task_retries_a_failing_endpoint_then_fails_the_documents_left(world, fake_embedder, queued):
    """``knowledge.knowledge_base_reembed`` is late-acknowledged (a lost worker's job is
    delivered again) and retries a failing endpoint (run eagerly here: the retries follow at
    once) before the documents still holding old vectors end failed."""
    from knowledge.reembedding import REEMBED_MAX_RETRIES
    from knowledge.tasks import knowledge_base_reembed as task

    assert task.acks_late and task.reject_on_worker_lost
    kb = _kb(world, fake_embedder)
    boats = _ingested(kb, "Boats", BOATS)
    kb = _change_model(kb, "hash-b-64", 64)
    fake_embedder.fail_after = len(fake_embedder.requests)
    before = len(fake_embedder.requests)
    task.apply(kwargs={"tenant_id": world.tenant.pk, "knowledge_base_id": kb.pk,
                       "fingerprint": kb.embedding_fingerprint})
    assert len(fake_embedder.requests) - before == REEMBED_MAX_RETRIES + 1
    boats.refresh_from_db()
    assert boats.status == "failed" and "overloaded HTTP 503" in boats.status_reason


def test_vectors_of_the_wrong_size_fail_the_ingestion_and_the_re_embedding_with_the_reason(
        world, fake_embedder, queued):
    # The knowledge base says 384 but its model answers with 64: ingestion fails, saying so.
    kb = _kb(world, fake_embedder, model="hash-a-64", dimensions=384)
    with tenant_scope(kb.tenant_id):
        doc = document_add_text(knowledge_base=kb, title="Boats", text=BOATS).document
        doc.refresh_from_db()
        assert document_ingest(document_id=doc.pk, generation=doc.generation) == DocumentStatus.FAILED
    doc = Document.all_tenants.get(pk=doc.pk)
    assert "vectors of size [64]" in doc.status_reason and "expects size 384" in doc.status_reason
    assert not Chunk.all_tenants.filter(document_id=doc.pk).exists()

    # A re-embedding whose new model answers with another size than configured fails the
    # document with the reason.
    good = _kb(world, fake_embedder, name="Harbour")
    boats = _ingested(good, "Boats", BOATS)
    good = _change_model(good, "hash-b-384", 384)
    KnowledgeBase.all_tenants.filter(pk=good.pk).update(embedding_model="hash-b-64")
    KnowledgeBase.all_tenants.filter(pk=good.pk).update(embedding_revision=good.embedding_revision)
    _reembed(good)
    boats = Document.all_tenants.get(pk=boats.pk)
    assert boats.status == DocumentStatus.FAILED
    assert boats.status_reason.startswith("Re-embedding: ") and "expects size 384" in boats.status_reason
