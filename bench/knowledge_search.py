"""Knowledge search latency at 100,000 chunks, and ingestion throughput.

**Search.** Ten throwaway tenants on the development database: one with ``--chunks``
(100,000) chunks in one knowledge base, nine with ``--other-chunks`` (5,000) each, all
384-dimensional. The chunks' vectors are synthetic (random unit vectors: the latency of an
HNSW walk does not depend on what the vectors mean) and their texts are ~400 characters of
words drawn from this repository's README.md and ARCHITECTURE.md (so the full-text index has a
realistic vocabulary); they are inserted with ``COPY`` with the HNSW index dropped and then
built once (``CREATE INDEX``, as a bulk load would). Then ``--queries`` (200) searches of each
kind, the 14 questions below in turn, p50/p95 of each:

- **retrieval** (the database's part): :func:`knowledge.retrieval.search` given the query's
  vector (``query_vector``, embedded once beforehand by the real embedder): vector list only
  (HNSW, iterative scan), lexical list only (GIN, two bounded steps), and both fused (RRF) —
  each including the knowledge-base lookup, the transaction and reading the hits;
- **end to end**: :func:`knowledge.retrieval.search` as the API calls it, the query embedded
  by the embedded embedder (all-MiniLM-L6-v2 on llama.cpp, a kept connection);
- the query embedding alone (``llm.embeddings.embed_texts`` of one question);
- the two lists' SQL statements alone, and the vector query's plan (is the HNSW index used).

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
from knowledge.retrieval import LEXICAL_MAX_RANKED, lexical_sql, search, vector_sql  # noqa: E402
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


def _copy_chunks(tenant_id: int, kb_id: int, doc_id: int, count: int, words: list[str], rng: random.Random,
                 fingerprint: str) -> None:
    """``count`` chunks into ``knowledge_chunk`` with COPY (text format), 10,000 per batch, as the
    owner (PostgreSQL refuses COPY FROM into a table under row-level security; a bulk load is
    an operator's job, like a restore)."""
    raw = connection.connection  # psycopg's connection under Django's (COPY is a psycopg API)
    columns = "(tenant_id, knowledge_base_id, document_id, position, heading, text, char_count, token_count, " \
              "embedding, dimensions, embedding_fingerprint)"
    for start in range(0, count, 10_000):
        with raw.cursor() as cursor, cursor.copy(f"COPY knowledge_chunk {columns} FROM STDIN") as copy:
            for position in range(start, min(count, start + 10_000)):
                text = " ".join(rng.choice(words) for _ in range(60))[:400]
                copy.write_row((tenant_id, kb_id, doc_id, position, f"Section {position % 97}", text, len(text),
                                len(text) // 4, _vector_text(rng), DIMENSIONS, fingerprint))


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
                _copy_chunks(tenant.pk, kb.pk, doc.pk, count, words, rng, kb.embedding_fingerprint)
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


def _sql_only(kb: KnowledgeBase, queries: int, vectors: list[str]) -> tuple[list[float], list[float], str]:
    vector_ms, lexical_ms = [], []
    plan = ""
    with tenant_scope(kb.tenant_id):
        for i in range(queries):
            vector = vectors[i % len(vectors)]
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute("SET LOCAL hnsw.iterative_scan = relaxed_order")
                cursor.execute("SET LOCAL hnsw.ef_search = 80")
                params = {"vector": vector, "tenant": kb.tenant_id, "kbs": [kb.pk], "documents": None, "limit": 40,
                          "fingerprint": kb.embedding_fingerprint}
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
                                               "documents": None, "limit": 40, "strict": False,
                                               "max_ranked": LEXICAL_MAX_RANKED})
                cursor.fetchall()
                lexical_ms.append(1000 * (time.perf_counter() - t0))
    return vector_ms, lexical_ms, plan


def _literal(vector: list[float]) -> str:
    return "[" + ",".join(f"{x:.7g}" for x in vector) + "]"


def _timed(kb: KnowledgeBase, queries: int, **options) -> list[float]:
    """Milliseconds of ``queries`` calls of search() (the questions in turn; with
    ``query_vectors`` the matching precomputed vector is passed), after one warm-up call."""
    vectors = options.pop("query_vectors", None)
    timings = []
    for i in range(queries + 1):
        extra = {"query_vector": vectors[i % len(vectors)]} if vectors else {}
        t0 = time.perf_counter()
        hits = search(tenant_id=kb.tenant_id, knowledge_base_ids=[kb.pk], query=QUESTIONS[i % len(QUESTIONS)],
                      **options, **extra)
        if i:
            timings.append(1000 * (time.perf_counter() - t0))
        assert len(hits) == 5, (options, len(hits))
    return timings


def _embedding_ms(kb: KnowledgeBase, queries: int) -> list[float]:
    """Milliseconds of embedding one question (llm.embeddings.embed_texts, as search() calls it)."""
    from llm.embeddings import embed_texts

    timings = []
    for i in range(queries):
        t0 = time.perf_counter()
        embed_texts(kb.embedding_provider, kb.embedding_model, [QUESTIONS[i % len(QUESTIONS)]])
        timings.append(1000 * (time.perf_counter() - t0))
    return timings


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
    parser.add_argument("--embedder-threads", type=int, default=None,
                        help="EMBEDDINGS_N_THREADS of the embedder (default: the server's, every usable CPU)")
    args = parser.parse_args()
    print(f"load {os.getloadavg()[0]:.2f} (1-minute average, {os.cpu_count()} CPUs)", flush=True)
    with knowledge_common.embedder(args.embedder_threads) as url, knowledge_common.throwaway_tenants(10) as tenants:
        if not args.skip_ingestion:
            chunks, seconds, embedding = _ingestion(tenants[1], url)
            print(f"ingestion    {chunks} chunks of the repository's Markdown in {seconds:.1f} s: "
                  f"{chunks / seconds:.1f} chunks/s ({100 * embedding / seconds:.0f} % of it embedding)", flush=True)
        print("loading …", flush=True)
        kb = _load(tenants, url, chunks=args.chunks, other_chunks=args.other_chunks)
        total = Chunk.all_tenants.filter(dimensions=DIMENSIONS).count()
        print(f"chunks       {args.chunks:,} in the searched tenant, {total:,} in the table", flush=True)
        from llm.embeddings import embed_texts

        query_vectors = embed_texts(kb.embedding_provider, kb.embedding_model, QUESTIONS)
        rows = []
        load_before = os.getloadavg()
        for name, options in (("retrieval: vector list", {"lists": ("vector",)}),
                              ("retrieval: lexical list", {"lists": ("lexical",)}),
                              ("retrieval: fused (RRF)", {})):
            rows.append((name, _timed(kb, args.queries, query_vectors=query_vectors, **options)))
        rows.append(("end to end: search() with embedding", _timed(kb, args.queries)))
        rows.append(("of which: the query embedding alone", _embedding_ms(kb, args.queries)))
        vector_ms, lexical_ms, plan = _sql_only(kb, args.queries, [_literal(v) for v in query_vectors])
        rows.append(("SQL alone: vector statement", vector_ms))
        rows.append(("SQL alone: lexical function", lexical_ms))
        load_after = os.getloadavg()
        uses_hnsw = "knowledge_chunk_hnsw_384" in plan
        print(f"\nload average {load_before[0]:.2f} / {load_before[1]:.2f} / {load_before[2]:.2f} before, "
              f"{load_after[0]:.2f} / {load_after[1]:.2f} / {load_after[2]:.2f} after (1/5/15 min; {os.cpu_count()} CPUs); "
              f"{args.queries} queries each; HNSW index in the vector plan: {uses_hnsw}; "
              f"lexical max_ranked {LEXICAL_MAX_RANKED}; embedder threads {args.embedder_threads or 'all CPUs'}\n")
        print("| what | p50 ms | p95 ms |\n|---|---:|---:|")
        for name, ms in rows:
            print(f"| {name} | {statistics.median(ms):.1f} | {percentile(ms, 0.95):.1f} |")
        print("cleaning up …", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
