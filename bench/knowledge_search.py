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
  by the embedded embedder (all-MiniLM-L6-v2 on llama.cpp, a kept connection) while the
  lexical list is read; and, for comparison under the same load, the sequential order (the
  query embedded, then ``search()`` given the vector: what ``search()`` did before the overlap);
- the query embedding alone (``llm.embeddings.embed_texts`` of one question), and the model's
  compute alone (the same GGUF loaded in this process with llama-cpp-python, the embedder's
  threads: the difference is HTTP, the server's JSON and the client);
- the two lists' SQL statements alone, and the vector query's plan (is the HNSW index used);
- the vector list's recall against an exact scan (the same query without the index) for
  several ``hnsw.ef_search`` values, with the statement's latency (``--ef-search``), for the
  questions' vectors and for vectors planted near a stored chunk. The chunks' vectors are
  random: among random vectors every neighbour is about as far as any other (cosine ~0), the
  HNSW graph's hardest case, so recall@40 here is a lower bound, not what real embeddings get.

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


def _paired_end_to_end(kb: KnowledgeBase, queries: int) -> tuple[list[float], list[float]]:
    """Milliseconds of ``queries`` end-to-end searches each way, paired (the same question both
    ways, one right after the other, which first alternating) so that both see the same load:
    (search() as the API calls it: the embedding overlapped with the lexical list; the
    sequential order: embed the question with embed_texts, then search() given the vector,
    which is what search() did before the overlap). One warm-up pair first."""
    from llm.embeddings import embed_texts

    def overlapped(question: str) -> float:
        t0 = time.perf_counter()
        hits = search(tenant_id=kb.tenant_id, knowledge_base_ids=[kb.pk], query=question)
        assert len(hits) == 5
        return 1000 * (time.perf_counter() - t0)

    def sequential(question: str) -> float:
        t0 = time.perf_counter()
        [vector] = embed_texts(kb.embedding_provider, kb.embedding_model, [question])
        hits = search(tenant_id=kb.tenant_id, knowledge_base_ids=[kb.pk], query=question, query_vector=vector)
        assert len(hits) == 5
        return 1000 * (time.perf_counter() - t0)

    overlapped_ms, sequential_ms = [], []
    for i in range(queries + 1):
        question = QUESTIONS[i % len(QUESTIONS)]
        if i % 2:
            first, second = overlapped(question), sequential(question)
            pair = (first, second)
        else:
            second, first = sequential(question), overlapped(question)
            pair = (first, second)
        if i:
            overlapped_ms.append(pair[0])
            sequential_ms.append(pair[1])
    return overlapped_ms, sequential_ms


def _ef_search_recall(kb: KnowledgeBase, vectors: list[str], ef_values: list[int], *, limit: int = 40,
                      ) -> list[tuple[int, float, float, float, float]]:
    """``[(ef_search, recall@limit, recall@5, p50 ms, p95 ms)]`` of the vector statement
    against the exact ``limit`` nearest (the same rows ordered by ``embedding <=> v`` without the
    index's cast expression: a sequential scan), over ``vectors``."""
    params = {"tenant": kb.tenant_id, "kbs": [kb.pk], "documents": None, "limit": limit}
    sql = vector_sql(DIMENSIONS, with_documents=False)
    if "%(fingerprint)s" in sql:
        params["fingerprint"] = kb.embedding_fingerprint
    exact_sql = sql.replace(f"embedding::vector({DIMENSIONS})", "embedding")
    out = []
    with tenant_scope(kb.tenant_id):
        exact = []
        for vector in vectors:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute("SET LOCAL enable_indexscan = off")
                cursor.execute(exact_sql, {**params, "vector": vector})
                exact.append([row[0] for row in sorted(cursor.fetchall(), key=lambda r: (r[1], r[0]))])
        for ef in ef_values:
            found40, found5, timings = 0, 0, []
            for vector, truth in zip(vectors, exact, strict=True):
                with transaction.atomic(), connection.cursor() as cursor:
                    cursor.execute("SET LOCAL hnsw.iterative_scan = relaxed_order")
                    cursor.execute(f"SET LOCAL hnsw.ef_search = {int(ef)}")
                    t0 = time.perf_counter()
                    cursor.execute(sql, {**params, "vector": vector})
                    got = [row[0] for row in sorted(cursor.fetchall(), key=lambda r: (r[1], r[0]))]
                    timings.append(1000 * (time.perf_counter() - t0))
                found40 += len(set(got) & set(truth))
                found5 += len(set(got[:5]) & set(truth[:5]))
            out.append((ef, found40 / (limit * len(vectors)), found5 / (5 * len(vectors)),
                        statistics.median(timings), percentile(timings, 0.95)))
    return out


def _compute_model(threads: int):
    """The embedded embedding model loaded in this process as the server loads it (the same
    GGUF, 512-token context and batch, ``threads`` threads), for timing its compute without HTTP."""
    import llama_cpp
    import setup_embedder

    return llama_cpp.Llama(model_path=str(setup_embedder.ensure_embedder()), embedding=True, n_ctx=512,
                           n_batch=512, n_threads=threads, n_threads_batch=threads, verbose=False)


def _compute_ms(model, queries: int) -> list[float]:
    """Milliseconds of the model's own compute for one question (tokenising + encoding), no HTTP."""
    model.embed(QUESTIONS[0])
    timings = []
    for i in range(queries):
        t0 = time.perf_counter()
        model.embed(QUESTIONS[i % len(QUESTIONS)])
        timings.append(1000 * (time.perf_counter() - t0))
    return timings


def _near_chunks(kb: KnowledgeBase, rng: random.Random, count: int) -> list[str]:
    """``count`` query vectors each near one stored chunk of ``kb`` (its vector plus noise, cosine
    ~0.8 to it): a query with a clear nearest neighbour, as a question with an answering
    passage has, unlike a random vector among random vectors."""
    ids = list(Chunk.all_tenants.filter(knowledge_base=kb).values_list("pk", flat=True)[:5000])
    out = []
    for pk in rng.sample(ids, count):
        base = [float(x) for x in Chunk.all_tenants.values_list("embedding", flat=True).get(pk=pk)]
        noisy = [x + rng.gauss(0.0, 0.75 / DIMENSIONS ** 0.5) for x in base]
        norm = sum(x * x for x in noisy) ** 0.5
        out.append(_literal([x / norm for x in noisy]))
    return out


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
    from knowledge.ingestion import document_ingest
    from knowledge.services import document_add_text

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
    parser.add_argument("--rounds", type=int, default=1, help="measure this many times on the one load")
    parser.add_argument("--ef-search", default="40,80,120",
                        help="hnsw.ef_search values whose vector-list recall is measured ('' for none)")
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
        compute_model = _compute_model(args.embedder_threads or os.cpu_count() or 1)
        for round_number in range(1, args.rounds + 1):
            rows = []
            load_before = os.getloadavg()
            for name, options in (("retrieval: vector list", {"lists": ("vector",)}),
                                  ("retrieval: lexical list", {"lists": ("lexical",)}),
                                  ("retrieval: fused (RRF)", {})):
                rows.append((name, _timed(kb, args.queries, query_vectors=query_vectors, **options)))
            overlapped_ms, sequential_ms = _paired_end_to_end(kb, args.queries)
            rows.append(("end to end: search() with embedding (overlapped with the lexical list)", overlapped_ms))
            rows.append(("end to end, sequential: embed, then search() with the vector", sequential_ms))
            rows.append(("of which: the query embedding alone", _embedding_ms(kb, args.queries)))
            rows.append(("of which: the model's compute (llama.cpp in this process, no HTTP)",
                         _compute_ms(compute_model, args.queries)))
            vector_ms, lexical_ms, plan = _sql_only(kb, args.queries, [_literal(v) for v in query_vectors])
            rows.append(("SQL alone: vector statement", vector_ms))
            rows.append(("SQL alone: lexical function", lexical_ms))
            load_after = os.getloadavg()
            uses_hnsw = "knowledge_chunk_hnsw_384" in plan
            print(f"\nround {round_number} of {args.rounds}: load average {load_before[0]:.2f} / {load_before[1]:.2f} / {load_before[2]:.2f} before, "
                  f"{load_after[0]:.2f} / {load_after[1]:.2f} / {load_after[2]:.2f} after (1/5/15 min; {os.cpu_count()} CPUs); "
                  f"{args.queries} queries each; HNSW index in the vector plan: {uses_hnsw}; "
                  f"lexical max_ranked {LEXICAL_MAX_RANKED}; embedder threads {args.embedder_threads or 'all CPUs'}\n")
            print("| what | p50 ms | p95 ms |\n|---|---:|---:|")
            for name, ms in rows:
                print(f"| {name} | {statistics.median(ms):.1f} | {percentile(ms, 0.95):.1f} |")
        ef_values = [int(v) for v in args.ef_search.split(",") if v.strip()]
        if ef_values:
            rng = random.Random(5)
            probes = [_literal(v) for v in query_vectors] + _near_chunks(kb, rng, 36)
            print("\nvector list against an exact scan (14 question vectors + 36 vectors near a stored chunk; "
                  "limit 40; iterative scan):\n")
            print("| hnsw.ef_search | recall@40 | recall@5 | p50 ms | p95 ms |\n|---:|---:|---:|---:|---:|")
            for ef, recall40, recall5, p50, p95 in _ef_search_recall(kb, probes, ef_values):
                print(f"| {ef} | {recall40:.3f} | {recall5:.3f} | {p50:.1f} | {p95:.1f} |")
        print("cleaning up …", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
