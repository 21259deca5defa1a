"""A retrieval-quality gate: hybrid search must keep finding the passages that answer a frozen
question set in a frozen corpus (issue 34).

The corpus is ``fixtures/quality/`` (a copy of ARCHITECTURE.md as it was on 2026-12-02, never
the live file, which keeps changing). :data:`QUESTIONS` are bench/knowledge_quality.py's 24
questions on that document and 6 written for this gate in other words than the document's,
each with a short exact excerpt of the passage that answers it; :data:`DEEP_QUESTIONS` are
three whose passage each list alone ranks only 11th to 40th. The corpus is ingested through
the real pipeline (Markdown sections, 500-character chunks with 50 of overlap, the embedded
all-MiniLM-L6-v2: 159 chunks) and every question is searched with
:func:`knowledge.retrieval.search`'s defaults. A hit is relevant when its text holds one of
the question's excerpts (whitespace-normalised). **recall@5**: questions with a relevant hit
among the first five; **MRR**: mean of 1/rank of the first relevant hit among the first ten
(0 when none).

The floors are set just below what the search gave when the gate was written; what the
mutations of the search gave is in each floor's docstring. Fusing one list alone fails the
recall and MRR floors; fewer candidates per list (20 instead of 40, or fewer) or RRF with a rank
constant near 0 fail the deep questions' floor. Not caught: 25 or 30 candidates, k from 10 to
6,000, and a fusion that ignores the ranks within each list (on this corpus they rank about as
well as k = 60). If the corpus or the chunking is changed on purpose, measure again and move
the floors with the figures.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from knowledge.ingestion import document_ingest
from knowledge.models import Chunk, KnowledgeBase
from knowledge.retrieval import search
from knowledge.services import document_add_text
from knowledge.tests import builders
from tenants.scoping import tenant_scope

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("all_tenants_scope")]

CORPUS = Path(__file__).parent / "fixtures" / "quality"

QUESTIONS: list[tuple[str, list[str]]] = [
    ("How does the database make sure one tenant cannot read another tenant's rows?",
     ["has one policy, `tenant_isolation`", "PostgreSQL holds every statement to the same context"]),
    ("Which database role do the application's statements run as?", ["every statement runs as `DATABASE_APP_ROLE`"]),
    ("What happens to a run when the worker executing it dies?", ["A run redelivered after its worker died"]),
    ("How often is a run's heartbeat written?", ["writes `Run.heartbeat_at` every few seconds"]),
    ("What does the sweeper do with stale runs?", ["The sweeper (`sessions.services.runs_sweep`"]),
    ("What happens when a tool call needs a human's approval?", ["writes an `Approval` row and leaves"]),
    ("How often is streamed model text published?", ["at most one event per 25 ms"]),
    ("Where are MCP client sessions kept and how are they shared?", ["keeps one pool per event loop"]),
    ("Which addresses is web_fetch allowed to connect to?", ["every address must be public"]),
    ("How are tenants' secrets encrypted?", ["Secrets are envelope-encrypted"]),
    ("How does compaction shorten a long conversation?", ["summarizes all but the last few with the route"]),
    ("How does the router decide whether a provider failure is retried?",
     ["Failures are classified by one pure function"]),
    ("What state does the circuit breaker keep in Redis?", ["a one-minute sliding window of calls and failures"]),
    ("How is a CLI command template turned into a process's arguments?",
     ["each template element becomes exactly one argv element"]),
    ("How is a skill executed when the model calls it?", ["a bound skill is a `SkillTool`"]),
    ("What do I write to add a new capability kind?", ["each kind is one module with a `CapabilityKind` subclass"]),
    ("How is an event published to the session's Redis stream?", ["publishes a frame with one Redis Lua script"]),
    ("What does the page script return after every browser action?", ["returns a diff of the element list"]),
    ("Why does the run host freeze the garbage collector's heap?", ["freezes the heap"]),
    ("How many PostgreSQL connections does the run host's async pool hold?", ["RUN_HOST_PG_CONNECTIONS"]),
    ("Why are vectors stored in PostgreSQL rather than a separate vector database?",
     ["a second store (a vector database beside PostgreSQL)"]),
    ("How are documents split into chunks?", ["The chunker is recursive"]),
    ("How many times is compaction attempted in one turn?", ["Attempts are counted per turn"]),
    ("Why does full-text search go through a SECURITY DEFINER function?", ["uses an index only for leakproof"]),
    # Written for this gate, in other words than the document's.
    ("Could searches reuse the vectors of earlier identical searches to save time?",
     ["one shared between users would let a user learn from timings"]),
    ("Can people still find a document's old passages while its new version is being processed?",
     ["a changed one keeps its old chunks searchable until the new ones are ready"]),
    ("How does the assistant decide whether a newly learned fact replaces one it already knew?",
     ["decide ADD / UPDATE id / DELETE id"]),
    ("Why is remembering things about a user not done with the approximate nearest-neighbour index?",
     ["an HNSW index filters after its scan"]),
    ("Could vectors made by two different embedding models ever be compared with each other?",
     ["so two models' vectors are never compared"]),
    ("What happens if a developer forgets to restrict a query to the current customer?",
     ["a forgotten filter is a crash in tests rather than a leak in production"]),
]

DEEP_QUESTIONS: list[tuple[str, list[str]]] = [
    ("What does the platform do if the shared failure-tracking store is down?",
     ["If Redis is unreachable the router carries on without it"]),
    ("What happens when a stream breaks after the model has already started answering?",
     ["after that a failure is `StreamInterrupted`"]),
    ("What stops two machines from both continuing the same conversation turn after one seemed stuck?",
     ["so two workers never go on with one run"]),
]
"""Questions whose passage neither list ranks in its top 10 but both find within 40 (measured
on 2026-12-02: vector 25 / lexical 13, 12 / 28, 15 / 13; they are the three of 40 questions
written in other words than the document's that fell there, kept whatever the fused rank):
where hybrid search earns its candidates. Fused, they ranked 3, 10 and 7."""

RECALL_AT_5_FLOOR = 0.93
"""Hybrid recall@5 over :data:`QUESTIONS` must stay at least this. Measured 2026-12-02: 0.967
(29 of 30; the miss is ranked 8). Fusing only the vector list gave 0.900, only the lexical list
0.800."""
MRR_FLOOR = 0.74
"""Hybrid MRR over :data:`QUESTIONS` must stay at least this. Measured 2026-12-02: 0.772. Only
the vector list: 0.724, only the lexical list: 0.611; RRF with k = 0: 0.751, k = 600: 0.766;
a fusion that ignores the ranks (``1/(k + 1)`` per list, so: in both lists first, then the best
rank): recall@5 0.933, MRR 0.767, deep 3 of 3, not caught; ranks inverted (``1/(k - rank)``):
0.000."""
DEEP_RECALL_AT_10_FLOOR = 0.66
"""Of :data:`DEEP_QUESTIONS`, the share whose passage hybrid search returns in its first ten
must stay at least this (2 of 3: one may move by a rank on other hardware). Measured 2026-12-02:
3 of 3. 30 candidates per list instead of 40 kept 3, 25 kept 2 (not caught), 20 kept 1, 10
none; RRF with k = 0 or 1 none (k = 10 … 6,000: 3); the maximum instead of the sum of the lists'
1/(k + rank): none; one list alone: none."""


def _norm(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def _first_relevant(hits, excerpts: list[str]) -> int | None:
    wanted = [_norm(e) for e in excerpts]
    for rank, hit in enumerate(hits, start=1):
        if any(w in _norm(hit.text) for w in wanted):
            return rank
    return None


@pytest.fixture
def quality_corpus(world, embedding_server, monkeypatch) -> KnowledgeBase:
    """The frozen corpus ingested into a tenant-wide knowledge base with the real embedder."""
    monkeypatch.setattr("knowledge.tasks.document_ingest_enqueue", lambda **kwargs: None)
    kb = builders.knowledge_base(world.tenant, "Quality corpus", base_url=embedding_server)
    with tenant_scope(world.tenant.pk):
        for path in sorted(CORPUS.glob("*.md")):
            added = document_add_text(knowledge_base=kb, title=path.stem, text=path.read_text(encoding="utf-8"))
            assert document_ingest(document_id=added.document.pk, generation=added.document.generation) == "ready"
    return kb


def _ranks(kb: KnowledgeBase, questions: list[tuple[str, list[str]]], **options) -> dict[str, int | None]:
    """Each question's rank of its first relevant hit in the first ten (None: not there)."""
    return {question: _first_relevant(search(tenant_id=kb.tenant_id, knowledge_base_ids=[kb.pk], query=question,
                                             top_k=10, **options), excerpts)
            for question, excerpts in questions}


def _figures(ranks: dict[str, int | None]) -> tuple[float, float]:
    """``(recall@5, MRR)`` of :func:`_ranks`' answer."""
    recall = sum(1 for r in ranks.values() if r is not None and r <= 5) / len(ranks)
    mrr = sum(1 / r for r in ranks.values() if r is not None) / len(ranks)
    return recall, mrr


def test_every_excerpt_is_in_the_frozen_corpus():
    corpus = _norm(" ".join(p.read_text(encoding="utf-8") for p in sorted(CORPUS.glob("*.md"))))
    assert 20 <= len(QUESTIONS) + len(DEEP_QUESTIONS) <= 35
    missing = [q for q, excerpts in QUESTIONS + DEEP_QUESTIONS if not any(_norm(e) in corpus for e in excerpts)]
    assert missing == []


def test_hybrid_recall_and_mrr_stay_above_the_floors(quality_corpus):
    chunks = Chunk.all_tenants.filter(knowledge_base_id=quality_corpus.pk).count()
    ranks = _ranks(quality_corpus, QUESTIONS)
    recall, mrr = _figures(ranks)
    deep = _ranks(quality_corpus, DEEP_QUESTIONS)
    deep_recall = sum(1 for r in deep.values() if r is not None) / len(deep)
    table = "\n".join(f"  {rank!s:>4}  {question}" for question, rank in {**ranks, **deep}.items())
    report = (f"{chunks} chunks; hybrid recall@5 {recall:.3f} (floor {RECALL_AT_5_FLOOR}), MRR {mrr:.3f} (floor "
              f"{MRR_FLOOR}); deep questions found in the first ten {deep_recall:.2f} (floor "
              f"{DEEP_RECALL_AT_10_FLOOR})\n{table}")
    print("\n" + report)
    assert recall >= RECALL_AT_5_FLOOR and mrr >= MRR_FLOOR and deep_recall >= DEEP_RECALL_AT_10_FLOOR, report
