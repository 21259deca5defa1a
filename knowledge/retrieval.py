"""Hybrid retrieval over knowledge bases: vector and full-text candidates fused with RRF.

:func:`search` is the one entry point (the API's search endpoint, the console's "Test search",
the ``knowledge`` capability kind's ``knowledge_search`` tool and its run-start retrieval):

1. **Which chunks may be searched**: the given knowledge bases that are the tenant's and, for
   a user's own knowledge base, only its owner's (``user_id``); optionally only some documents
   and/or documents carrying any of some tags. Unknown or foreign ids are left out silently.
2. **Vector list**: the query embedded with each knowledge base's embedding model, the
   nearest chunks by cosine distance through the HNSW index of that dimension (pgvector;
   ``hnsw.iterative_scan = relaxed_order`` so filters that remove most candidates still give
   ``candidates`` rows, re-sorted here by distance).
3. **Lexical list**: PostgreSQL full text through the GIN index, in two bounded steps
   (migration 0002): chunks holding *all* the query's terms
   (``websearch_to_tsquery('english', query)``) first; only if they are fewer than
   ``candidates`` and the query uses no operators (quotes, ``-word``, ``or``), chunks holding
   *any* of them after those (a question's words rarely all occur in one chunk), ranked by
   the summed IDF of the terms they hold, then ``ts_rank``. Each step ranks at most
   :data:`LEXICAL_MAX_RANKED` matching chunks, the first the index scan meets: bounded
   latency, at the price that past that many matches the ranked ones are not necessarily the
   best (the migration's docstring says what that trades).
4. **Rewritten query** (optional, ``rewrite``): a callable returning another phrasing of the
   query (e.g. the run's chat model asked for keywords or a hypothetical answer); its vector
   list is a third list.
5. **Fusion**: Reciprocal Rank Fusion, ``score(d) = Σ_lists 1 / (60 + rank_list(d))`` with
   ranks from 1 (Cormack, Clarke & Büttcher, "Reciprocal Rank Fusion outperforms Condorcet
   and individual Rank Learning Methods", SIGIR 2009; k = 60 as there).
6. **Rerank** (optional, ``rerank``): a callable scoring ``(query, passages)``; the fused top
   ``rerank_candidates`` are re-ordered by its scores (:mod:`knowledge.rerank` has an
   LLM-as-reranker over a model route).

Overlap: the embedding requests are sent first (:func:`llm.embeddings.embed_texts_start`)
and answered while the lexical list's statement runs (it needs no vector), then the vector
lists; no transaction is open while the embedding is awaited, and none is opened for the
vector lists (the HNSW settings are the connection's, :func:`_hnsw_settings`). A search
costs about max(embedding, lexical list) + vector list rather than their sum
(bench/knowledge_search.py); the results are those of the sequential order (the lists enter
the fusion in the same order).

Row-level security: the vector query runs under the tenant's policy like every query. The
lexical query goes through ``knowledge_lexical_candidates`` (migrations 0001, 0002), a ``SECURITY
DEFINER`` SQL function that applies the same tenant predicate (``tenants.rls.
policy_expression``) itself: under a policy, PostgreSQL only uses an index for a *leakproof*
operator, and the full-text ``@@`` (``ts_match_vq``) is not, so the GIN index would never be
used by the application's role. The function reads only ``knowledge_chunk`` and filters it by
the connection's ``app.tenant_ids`` / ``app.all_tenants`` exactly as the policy does.
"""

from __future__ import annotations

import math
import re
import weakref
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from django.db import connection

from knowledge.models import INDEXED_DIMENSIONS, TEXT_SEARCH_CONFIG, Document, KnowledgeBase
from knowledge.selectors import knowledge_base_visible
from tenants.scoping import tenant_scope

RRF_K = 60
"""The constant of Reciprocal Rank Fusion (Cormack et al. 2009)."""
MAX_QUERY_CHARS = 2_000
MAX_TOP_K = 50
DEFAULT_CANDIDATES = 40
"""Candidates per list: enough that a chunk ranked low by one list and high by the other still
enters the fusion, few enough that each list costs a few milliseconds."""
LEXICAL_MAX_RANKED = 1_000
"""Matching chunks ``ts_rank`` scores per step of the lexical list, at most (migration 0002).
At 100,000 chunks an OR-ed question matches tens of thousands; ranking them all took ~200 ms
(bench/knowledge_search.py), ranking 1,000 a few ms. Knowledge bases whose steps match fewer
chunks than this get the exact ranking."""
HNSW_EF_SEARCH = 80
"""``hnsw.ef_search`` for the vector list (pgvector's default is 40; twice that keeps recall
near the exact scan for ``candidates`` ≤ 40)."""

