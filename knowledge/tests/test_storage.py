"""Storage of chunks: the tenant policy on every knowledge table, the lexical function's own
tenant predicate, and the plans (the partial HNSW index for vectors, the GIN index for text)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from django.db import DatabaseError, connection, transaction

from knowledge.models import Chunk, Document, KnowledgeBase
from knowledge.retrieval import lexical_sql, vector_sql
from knowledge.tests import builders
from tenants import rls
from tenants.scoping import outside_scope, tenant_scope

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("all_tenants_scope")]

WORDS = ("harbour", "engine", "ledger", "meadow", "signal", "copper", "lantern", "orchard", "quarry", "timber",
         "violet", "walnut", "basalt", "cobalt", "saffron", "thistle")


def _plan(sql: str, params: dict) -> dict:
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (FORMAT JSON) " + sql, params)
        plan = cursor.fetchone()[0]
    return (json.loads(plan) if isinstance(plan, str) else plan)[0]["Plan"]


def _nodes(plan: dict):
    yield plan
    for child in plan.get("Plans", []):
        yield from _nodes(child)


def _filled(world, other_world, *, per_tenant: int):
    """``per_tenant`` chunks in each tenant (random unit vectors, texts of three random words)."""
    rng = random.Random(7)
    made = {}
    for w in (world, other_world):
        kb = builders.knowledge_base(w.tenant)
        doc = builders.document(kb)
        texts = [" ".join(rng.choice(WORDS) for _ in range(3)) + f" item{i}" for i in range(per_tenant)]
        builders.chunks(doc, texts, [builders.random_unit(rng) for _ in texts])
        made[w.tenant.pk] = kb
    with rls.owner_mode(), connection.cursor() as cursor:
        cursor.execute("ANALYZE knowledge_chunk")
    return made


def test_every_knowledge_table_has_the_tenant_policy():
    with connection.cursor() as cursor:
        cursor.execute("SELECT tablename FROM pg_policies WHERE policyname = %s AND tablename LIKE 'knowledge_%%'",
                       [rls.POLICY_NAME])
        assert {row[0] for row in cursor.fetchall()} == {
            KnowledgeBase._meta.db_table, Document._meta.db_table, Chunk._meta.db_table}


def test_the_database_refuses_other_tenants_rows(world, other_world):
    made = _filled(world, other_world, per_tenant=5)
    ours, theirs = made[world.tenant.pk], made[other_world.tenant.pk]
    with tenant_scope(world.tenant.pk):
        with connection.cursor() as cursor:
            cursor.execute("SELECT DISTINCT knowledge_base_id FROM knowledge_chunk")
            assert [row[0] for row in cursor.fetchall()] == [ours.pk]
            cursor.execute("SELECT count(*) FROM knowledge_document WHERE knowledge_base_id = %s", [theirs.pk])
            assert cursor.fetchone()[0] == 0
        assert not Chunk.all_tenants.filter(knowledge_base_id=theirs.pk).exists()  # the ORM's bypass is held too
        their_doc = Document.all_tenants.filter(knowledge_base_id=theirs.pk).first()
        assert their_doc is None
        with pytest.raises(DatabaseError), transaction.atomic():  # writing into the other tenant
            Chunk.all_tenants.create(tenant_id=other_world.tenant.pk, knowledge_base_id=theirs.pk,
                                     document_id=Document.objects.get(knowledge_base=ours).pk, position=99,
                                     text="x", char_count=1, token_count=1, embedding=[0.0] * 384, dimensions=384)


def test_the_lexical_function_applies_the_tenant_predicate(world, other_world):
    made = _filled(world, other_world, per_tenant=5)
    kb_ids = [kb.pk for kb in made.values()]  # asks for both tenants' knowledge bases
    params = {"query": "harbour engine ledger meadow signal copper", "kbs": kb_ids, "documents": None, "limit": 50,
              "strict": False, "max_ranked": 1000}
    with tenant_scope(world.tenant.pk), connection.cursor() as cursor:
        cursor.execute(lexical_sql(), params)
        found = [row[0] for row in cursor.fetchall()]
    assert found
    assert set(Chunk.all_tenants.filter(pk__in=found).values_list("tenant_id", flat=True)) == {world.tenant.pk}
    with outside_scope(), connection.cursor() as cursor:
        cursor.execute(lexical_sql(), params)
        assert cursor.fetchall() == []


def test_the_lexical_functions_predicate_is_the_policys():
    """The function as installed (the latest migration's): one of that name, and each of its
    two queries (all terms, any term: the same statement run twice) filters by the policy's
    own predicate."""
    expected = " ".join(rls.policy_expression("c.tenant_id").split())
    with connection.cursor() as cursor:
        cursor.execute("SELECT prosrc, prosecdef FROM pg_proc WHERE proname = 'knowledge_lexical_candidates'")
        [(source, security_definer)] = cursor.fetchall()
    source = " ".join(source.split())
    assert security_definer and expected in source
    assert source.count("FROM knowledge_chunk c") == source.count(expected) == 1
    assert source.count("EXECUTE") == 2 and source.count("step") >= 3  # both steps run that one statement
    migration = (Path(__file__).parent.parent / "migrations" / "0001_initial.py").read_text()
    assert expected in " ".join(migration.split())


def test_the_vector_list_uses_the_partial_hnsw_index(world, other_world):
    """The query matches the partial index's expression and predicate, under the tenant
    policy. With 600 rows a tenant's rows sorted in memory cost the planner less than the
    index, so sorting is priced out here (``enable_sort``); at 100,000 chunks the planner picks
    the index on its own (bench/knowledge_search.py prints the plan)."""
    made = _filled(world, other_world, per_tenant=600)
    kb = made[world.tenant.pk]
    vector = "[" + ",".join(["0.05"] * 384) + "]"
    with tenant_scope(world.tenant.pk), transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL enable_sort = off")
        plan = _plan(vector_sql(384, with_documents=False),
                     {"vector": vector, "tenant": world.tenant.pk, "kbs": [kb.pk], "documents": None, "limit": 40,
                      "fingerprint": kb.embedding_fingerprint})
    scans = [n.get("Index Name") for n in _nodes(plan) if n["Node Type"] == "Index Scan"]
    assert scans == ["knowledge_chunk_hnsw_384"], json.dumps(plan)[:2000]


def test_the_lexical_list_uses_the_gin_index(world, other_world):
    """The function's query as it runs (as the owner, SECURITY DEFINER) is a GIN bitmap scan;
    the same query as the application's role, under the policy, cannot use the index (``@@``
    is not leakproof): why the function exists."""
    made = _filled(world, other_world, per_tenant=600)
    kb = made[world.tenant.pk]
    body = ("SELECT c.id, ts_rank(c.tsv, q) AS rank FROM knowledge_chunk c, "
            "to_tsquery('english', 'item77 | item78') q "
            "WHERE c.tsv @@ q AND c.knowledge_base_id = ANY(%(kbs)s::bigint[]) ORDER BY rank DESC LIMIT 40")
    with rls.owner_mode(), transaction.atomic():
        owner_plan = _plan(body, {"kbs": [kb.pk]})
    assert "knowledge_chunk_tsv" in [n.get("Index Name") for n in _nodes(owner_plan)], json.dumps(owner_plan)[:2000]
    with tenant_scope(world.tenant.pk), transaction.atomic():
        app_plan = _plan(body, {"kbs": [kb.pk]})
    assert "knowledge_chunk_tsv" not in [n.get("Index Name") for n in _nodes(app_plan)]


def test_a_tenant_with_knowledge_bases_can_be_deleted_and_a_provider_in_use_cannot(world):
    from django.db.models import RestrictedError

    kb = builders.knowledge_base(world.tenant)
    [chunk] = builders.chunks(builders.document(kb), ["text"], [builders.unit([1.0] + [0.0] * 383)])
    with pytest.raises(RestrictedError):
        kb.embedding_provider.delete()
    world.tenant.delete()
    assert not Chunk.all_tenants.filter(pk=chunk.pk).exists()
    assert not KnowledgeBase.all_tenants.filter(pk=kb.pk).exists()
