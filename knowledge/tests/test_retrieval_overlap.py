"""The query's embedding and the lexical list overlap (knowledge.retrieval, "Overlap"):
the embedding request is sent before the lexical statement and awaited after it; the results
are those of the lists computed one after the other; a failed embedding is still a clear
error; a failure meanwhile cancels the request. Without timing: the order of events is
recorded, and the embedder is a scripted server or a stand-in future."""

from __future__ import annotations

import concurrent.futures
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.db import connection

from knowledge import retrieval
from knowledge.retrieval import LEXICAL_MAX_RANKED, SearchError, lexical_sql, rrf_fuse, search, vector_sql
from knowledge.tests import builders
from llm import embeddings
from llm.embeddings import EmbeddingEndpoint, EmbeddingError, embed_texts_start
from tenants.scoping import tenant_scope

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("all_tenants_scope")]

TEXTS = [
    "Backups: take a nightly dump of the database and keep seven of them.",
    "Upgrades: run the migrations first, then restart the workers.",
    "The worker restarts after a deploy; a stale run is resumed by the sweeper.",
    "Tokens are hashed; a revoked token is refused with 401.",
    "The database dump is restored with pg_restore into an empty database.",
    "Nothing here about the subject at all, only filler words.",
]


def _axis(i: int, weight: float = 1.0) -> list[float]:
    return builders.unit([weight if d == i else 0.05 * ((d * 7 + i) % 5) for d in range(384)])


@pytest.fixture
def kb(world):
    kb = builders.knowledge_base(world.tenant, "Runbooks")
    builders.chunks(builders.document(kb, "runbook"), TEXTS, [_axis(i) for i in range(len(TEXTS))])
    return kb


class _StandIn(concurrent.futures.Future):
    """A future that resolves only when it is waited for, recording when that happens."""

    def __init__(self, events: list[str], vectors: list[list[float]] | None = None,
                 error: Exception | None = None) -> None:
        super().__init__()
        self.events, self.vectors, self.error = events, vectors, error
        self.cancelled_by_caller = False

    def result(self, timeout=None):
        self.events.append("embedding awaited")
        if not self.done():
            if self.error is not None:
                self.set_exception(self.error)
            else:
                self.set_result(self.vectors)
        return super().result(timeout)

    def cancel(self) -> bool:
        self.cancelled_by_caller = True
        return super().cancel()


@pytest.fixture
def events(monkeypatch) -> Iterator[list[str]]:
    """What happened, in order: the embedding request started, each statement of the lists
    (lexical, vector), the embedding awaited."""
    happened: list[str] = []

    def record(execute, sql, params, many, context):
        if "knowledge_lexical_candidates" in sql:
            happened.append("lexical statement")
        elif "<=>" in sql:
            happened.append("vector statement")
        return execute(sql, params, many, context)

    with connection.execute_wrapper(record):
        yield happened


def _stand_in_embedder(monkeypatch, events: list[str], **kwargs) -> list[_StandIn]:
    started: list[_StandIn] = []

    def start(provider, model, texts, **options):
        events.append(f"embedding started: {list(texts)}")
        started.append(_StandIn(events, **kwargs))
        return started[-1]

    monkeypatch.setattr(embeddings, "embed_texts_start", start)
    return started


def test_the_lexical_list_runs_while_the_query_is_embedded(world, kb, events, monkeypatch):
    _stand_in_embedder(monkeypatch, events, vectors=[_axis(4)])
    hits = search(tenant_id=world.tenant.pk, knowledge_base_ids=[kb.pk], query="restore the database dump", top_k=3)
    # Two vector statements: the index's answer, then the exact scan, since the knowledge base
    # holds fewer chunks than the candidates asked for (retrieval._vector_list's fallback).
    assert events == ["embedding started: ['restore the database dump']", "lexical statement", "embedding awaited",
                      "vector statement", "vector statement"]
    assert hits[0].text == TEXTS[4] and hits[0].vector_rank == 1 and hits[0].lexical_rank is not None