Rewriter = Callable[[str], "str | None"]
"""``rewrite(query) -> another phrasing`` (None or '' for none). Sync; may call a model."""
Reranker = Callable[[str, Sequence[str]], Sequence[float]]
"""``rerank(query, passages) -> one score per passage`` (higher is more relevant). Sync."""


class SearchError(ValueError):
    """The search's arguments are invalid (a message for the caller), or embedding the query
    failed (``code`` ``embedding_failed``)."""

    def __init__(self, message: str, *, code: str = "invalid_arguments") -> None:
        super().__init__(message)
        self.message = message
        self.code = code


@dataclass(frozen=True, slots=True)
class Hit:
    """One retrieved chunk."""

    knowledge_base_id: int
    document_id: int
    document_title: str
    chunk_id: int
    position: int
    """The chunk's 0-based order in its document."""
    heading: str
    """The heading path above the chunk (``A > B``), '' if none."""
    text: str
    score: float
    """What the hits are ordered by: the rerank score when reranked, else the RRF score."""
    rrf_score: float = 0.0
    """Σ 1/(60 + rank) over the lists that found the chunk."""
    vector_rank: int | None = None
    """1-based rank in the vector list (None: not in it)."""
    lexical_rank: int | None = None
    """1-based rank in the full-text list (None: not in it)."""
    rewrite_rank: int | None = None
    """1-based rank in the rewritten query's vector list (None: not in it or no rewrite)."""
    rerank_score: float | None = None
    vector_distance: float | None = None
    """Cosine distance (0 … 2) of the chunk to the query, when in the vector list."""


@dataclass(slots=True)
class _Candidate:
    ranks: dict[str, int] = field(default_factory=dict)
    distance: float | None = None


def rrf_fuse(lists: dict[str, Sequence[int]], *, k: int = RRF_K) -> list[tuple[int, float, dict[str, int]]]:
    """Reciprocal Rank Fusion of ranked id lists: ``[(id, Σ 1/(k + rank), {list: rank})]``,
    best first (ties: the id found first in the lists' order, then the smaller id)."""
    scores: dict[int, float] = defaultdict(float)
    ranks: dict[int, dict[str, int]] = defaultdict(dict)
    for name, ids in lists.items():
        for rank, item in enumerate(ids, start=1):
            if name in ranks[item]:
                continue
            scores[item] += 1.0 / (k + rank)
            ranks[item][name] = rank
    return sorted(((i, s, ranks[i]) for i, s in scores.items()), key=lambda t: (-t[1], min(t[2].values()), t[0]))


def _vector_literal(vector: Sequence[float]) -> str:
    return "[" + ",".join(f"{x:.7g}" for x in vector) + "]"


def _lexical_strict(query: str) -> bool:
    """True when the query uses websearch syntax (quotes, ``-word``, ``or``): keep its AND."""
    return bool(re.search(r'"|(^|\s)-\w|\bor\b', query, re.IGNORECASE))


def vector_sql(dimensions: int, *, with_documents: bool, exact: bool = False) -> str:
    """The vector list's SQL for ``dimensions``: the partial HNSW index's expression and
    predicate (``embedding::vector(N)``, ``dimensions = N``) as literals, so the planner can
    match the index even for a generic plan. Parameters: query vector, tenant id, knowledge base
    ids, the embedding fingerprint (only chunks embedded by the knowledge bases' current model:
    during a re-embedding the others are left out, never compared), [document ids], limit.
    ``exact``: order by the column itself, which no index matches: an exact scan of the
    filtered rows (the fallback of :func:`_vector_list`)."""
    dims = int(dimensions)
    expr = f"embedding::vector({dims})" if dims in INDEXED_DIMENSIONS and not exact else "embedding"
    cast = f"::vector({dims})"
    documents = " AND document_id = ANY(%(documents)s::bigint[])" if with_documents else ""
    return (f"SELECT id, {expr} <=> %(vector)s{cast} AS distance FROM knowledge_chunk "
            f"WHERE dimensions = {dims} AND tenant_id = %(tenant)s AND knowledge_base_id = ANY(%(kbs)s::bigint[])"
            f" AND embedding_fingerprint = %(fingerprint)s{documents}"
            f" ORDER BY {expr} <=> %(vector)s{cast} LIMIT %(limit)s")


