"""Knowledge search latency at 100,000 chunks, and ingestion throughput.

**Search.** Ten throwaway tenants on the development database: one with ``--chunks``
(100,000) chunks in one knowledge base, nine with ``--other-chunks`` (5,000) each, all
384-dimensional. The chunks' vectors are synthetic (random unit vectors: the latency of an
HNSW walk does not depend on what the vectors mean) and their texts are ~400 characters of
words drawn from this repository's README.md and ARCHITECTURE.md (so the full-text index has a
realistic vocabulary); they are inserted with ``COPY`` with the HNSW index dropped and then
built once (``CREATE INDEX``, as a bulk load would). Then ``--queries`` (200) searches through
:func:`knowledge.retrieval.search` as the API calls it: the query embedded by the real
embedded embedder, the vector list (HNSW, iterative scan), the full-text list (GIN), RRF, the
hits read. p50/p95 of the whole call, and of its SQL alone (the two lists with a
precomputed query vector), plus the vector query's plan.

**Ingestion.** The repository's own Markdown (README.md, ARCHITECTURE.md, bench/README.md,
docs/*.md) ingested through the real pipeline (parse, chunk 500/50, embed in batches of 32,
store) on this machine; chunks per second, and how much of the time was embedding.

    .venv/bin/python bench/knowledge_search.py                      # defaults above
    .venv/bin/python bench/knowledge_search.py --chunks 20000 --other-chunks 1000 --queries 50

The figures depend on what else runs on the machine's two cores (the load is printed).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import knowledge_common  # noqa: E402
from _stats import percentile  # noqa: E402
from django.db import connection, transaction  # noqa: E402

from knowledge.models import Chunk, Document, KnowledgeBase  # noqa: E402
from knowledge.retrieval import lexical_sql, search, vector_sql  # noqa: E402
from tenants import rls  # noqa: E402
from tenants.scoping import tenant_scope  # noqa: E402

ROOT = knowledge_common.ROOT
DIMENSIONS = 384
QUESTIONS = [
    "How does a run resume after its worker died?", "What does the sweeper do with stale runs?",
    "How are MCP sessions pooled per event loop?", "Which addresses does web_fetch refuse?",
    "How is tenant scoping enforced in the database?", "What happens when a tool call needs approval?",
    "How are streamed tokens published to the chat app?", "How does the fallback router retry a model?",
    "What is compaction and when does it run?", "How are CLI commands confined in a sandbox?",
    "row-level security policy", "heartbeat", "Redis stream replay after reconnect", "approval policy pattern",
]


def _vocabulary() -> list[str]:
    text = " ".join((ROOT / name).read_text(encoding="utf-8") for name in ("README.md", "ARCHITECTURE.md"))
    return re.findall(r"[A-Za-z][A-Za-z_-]{2,}", text)


def _vector_text(rng: random.Random) -> str:
    values = [rng.gauss(0.0, 1.0) for _ in range(DIMENSIONS)]
    norm = sum(v * v for v in values) ** 0.5
    return "[" + ",".join(f"{v / norm:.5f}" for v in values) + "]"


def _copy_chunks(tenant_id: int, kb_id: int, doc_id: int, count: int, words: list[str], rng: random.Random) -> None:
    """``count`` chunks into ``knowledge_chunk`` with COPY (text format), 10,000 per batch, as the
    owner (PostgreSQL refuses COPY FROM into a table under row-level security; a bulk load is
    an operator's job, like a restore)."""
    raw = connection.connection  # psycopg's connection under Django's (COPY is a psycopg API)
    columns = "(tenant_id, knowledge_base_id, document_id, position, heading, text, char_count, token_count, " \
              "embedding, dimensions)"
    for start in range(0, count, 10_000):
        with raw.cursor() as cursor, cursor.copy(f"COPY knowledge_chunk {columns} FROM STDIN") as copy:
            for position in range(start, min(count, start + 10_000)):
                text = " ".join(rng.choice(words) for _ in range(60))[:400]
                copy.write_row((tenant_id, kb_id, doc_id, position, f"Section {position % 97}", text, len(text),
                                len(text) // 4, _vector_text(rng), DIMENSIONS))


def _load(tenants, url: str, *, chunks: int, other_chunks: int) -> KnowledgeBase:
    words = _vocabulary()
    rng = random.Random(26)
    target = None
    with rls.owner_mode(), connection.cursor() as cursor:
        cursor.execute("DROP INDEX IF EXISTS knowledge_chunk_hnsw_384")
    try:
        for i, tenant in enumerate(tenants):
            provider = knowledge_common.embedding_provider(tenant, url)
            kb = KnowledgeBase.all_tenants.create(tenant=tenant, name="bench", embedding_provider=provider,
                                                  embedding_model="all-minilm-l6-v2", dimensions=DIMENSIONS)
            doc = Document.all_tenants.create(tenant=tenant, knowledge_base=kb, title="synthetic", source_kind="text",
                                              source="synthetic", content=b"", content_sha256="", status="ready")
            count = chunks if i == 0 else other_chunks
            started = time.perf_counter()
            with rls.owner_mode(), transaction.atomic():
                connection.ensure_connection()
                _copy_chunks(tenant.pk, kb.pk, doc.pk, count, words, rng)
            print(f"  tenant {i}: {count:,} chunks copied in {time.perf_counter() - started:.1f} s", flush=True)
            if i == 0:
                target = kb
    finally:
        started = time.perf_counter()
        with rls.owner_mode(), connection.cursor() as cursor:
            cursor.execute("SET maintenance_work_mem = '512MB'")
            cursor.execute(
                "CREATE INDEX IF NOT EXISTS knowledge_chunk_hnsw_384 ON knowledge_chunk USING hnsw "
                "((embedding::vector(384)) vector_cosine_ops) WITH (m = 16, ef_construction = 64) "
                "WHERE dimensions = 384")
            cursor.execute("ANALYZE knowledge_chunk")
        print(f"  HNSW index built in {time.perf_counter() - started:.1f} s", flush=True)
    return target


def _sql_only(kb: KnowledgeBase, queries: int, rng: random.Random) -> tuple[list[float], list[float], str]:
    vector_ms, lexical_ms = [], []
    plan = ""
    with tenant_scope(kb.tenant_id):
        for i in range(queries):
            vector = _vector_text(rng)
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute("SET LOCAL hnsw.iterative_scan = relaxed_order")
                cursor.execute("SET LOCAL hnsw.ef_search = 80")
                params = {"vector": vector, "tenant": kb.tenant_id, "kbs": [kb.pk], "documents": None, "limit": 40}
                if i == 0:
                    cursor.execute("EXPLAIN (ANALYZE, COSTS OFF, FORMAT JSON) " + vector_sql(DIMENSIONS,
                                                                                            with_documents=False), params)
                    row = cursor.fetchone()[0]
                    plan = json.dumps(row if not isinstance(row, str) else json.loads(row))
                t0 = time.perf_counter()
                cursor.execute(vector_sql(DIMENSIONS, with_documents=False), params)
                assert len(cursor.fetchall()) == 40
                vector_ms.append(1000 * (time.perf_counter() - t0))
                t0 = time.perf_counter()
                cursor.execute(lexical_sql(), {"query": QUESTIONS[i % len(QUESTIONS)], "kbs": [kb.pk],
                                               "documents": None, "limit": 40, "strict": False})
                cursor.fetchall()
                lexical_ms.append(1000 * (time.perf_counter() - t0))
    return vector_ms, lexical_ms, plan


def _ingestion(tenant, url: str) -> tuple[int, float, float]:
    """Ingest the repository's Markdown; (chunks, seconds, seconds spent embedding)."""
    import llm.embeddings as embeddings
    from knowledge.services import document_add_text, document_ingest

    provider = knowledge_common.embedding_provider(tenant, url)
    kb = KnowledgeBase.all_tenants.create(tenant=tenant, name="ingest", embedding_provider=provider,
                                          embedding_model="all-minilm-l6-v2", dimensions=DIMENSIONS)
    files = [ROOT / "README.md", ROOT / "ARCHITECTURE.md", ROOT / "bench" / "README.md",
             *sorted((ROOT / "docs").glob("*.md"))]
    embedding_seconds = [0.0]
    real_embed = embeddings.embed_texts

    def timed_embed(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return real_embed(*args, **kwargs)
        finally:
            embedding_seconds[0] += time.perf_counter() - t0

    embeddings.embed_texts = timed_embed  # measured in this script only
    import knowledge.tasks

    knowledge.tasks.document_ingest_enqueue = lambda **kwargs: None  # ingested below, synchronously
    started = time.perf_counter()
    with tenant_scope(tenant.pk):
        for path in files:
            added = document_add_text(knowledge_base=kb, title=str(path.relative_to(ROOT)),
                                      text=path.read_text(encoding="utf-8"))
            assert document_ingest(document_id=added.document.pk, generation=added.document.generation) == "ready"
    elapsed = time.perf_counter() - started
    embeddings.embed_texts = real_embed
    return Chunk.all_tenants.filter(knowledge_base=kb).count(), elapsed, embedding_seconds[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chunks", type=int, default=100_000)
    parser.add_argument("--other-chunks", type=int, default=5_000, help="chunks of each of the nine other tenants")
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--skip-ingestion", action="store_true")
    args = parser.parse_args()
    rng = random.Random(1)
    print(f"load {os.getloadavg()[0]:.2f} (1-minute average, {os.cpu_count()} CPUs)", flush=True)
    with knowledge_common.embedder() as url, knowledge_common.throwaway_tenants(10) as tenants:
        if not args.skip_ingestion:
            chunks, seconds, embedding = _ingestion(tenants[1], url)
            print(f"ingestion    {chunks} chunks of the repository's Markdown in {seconds:.1f} s: "
                  f"{chunks / seconds:.1f} chunks/s ({100 * embedding / seconds:.0f} % of it embedding)", flush=True)
        print("loading …", flush=True)
        kb = _load(tenants, url, chunks=args.chunks, other_chunks=args.other_chunks)
        total = Chunk.all_tenants.filter(dimensions=DIMENSIONS).count()
        print(f"chunks       {args.chunks:,} in the searched tenant, {total:,} in the table", flush=True)
        vector_ms, lexical_ms, plan = _sql_only(kb, args.queries, rng)
        uses_hnsw = "knowledge_chunk_hnsw_384" in plan
        search(tenant_id=kb.tenant_id, knowledge_base_ids=[kb.pk], query="warm-up")
        whole_ms = []
        for i in range(args.queries):
            t0 = time.perf_counter()
            hits = search(tenant_id=kb.tenant_id, knowledge_base_ids=[kb.pk], query=QUESTIONS[i % len(QUESTIONS)])
            whole_ms.append(1000 * (time.perf_counter() - t0))
            assert len(hits) == 5
        print(f"vector SQL   p50 {statistics.median(vector_ms):.1f} ms, p95 {percentile(vector_ms, 0.95):.1f} ms "
              f"(HNSW index in the plan: {uses_hnsw})")
        print(f"lexical SQL  p50 {statistics.median(lexical_ms):.1f} ms, p95 {percentile(lexical_ms, 0.95):.1f} ms")
        print(f"search()     p50 {statistics.median(whole_ms):.1f} ms, p95 {percentile(whole_ms, 0.95):.1f} ms "
              f"(query embedding, both lists, RRF, hits; {args.queries} queries)")
        print("cleaning up …", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