def _sequential_reference(tenant_id: int, kb_id: int, fingerprint: str, query: str, vector: list[float],
                          top_k: int) -> list[int]:
    """The fused chunk ids computed the plain way: the vector statement, then the lexical one,
    then RRF over {vector, lexical} in that order."""
    with tenant_scope(tenant_id), connection.cursor() as cursor:
        cursor.execute(vector_sql(384, with_documents=False),
                       {"vector": retrieval._vector_literal(vector), "tenant": tenant_id, "kbs": [kb_id],
                        "fingerprint": fingerprint, "documents": None, "limit": 40})
        by_vector = [i for i, _ in sorted(cursor.fetchall(), key=lambda r: (r[1], r[0]))]
        cursor.execute(lexical_sql(), {"query": query, "kbs": [kb_id], "documents": None, "limit": 40,
                                       "strict": False, "max_ranked": LEXICAL_MAX_RANKED})
        by_text = [row[0] for row in cursor.fetchall()]
    return [i for i, _, _ in rrf_fuse({"vector.0": by_vector, "lexical": by_text})[:top_k]]


@pytest.mark.parametrize(("query", "axis"), [
    ("restore the database dump", 4), ("restart the workers", 1), ("revoked token", 3), ("sweeper", 5),
])
def test_the_overlapped_search_returns_what_the_sequential_lists_give(world, kb, events, monkeypatch, query, axis):
    vector = _axis(axis, weight=0.7)
    _stand_in_embedder(monkeypatch, events, vectors=[vector])
    hits = search(tenant_id=world.tenant.pk, knowledge_base_ids=[kb.pk], query=query, top_k=5)
    assert [h.chunk_id for h in hits] == _sequential_reference(world.tenant.pk, kb.pk, kb.embedding_fingerprint, query, vector, 5)
    # and what the caller gets with the vector given (no embedding at all) is the same, scores included
    given = search(tenant_id=world.tenant.pk, knowledge_base_ids=[kb.pk], query=query, top_k=5, query_vector=vector)
    assert given == hits


def test_a_failed_embedding_is_a_clear_search_error_after_the_lexical_statement(world, kb, events, monkeypatch):
    error = EmbeddingError("network", "embeddings from 'test embedder' (all-minilm-l6-v2): connection refused")
    _stand_in_embedder(monkeypatch, events, error=error)
    with pytest.raises(SearchError) as caught:
        search(tenant_id=world.tenant.pk, knowledge_base_ids=[kb.pk], query="backups")
    assert caught.value.code == "embedding_failed"
    assert caught.value.message == f"Embedding the query failed (all-minilm-l6-v2): {error}"
    assert "vector statement" not in events  # nothing searched with a vector that does not exist


def test_the_api_answers_a_failed_embedding_with_502_and_the_reason(world, kb, monkeypatch):
    _stand_in_embedder(monkeypatch, [], error=EmbeddingError("timeout", "embeddings: read timed out"))
    response = world.client().post(f"/api/v1/knowledge-bases/{kb.pk}/search/", {"query": "backups"}, format="json")
    assert response.status_code == 502, response.content
    assert response.json() == {"message": "Embedding the query failed (all-minilm-l6-v2): embeddings: read timed out",
                               "extra": {"code": "embedding_failed"}}


def test_vectors_of_the_wrong_size_are_an_embedding_failure(world, kb, events, monkeypatch):
    _stand_in_embedder(monkeypatch, events, vectors=[[1.0, 0.0]])
    with pytest.raises(SearchError, match="wrong size") as caught:
        search(tenant_id=world.tenant.pk, knowledge_base_ids=[kb.pk], query="backups")
    assert caught.value.code == "embedding_failed"


def test_a_failing_lexical_statement_cancels_the_embedding_request(world, kb, events, monkeypatch):
    started = _stand_in_embedder(monkeypatch, events, vectors=[_axis(0)])

    def broken(*args, **kwargs):
        raise RuntimeError("the lexical statement failed")

    monkeypatch.setattr(retrieval, "_lexical_list", broken)
    with pytest.raises(RuntimeError, match="lexical statement failed"):
        search(tenant_id=world.tenant.pk, knowledge_base_ids=[kb.pk], query="backups")
    assert len(started) == 1 and started[0].cancelled_by_caller and started[0].cancelled()
    assert "embedding awaited" not in events