def lexical_sql() -> str:
    """The lexical list's SQL (through ``knowledge_lexical_candidates``; see the module
    docstring), best first as the function returns them (chunks with all the terms, then
    chunks with some). Parameters: query, knowledge base ids, document ids or NULL, limit,
    strict (no OR step), max_ranked (:data:`LEXICAL_MAX_RANKED`)."""
    return ("SELECT id, rank FROM knowledge_lexical_candidates(%(query)s, %(kbs)s::bigint[], "
            "%(documents)s::bigint[], %(limit)s, %(strict)s, %(max_ranked)s) WITH ORDINALITY AS f(id, rank, n) "
            "ORDER BY n")


def _validate(query: str, top_k: int, knowledge_base_ids: Sequence[int]) -> str:
    if not isinstance(query, str) or not query.strip():
        raise SearchError("The query is empty.")
    if len(query) > MAX_QUERY_CHARS:
        raise SearchError(f"The query is {len(query):,} characters; at most {MAX_QUERY_CHARS:,}.")
    if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= MAX_TOP_K:
        raise SearchError(f"top_k must be an integer from 1 to {MAX_TOP_K}.")
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in knowledge_base_ids):
        raise SearchError("knowledge_base_ids must be integers.")
    return query.strip()


class _PendingVectors:
    """One embedding group's vectors, maybe still being embedded: ``result()`` waits for them
    and returns ``(the query's vector or None, the rewritten query's or None)``."""

    def __init__(self, kb: KnowledgeBase, texts: list[str], *, query_vec: list[float] | None, with_query: bool,
                 with_rewrite: bool) -> None:
        from llm.embeddings import EmbeddingError, embed_texts_start

        self._kb, self._texts, self._query_vec = kb, texts, query_vec
        self._with_query, self._with_rewrite = with_query, with_rewrite
        self._future = None
        if texts:
            try:
                self._future = embed_texts_start(kb.embedding_provider, kb.embedding_model, texts)
            except EmbeddingError as exc:
                raise _embedding_failed(kb, exc) from exc

    def cancel(self) -> None:
        if self._future is not None:
            self._future.cancel()

    def result(self) -> tuple[list[float] | None, list[float] | None]:
        from llm.embeddings import EmbeddingError

        embedded: list[list[float]] = []
        if self._future is not None:
            try:
                vectors = self._future.result()
            except EmbeddingError as exc:
                raise _embedding_failed(self._kb, exc) from exc
            if len(vectors) != len(self._texts) or any(len(v) != self._kb.dimensions for v in vectors):
                raise SearchError(f"The embedding model returned vectors of the wrong size (expected "
                                  f"{self._kb.dimensions}).", code="embedding_failed")
            embedded = [list(v) for v in vectors]
        query_vec = self._query_vec
        if self._with_query and query_vec is None:
            query_vec = embedded.pop(0)
        return query_vec, (embedded.pop(0) if self._with_rewrite else None)


def _embedding_failed(kb: KnowledgeBase, exc: Exception) -> SearchError:
    return SearchError(f"Embedding the query failed ({kb.embedding_model}): {exc}", code="embedding_failed")


def _start_group_vectors(kb: KnowledgeBase, query: str, rewritten: str, *, query_vector: Sequence[float] | None,
                         with_query: bool) -> _PendingVectors:
    """Start embedding what ``kb``'s embedding model must embed (the query if ``with_query``
    and no ``query_vector`` is given, the rewritten query if any; one request for both) and
    return at once; the request runs on the embeddings loop (:func:`llm.embeddings.
    embed_texts_start`) while the caller queries the database."""
    query_vec = None
    if with_query and query_vector is not None:
        if (isinstance(query_vector, (str, bytes)) or len(query_vector) != kb.dimensions
                or not all(isinstance(x, (int, float)) and math.isfinite(x) for x in query_vector)):
            raise SearchError(f"query_vector must be {kb.dimensions} finite numbers (the knowledge base's model).")
        query_vec = [float(x) for x in query_vector]
    texts = ([query] if with_query and query_vector is None else []) + ([rewritten] if rewritten else [])
    return _PendingVectors(kb, texts, query_vec=query_vec, with_query=with_query, with_rewrite=bool(rewritten))


