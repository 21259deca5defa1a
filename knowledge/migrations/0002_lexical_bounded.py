"""The lexical list with bounded work: all the query's terms first, some of them only if that
finds too few; at most ``max_ranked`` matches ranked per step.

Replaces migration 0001's ``knowledge_lexical_candidates(query, kb_ids, doc_ids, max_rows,
strict)``, which OR-ed a question's terms and ran ``ts_rank`` over every chunk matching any of
them (tens of thousands at 100,000 chunks: ~200 ms). Still ``SECURITY DEFINER`` for the GIN
index (see 0001), still applying the tenant policy's own predicate (``tenants.rls.
policy_expression``, frozen here as it is in that module) in both of its queries.

1. **All terms** (``websearch_to_tsquery('english', query)``: AND, or the query's own operators):
   up to ``max_ranked`` matching chunks ranked, the best ``max_rows``.
2. **Any term**, only when step 1 gave fewer than ``max_rows`` and ``strict`` is false: the
   same with the terms OR-ed, chunks of step 1 left out, appended after them (a chunk holding
   every term outranks one holding some: coordination first).

Ranking within a step: the sum of the inverse document frequencies of the query's terms the
chunk holds (BM25's IDF, ``ln(1 + (N - df + 0.5) / (df + 0.5))``, Robertson & Zaragoza, "The
Probabilistic Relevance Framework: BM25 and Beyond", 2009), then ``ts_rank`` (term frequency and
position; it has no IDF of its own). ``df`` and ``N`` are counted in the step's matched set
``M``: in step 2, ``M`` holds every chunk that contains any query term (when not capped), so a
term's ``df`` in ``M`` is its document frequency in the searched knowledge bases; ``N = |M|``
instead of the knowledge bases' size keeps the terms' order by rarity (a word most of the
matches contain weighs little: "happens", "run" in a question about runs). In step 1 every
chunk holds every term, so the sum is equal and ``ts_rank`` decides. Without IDF a question's
common words ranked chunks as much as its rare ones (bench/knowledge_quality.py: hybrid
recall@5 below lexical's on the first 26 questions).

What the cap trades: each step reads and ranks at most ``max_ranked`` chunks, taken in the
order the GIN bitmap heap scan meets them (physical order, roughly insertion order), not the
best ``max_ranked``; past the cap the document frequencies are those of that sample. When a step matches more chunks than that (a common word; an OR of a
question's words in a large knowledge base), a chunk past the first ``max_ranked`` is never
ranked however well it would have scored, and older documents are preferred. The vector list
is not capped that way, so the fusion still sees such chunks when they are semantically close.
Below ``max_ranked`` matches (every knowledge base of the project's documentation size) the
result is exact.

Both queries run through ``EXECUTE … USING``: planned per call with the actual tsquery, so the
planner picks the GIN bitmap for rare terms and whatever is cheaper for common ones, instead
of a generic plan cached for the session.
"""

import importlib

from django.db import migrations

PREDICATE = ("(current_setting('app.all_tenants', true) = 'on' "
             "OR c.tenant_id = ANY (coalesce(nullif(current_setting('app.tenant_ids', true), ''), '{}')::bigint[]))")

LEXICAL_FUNCTION_SQL = r"""
DROP FUNCTION IF EXISTS knowledge_lexical_candidates(text, bigint[], bigint[], integer, boolean);
CREATE OR REPLACE FUNCTION knowledge_lexical_candidates(
    query text, kb_ids bigint[], doc_ids bigint[], max_rows integer, strict boolean, max_ranked integer)
RETURNS TABLE (id bigint, rank real)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path FROM CURRENT
AS $fn$
DECLARE
    all_terms tsquery := websearch_to_tsquery('english', query);
    any_term tsquery;
    found_ids bigint[];
    found_ranks real[];
    terms tsquery[];
    step text := $q$
        WITH m AS MATERIALIZED (
            SELECT c.id, ts_rank(c.tsv, $1) AS tr,
                   ARRAY(SELECT i FROM generate_subscripts($7, 1) AS i WHERE c.tsv @@ ($7)[i]) AS held
            FROM knowledge_chunk c
            WHERE c.tsv @@ $1
              AND c.knowledge_base_id = ANY ($2)
              AND ($3 IS NULL OR c.document_id = ANY ($3))
              AND NOT (c.id = ANY ($6))
              AND __PREDICATE__
            LIMIT $5),
        n AS (SELECT count(*)::float8 AS n FROM m),
        w AS (SELECT h.i, ln(1 + (n.n - count(*) + 0.5) / (count(*) + 0.5)) AS idf
              FROM m, unnest(m.held) AS h(i), n GROUP BY h.i, n.n)
        SELECT m.id, (coalesce(sum(w.idf), 0) + m.tr)::real AS rank
        FROM m LEFT JOIN LATERAL unnest(m.held) AS h(i) ON true LEFT JOIN w ON w.i = h.i
        GROUP BY m.id, m.tr
        ORDER BY rank DESC, m.id
        LIMIT $4 $q$;
BEGIN
    IF numnode(all_terms) = 0 OR max_rows < 1 OR max_ranked < 1 THEN
        RETURN;
    END IF;
    SELECT coalesce(array_agg(DISTINCT quote_literal(l)::tsquery), '{}') INTO terms
        FROM unnest(tsvector_to_array(to_tsvector('english', query))) AS l;
    EXECUTE 'SELECT coalesce(array_agg(s.id ORDER BY s.rank DESC, s.id), ''{}''), '
            'coalesce(array_agg(s.rank ORDER BY s.rank DESC, s.id), ''{}'') FROM (' || step || ') s'
        INTO found_ids, found_ranks
        USING all_terms, kb_ids, doc_ids, max_rows, max_ranked, '{}'::bigint[], terms;
    RETURN QUERY SELECT u.id, u.rank FROM unnest(found_ids, found_ranks) WITH ORDINALITY AS u(id, rank, n)
        ORDER BY u.n;
    IF strict OR cardinality(found_ids) >= max_rows THEN
        RETURN;
    END IF;
    any_term := replace(all_terms::text, ' & ', ' | ')::tsquery;
    IF any_term::text = all_terms::text THEN
        RETURN;  -- one term, or already OR-ed: step 2 would find the same chunks
    END IF;
    RETURN QUERY EXECUTE step USING any_term, kb_ids, doc_ids, max_rows - cardinality(found_ids), max_ranked,
        found_ids, terms;
END
$fn$;
""".replace("__PREDICATE__", PREDICATE)


def _previous_sql() -> str:
    return importlib.import_module("knowledge.migrations.0001_initial").LEXICAL_FUNCTION_SQL


class Migration(migrations.Migration):

    dependencies = [
        ("knowledge", "0001_initial"),
    ]

    operations = [
        migrations.RunSQL(
            LEXICAL_FUNCTION_SQL,
            "DROP FUNCTION IF EXISTS knowledge_lexical_candidates(text, bigint[], bigint[], integer, boolean, integer);"
            + _previous_sql(),
        ),
    ]