# --- llm.embeddings.embed_texts_start: returns before the answer -----------------------------------


class _GatedServer:
    """An embeddings endpoint that answers only once ``gate`` is set (one 2-d vector per text)."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.received = threading.Event()
        gate, received = self.gate, self.received

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):  # noqa: N802 - http.server's name
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                received.set()
                gate.wait(30)
                data = json.dumps({"object": "list", "model": body["model"], "data": [
                    {"object": "embedding", "index": i, "embedding": [3.0, 4.0]}
                    for i in range(len(body["input"]))]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()


@pytest.fixture
def gated() -> Iterator[_GatedServer]:
    server = _GatedServer()
    yield server
    server.gate.set()
    server.httpd.shutdown()
    server.httpd.server_close()


def test_embed_texts_start_returns_before_the_answer(gated):
    future = embed_texts_start(EmbeddingEndpoint(name="gated", base_url=gated.base_url), "m", ["a", "b"])
    assert gated.received.wait(30)  # the request is on its way …
    assert not future.done()  # … and the caller has its future, not yet the answer
    gated.gate.set()
    assert future.result(timeout=30) == [[0.6, 0.8], [0.6, 0.8]]


def test_embed_texts_start_reports_bad_input_and_refuses_a_running_loop():
    import asyncio

    with pytest.raises(ValueError, match="empty"):
        embed_texts_start(EmbeddingEndpoint(name="x", base_url="http://127.0.0.1:9/v1"), "m", ["  "]).result(30)

    async def inside_a_loop():
        embed_texts_start(EmbeddingEndpoint(name="x", base_url="http://127.0.0.1:9/v1"), "m", ["a"])

    with pytest.raises(RuntimeError, match="await aembed_texts"):
        asyncio.run(inside_a_loop())


# --- the HNSW settings: the session's outside a transaction (once), the transaction's inside one ----


def _settings_statements(events_sql: list[str]) -> list[str]:
    return [sql for sql in events_sql if "set_config('hnsw.ef_search'" in sql]


@pytest.fixture
def statements() -> Iterator[list[str]]:
    seen: list[str] = []

    def record(execute, sql, params, many, context):
        seen.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(record):
        yield seen


def _show(name: str) -> str:
    with connection.cursor() as cursor:
        cursor.execute(f"SHOW {name}")
        return cursor.fetchone()[0]


@pytest.mark.django_db(transaction=True)
def test_outside_a_transaction_the_hnsw_settings_are_set_once_per_connection(world, kb, statements):
    retrieval._hnsw_session.clear()  # what earlier tests set on this connection is forgotten
    vector = _axis(2)
    first = search(tenant_id=world.tenant.pk, knowledge_base_ids=[kb.pk], query="restart", query_vector=vector,
                   candidates=47)
    assert [", false)" in sql for sql in _settings_statements(statements)] == [True]  # session-wide, once
    assert (_show("hnsw.ef_search"), _show("hnsw.iterative_scan")) == ("80", "relaxed_order")
    statements.clear()
    again = search(tenant_id=world.tenant.pk, knowledge_base_ids=[kb.pk], query="restart", query_vector=vector,
                   candidates=47)
    assert _settings_statements(statements) == [] and again == first  # no statement for them this time
    search(tenant_id=world.tenant.pk, knowledge_base_ids=[kb.pk], query="restart", query_vector=vector,
           candidates=120)
    assert _show("hnsw.ef_search") == "120"  # another value: set again


@pytest.mark.django_db(transaction=True)
def test_inside_a_transaction_the_hnsw_settings_end_with_it(world, kb, statements):
    from django.db import transaction

    with transaction.atomic():
        search(tenant_id=world.tenant.pk, knowledge_base_ids=[kb.pk], query="restart", query_vector=_axis(2),
               candidates=99)
        assert _show("hnsw.ef_search") == "99"
        assert [", true)" in sql for sql in _settings_statements(statements)] == [True]
    assert _show("hnsw.ef_search") != "99"  # a rollback or commit of the caller's transaction: gone with it