def _vector_list(cursor, vector: list[float], *, tenant_id: int, group: list[KnowledgeBase],
                 document_ids: list[int] | None, limit: int) -> list[tuple[int, float]]:
    """The vector list: ``[(chunk id, cosine distance)]``, nearest first, at most ``limit``.

    The HNSW index answers first. When it returns fewer than ``limit`` rows, an exact scan of
    the filtered rows answers instead: either the knowledge bases hold fewer chunks than that
    (the scan is small) or the index missed live rows. pgvector 0.8.6's HNSW graph keeps
    deleted and rolled-back rows until a VACUUM, and a few dozen of them (a document
    re-ingested a few times) left 8 live chunks unreachable in the index, with iterative scans
    on or off (knowledge/tests/test_retrieval_dead_rows.py)."""
    kb = group[0]  # one embedding model per group: the same dimensions and fingerprint
    params = {"vector": _vector_literal(vector), "tenant": tenant_id, "kbs": [k.pk for k in group],
              "fingerprint": kb.embedding_fingerprint, "documents": document_ids, "limit": limit}
    cursor.execute(vector_sql(kb.dimensions, with_documents=document_ids is not None), params)
    rows = [(int(i), float(d)) for i, d in cursor.fetchall()]
    if len(rows) < limit and int(kb.dimensions) in INDEXED_DIMENSIONS:
        cursor.execute(vector_sql(kb.dimensions, with_documents=document_ids is not None, exact=True), params)
        rows = [(int(i), float(d)) for i, d in cursor.fetchall()]
    rows.sort(key=lambda r: (r[1], r[0]))  # relaxed_order: nearly sorted; make it exact
    return rows


_hnsw_session: weakref.WeakKeyDictionary[object, int] = weakref.WeakKeyDictionary()
"""Per database connection (psycopg's), the ``hnsw.ef_search`` its session was given (with
``hnsw.iterative_scan = relaxed_order``) by :func:`_hnsw_settings`."""


def _hnsw_settings(cursor, *, ef_search: int) -> None:
    """``hnsw.iterative_scan = relaxed_order`` and ``hnsw.ef_search`` for the vector lists.

    Outside a transaction they are set for the connection's session, once per connection and
    value (remembered in :data:`_hnsw_session`): a search then costs no transaction (BEGIN,
    COMMIT) and no extra round trip for them. Inside a caller's transaction they are set for
    that transaction only (``set_config(…, true)``, as ``SET LOCAL``), every time, since a
    rollback would undo a session value set there. Only HNSW scans read them: the knowledge
    vector lists, whose every caller wants these values (the memory search is exact)."""
    if connection.in_atomic_block:
        cursor.execute("SELECT set_config('hnsw.iterative_scan', 'relaxed_order', true), "
                       "set_config('hnsw.ef_search', %s, true)", [str(ef_search)])
        return
    raw = connection.connection
    if _hnsw_session.get(raw) == ef_search:
        return
    cursor.execute("SELECT set_config('hnsw.iterative_scan', 'relaxed_order', false), "
                   "set_config('hnsw.ef_search', %s, false)", [str(ef_search)])
    _hnsw_session[raw] = ef_search


def _lexical_list(query: str, kbs: list[KnowledgeBase], doc_filter: list[int] | None, candidates: int) -> list[int]:
    """The lexical list's chunk ids, best first (one statement, no transaction of its own)."""
    with connection.cursor() as cursor:
        cursor.execute(lexical_sql(), {"query": query, "kbs": [kb.pk for kb in kbs], "documents": doc_filter,
                                       "limit": candidates, "strict": _lexical_strict(query),
                                       "max_ranked": LEXICAL_MAX_RANKED})
        return [int(i) for i, _ in cursor.fetchall()]


