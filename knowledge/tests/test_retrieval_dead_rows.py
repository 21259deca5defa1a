"""The vector list finds a knowledge base's live chunks however many dead ones its HNSW index
still holds.

pgvector 0.8.6's HNSW index keeps the entries of deleted (and rolled-back) chunk rows until a
VACUUM; measured on the embedded PostgreSQL 18: after 6 rounds of 6 chunks written and deleted
(a document re-ingested six times, 36 dead rows, fewer than autovacuum's default threshold of
50), an index scan for 8 live chunks returned none of them, with ``hnsw.iterative_scan`` on or
off (``VACUUM`` restored them). The search falls back to an exact scan when the index returns
fewer rows than it asked for (:func:`knowledge.retrieval._vector_list`).
"""

from __future__ import annotations

import random

import pytest

from knowledge.retrieval import search
from knowledge.tests import builders

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("all_tenants_scope")]


def _axis(i: int) -> list[float]:
    return builders.unit([1.0 if d == i else 0.05 * ((d * 7 + i) % 5) for d in range(384)])


def test_live_chunks_are_found_after_a_document_was_re_ingested_many_times(world):
    kb = builders.knowledge_base(world.tenant, "Runbooks")
    for n in range(8):  # the same document's chunks replaced again and again: dead rows in the index
        old = builders.document(kb, f"draft {n}")
        builders.chunks(old, [f"draft {n} part {i}" for i in range(6)], [_axis(i) for i in range(6)])
        old.delete()
    rng = random.Random(7)
    live = builders.document(kb, "final")
    builders.chunks(live, [f"final part {i}" for i in range(8)], [builders.random_unit(rng) for _ in range(8)])

    hits = search(tenant_id=world.tenant.pk, knowledge_base_ids=[kb.pk], query="qqq", top_k=8,
                  query_vector=builders.random_unit(rng))

    assert sorted(h.text for h in hits) == [f"final part {i}" for i in range(8)]
    assert all(h.vector_rank is not None for h in hits)