def search(*, tenant_id: int, knowledge_base_ids: Sequence[int], query: str, user_id: int | None = None,
           top_k: int = 5, document_ids: Sequence[int] | None = None, tags: Sequence[str] | None = None,
           rewrite: Rewriter | None = None, rerank: Reranker | None = None,
           candidates: int = DEFAULT_CANDIDATES, rerank_candidates: int = 20,
           lists: Sequence[str] = ("vector", "lexical"), query_vector: Sequence[float] | None = None) -> list[Hit]:
    """Search knowledge bases (see the module docstring for the method).

    Args:
        tenant_id: The tenant; the search runs in its scope (entered here).
        knowledge_base_ids: Knowledge bases to search; the tenant's only, a user's own only
            for ``user_id``; others are ignored.
        query: 1–2,000 characters.
        user_id: The searching user (None: tenant-wide knowledge bases only).
        top_k: Hits to return, 1–50.
        document_ids: Only these documents (None: all).
        tags: Only documents carrying at least one of these tags (None or empty: all).
        rewrite: Optional query rewriter; its vector list joins the fusion.
        rerank: Optional reranker applied to the fused top ``rerank_candidates``.
        candidates: Per-list candidates (≥ top_k; default 40).
        rerank_candidates: How many fused hits the reranker sees (≥ top_k).
        lists: Which base lists to use, ``vector`` and/or ``lexical`` (the benchmark compares
            them alone; callers keep the default).
        query_vector: The query's embedding when the caller already has it (the knowledge
            bases' model, ``dimensions`` long; they must all share one embedding model): no
            embedding request for the query. None: embedded here.

    Returns:
        Up to ``top_k`` hits, best first. [] when no knowledge base is searchable.

    Raises:
        SearchError: invalid arguments (``invalid_arguments``) or the query could not be
            embedded (``embedding_failed``). A failing rewriter or reranker raises what it raises.

    Blocking (ORM + SQL + one embedding request per embedding model, sent before the lexical
    list's statement and awaited after it, so the two overlap); from async code use
    :func:`asearch`.
    """
    query = _validate(query, top_k, knowledge_base_ids)
    candidates = max(int(candidates), top_k)
    with tenant_scope(tenant_id):
        kbs = list(KnowledgeBase.objects.filter(knowledge_base_visible(user_id=user_id), pk__in=list(knowledge_base_ids))
                   .select_related("embedding_provider"))
        if not kbs:
            return []
        doc_filter = _document_filter([kb.pk for kb in kbs], document_ids, tags)
        if doc_filter is not None and not doc_filter:
            return []
        rewritten = (rewrite(query) or "").strip()[:MAX_QUERY_CHARS] if rewrite is not None else ""
        # One vector list per embedding model (distances of different models do not compare).
        groups = _embedding_groups(kbs)
        if query_vector is not None and len(groups) > 1:
            raise SearchError(f"query_vector was given but the knowledge bases use {len(groups)} embedding models.")
        # The query is embedded (on the embeddings loop) while the lexical list, which does not
        # need its vector, is read; then the vector lists. No transaction is open while waiting.
        pending: list[_PendingVectors] = []
        try:
            for group in groups:
                pending.append(_start_group_vectors(group[0], query, rewritten, query_vector=query_vector,
                                                    with_query="vector" in lists))
            lexical = _lexical_list(query, kbs, doc_filter, candidates) if "lexical" in lists else None
            vectors = [p.result() for p in pending]
        finally:
            for p in pending:
                p.cancel()
        ranked: dict[str, list[int]] = {}
        distances: dict[int, float] = {}
        with connection.cursor() as cursor:
            if "vector" in lists or rewritten:
                _hnsw_settings(cursor, ef_search=max(HNSW_EF_SEARCH, candidates))
            for number, (group, (query_vec, rewrite_vec)) in enumerate(zip(groups, vectors, strict=True)):
                if query_vec is not None:
                    rows = _vector_list(cursor, query_vec, tenant_id=tenant_id, group=group,
                                        document_ids=doc_filter, limit=candidates)
                    ranked[f"vector.{number}"] = [i for i, _ in rows]
                    distances.update(rows)
                if rewrite_vec is not None:
                    rows = _vector_list(cursor, rewrite_vec, tenant_id=tenant_id, group=group,
                                        document_ids=doc_filter, limit=candidates)
                    ranked[f"rewrite.{number}"] = [i for i, _ in rows]
        if lexical is not None:
            ranked["lexical"] = lexical  # last, as ever: RRF's ties go to the list met first
        fused = rrf_fuse(ranked)
        keep = max(top_k, rerank_candidates) if rerank is not None else top_k
        hits = _hits(fused[:keep], distances)
        if rerank is not None and hits:
            scores = list(rerank(query, [_passage(h) for h in hits]))
            if len(scores) != len(hits):
                raise SearchError(f"The reranker returned {len(scores)} scores for {len(hits)} passages.",
                                  code="rerank_failed")
            hits = [replace(h, score=float(s), rerank_score=float(s)) for h, s in zip(hits, scores, strict=True)]
            hits.sort(key=lambda h: (-h.score, -h.rrf_score))
        return hits[:top_k]


def _passage(hit: Hit) -> str:
    return f"{hit.document_title} > {hit.heading}\n{hit.text}" if hit.heading else f"{hit.document_title}\n{hit.text}"


def _embedding_groups(kbs: list[KnowledgeBase]) -> list[list[KnowledgeBase]]:
    groups: dict[str, list[KnowledgeBase]] = defaultdict(list)
    for kb in kbs:
        groups[kb.embedding_fingerprint].append(kb)
    return list(groups.values())


def _document_filter(kb_ids: list[int], document_ids: Sequence[int] | None,
                     tags: Sequence[str] | None) -> list[int] | None:
    """Document ids the search is limited to, or None for every document of the knowledge bases."""
    if document_ids is None and not tags:
        return None
    qs = Document.objects.filter(knowledge_base_id__in=kb_ids)
    if document_ids is not None:
        if not all(isinstance(i, int) and not isinstance(i, bool) for i in document_ids):
            raise SearchError("document_ids must be integers.")
        qs = qs.filter(pk__in=list(document_ids))
    if tags:
        if not all(isinstance(t, str) for t in tags):
            raise SearchError("tags must be strings.")
        qs = qs.filter(tags__overlap=list(tags))
    return list(qs.values_list("pk", flat=True))


def _best(ranks: dict[str, int], prefix: str) -> int | None:
    found = [rank for name, rank in ranks.items() if name.startswith(prefix)]
    return min(found) if found else None


def _hits(fused: list[tuple[int, float, dict[str, int]]], distances: dict[int, float]) -> list[Hit]:
    if not fused:
        return []
    from knowledge.models import Chunk

    rows = {c.pk: c for c in Chunk.objects.filter(pk__in=[i for i, _, _ in fused]).select_related("document")
            .only("pk", "knowledge_base_id", "document_id", "position", "heading", "text", "document__title")}
    hits = []
    for chunk_id, score, ranks in fused:
        chunk = rows.get(chunk_id)
        if chunk is None:  # replaced by a re-ingestion between the lists and now
            continue
        hits.append(Hit(
            knowledge_base_id=chunk.knowledge_base_id, document_id=chunk.document_id,
            document_title=chunk.document.title, chunk_id=chunk.pk, position=chunk.position, heading=chunk.heading,
            text=chunk.text, score=score, rrf_score=score, vector_rank=_best(ranks, "vector."),
            lexical_rank=ranks.get("lexical"), rewrite_rank=_best(ranks, "rewrite."),
            vector_distance=distances.get(chunk_id),
        ))
    return hits


async def asearch(**kwargs) -> list[Hit]:
    """:func:`search` from async code: run on a thread with the caller's context
    (``asgiref.sync.sync_to_async``, thread-sensitive off so a run's loop is not serialised
    behind Django's main thread). Same arguments; the callables are called on that thread."""
    from asgiref.sync import sync_to_async

    return await sync_to_async(search, thread_sensitive=False)(**kwargs)


__all__ = ["DEFAULT_CANDIDATES", "LEXICAL_MAX_RANKED", "RRF_K", "Hit", "Reranker", "Rewriter", "SearchError", "asearch", "lexical_sql",
           "rrf_fuse", "search", "vector_sql", "TEXT_SEARCH_CONFIG"]
