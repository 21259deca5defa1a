"""A rerank model (a cross-encoder behind a provider's ``/v1/rerank``) as a knowledge search's
rerank step: bound to an agent (``"rerank": {"provider": id, "model": name}``, checked like
the knowledge bases: another tenant's provider is "not found"), in a run's
``knowledge_search`` (reorders; a failing or deleted rerank model keeps the fused order), and
in the search API (reorders with ``rerank_score``; a failing reranker is a 502 with the reason,
for a model route as for a rerank model, never a 500).

Real PostgreSQL, the real embedded embedder (``embedding_server``) and the scripted server
(``fake_llm``) as both the chat model and the rerank model.
"""

from __future__ import annotations

import json

import pytest
from asgiref.sync import async_to_sync

from agents.tests.factories import agent_with_route
from knowledge.tests.test_kind import KITCHEN, SAILING, _agent, _calls, _kb
from llm.models import ModelProvider
from llm.testing import Fail, Reply, ToolCalls
from sessions.models import Run
from sessions.runner.loop import execute_run
from sessions.tests.conftest import post_message_sync

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("all_tenants_scope")]

run_now = async_to_sync(execute_run)


@pytest.fixture
def no_ingest_task(monkeypatch):
    monkeypatch.setattr("knowledge.tasks.document_ingest_enqueue", lambda **kwargs: None)


def _reranker_provider(tenant, base_url, *, api="openai", name="reranker") -> ModelProvider:
    return ModelProvider.all_tenants.create(tenant=tenant, name=name, base_url=base_url, api=api)


def _prefers_kitchen(query: str, documents: list[str]) -> list[float]:
    return [0.9 if "dishwasher" in d else 0.1 for d in documents]


# --- binding ------------------------------------------------------------------------------------


def test_a_binding_names_its_tenants_openai_compatible_provider(world, other_world, embedding_server,
                                                                no_ingest_task):
    kb = _kb(world.tenant, embedding_server, "Club", SAILING)
    ours = _reranker_provider(world.tenant, "http://127.0.0.1:9/v1")
    claude = _reranker_provider(world.tenant, "https://api.anthropic.com", api="anthropic", name="claude")
    theirs = _reranker_provider(other_world.tenant, "http://127.0.0.1:9/v1")
    agent = agent_with_route(tenant=world.tenant, base_urls=["http://127.0.0.1:9/v1"])
    client = world.client(admin=True)

    def bind(rerank):
        return client.post("/api/v1/admin/bindings/", {"agent": agent.pk, "kind": "knowledge", "config": {
            "knowledge_bases": [kb.pk], "rerank": rerank}}, format="json")

    for rerank, complaint in [
        ({"provider": theirs.pk, "model": "bge"}, f"Model provider {theirs.pk} (rerank.provider) not found"),
        ({"provider": claude.pk, "model": "bge"}, "speaks the anthropic API, which has no rerank endpoint"),
        ({"provider": ours.pk}, "rerank must be true"),
        ({"provider": ours.pk, "model": "bge", "top_n": 3}, "rerank must be true"),
        ({"provider": str(ours.pk), "model": "bge"}, "rerank must be true"),
        ({"provider": ours.pk, "model": " "}, "rerank.model must be the provider's rerank model name"),
        ("yes", "rerank must be true"),
    ]:
        resp = bind(rerank)
        assert resp.status_code == 400, (rerank, resp.content)
        assert complaint in json.dumps(resp.json()), (rerank, resp.json())
    assert bind({"provider": ours.pk, "model": "BAAI/bge-reranker-v2-m3"}).status_code == 201
    assert bind(True).status_code == 201 and bind(False).status_code == 201


# --- a run's knowledge_search -------------------------------------------------------------------


def _rerank_agent(world, fake_llm, kb, provider_id):
    return _agent(world, fake_llm, {"knowledge_bases": [kb.pk], "top_k": 1,
                                    "rerank": {"provider": provider_id, "model": "bge-reranker"}})


def _searching_run(world, fake_llm, agent):
    """The passages' titles of the run's one ``knowledge_search`` (it completes)."""
    fake_llm.script(ToolCalls([("knowledge_search", {"query": "When does the boathouse open?"})]), Reply("Done."))
    run = post_message_sync(agent=agent, user=world.member, content="Go")
    run_now(run.pk)
    assert Run.all_tenants.get(pk=run.pk).status == "completed"
    [call] = _calls(run.pk)
    assert call.status == "succeeded"
    return [c["document_title"] for c in call.result_data["citations"]]


def test_the_rerank_model_reorders_a_runs_passages(world, fake_llm, embedding_server, no_enqueue, no_ingest_task):
    kb = _kb(world.tenant, embedding_server, "Club", SAILING, KITCHEN)
    provider = _reranker_provider(world.tenant, fake_llm.base_url)
    fake_llm.rerank_with(_prefers_kitchen)

    # Fused, the boathouse passage comes first; the rerank model prefers the kitchen's.
    assert _searching_run(world, fake_llm, _rerank_agent(world, fake_llm, kb, provider.pk)) == ["Kitchen rules"]
    [request] = fake_llm.rerank_requests
    assert request["model"] == "bge-reranker" and request["query"] == "When does the boathouse open?"
    assert len(request["documents"]) >= 2 and request["top_n"] == len(request["documents"])
    assert any(d.startswith("Kitchen rules > ") for d in request["documents"])  # title and heading path
    # Not an LLM judge: no chat request asked for a grade.
    assert not any("You judge search results" in json.dumps(r) for r in fake_llm.requests)


def test_a_failing_rerank_model_keeps_the_fused_order(world, fake_llm, embedding_server, no_enqueue, no_ingest_task):
    kb = _kb(world.tenant, embedding_server, "Club", SAILING, KITCHEN)
    provider = _reranker_provider(world.tenant, fake_llm.base_url)
    fake_llm.rerank_with(lambda query, documents: Fail(500))

    agent = _rerank_agent(world, fake_llm, kb, provider.pk)
    assert _searching_run(world, fake_llm, agent) == ["Sailing club handbook"]
    assert len(fake_llm.rerank_requests) == 1


def test_a_deleted_rerank_provider_keeps_the_fused_order(world, fake_llm, embedding_server, no_enqueue,
                                                          no_ingest_task):
    kb = _kb(world.tenant, embedding_server, "Club", SAILING, KITCHEN)
    provider = _reranker_provider(world.tenant, fake_llm.base_url)
    fake_llm.rerank_with(_prefers_kitchen)
    agent = _rerank_agent(world, fake_llm, kb, provider.pk)
    provider.delete()
    assert _searching_run(world, fake_llm, agent) == ["Sailing club handbook"]
    assert fake_llm.rerank_requests == []


def test_another_tenants_provider_written_into_a_binding_is_never_called(world, other_world, fake_llm,
                                                                          embedding_server, no_enqueue,
                                                                          no_ingest_task):
    """Validation refuses it; written around validation (a raw update), the run's lookup under
    the run's tenant scope and row-level security does not find it either."""
    from agents.models import CapabilityBinding

    kb = _kb(world.tenant, embedding_server, "Club", SAILING, KITCHEN)
    theirs = _reranker_provider(other_world.tenant, fake_llm.base_url)
    fake_llm.rerank_with(_prefers_kitchen)
    agent = _agent(world, fake_llm, {"knowledge_bases": [kb.pk], "top_k": 1})
    CapabilityBinding.all_tenants.filter(agent=agent, kind="knowledge").update(config={
        "knowledge_bases": [kb.pk], "top_k": 1, "rerank": {"provider": theirs.pk, "model": "bge-reranker"}})
    assert _searching_run(world, fake_llm, agent) == ["Sailing club handbook"]
    assert fake_llm.rerank_requests == []


# --- the search API -----------------------------------------------------------------------------


def _search(client, kb, **body):
    return client.post(f"/api/v1/knowledge-bases/{kb.pk}/search/",
                       {"query": "When does the boathouse open?", "top_k": 2, **body}, format="json")


def test_the_search_api_reranks_with_a_rerank_model(world, fake_llm, embedding_server, no_ingest_task):
    kb = _kb(world.tenant, embedding_server, "Club", SAILING, KITCHEN)
    provider = _reranker_provider(world.tenant, fake_llm.base_url)
    fake_llm.rerank_with(_prefers_kitchen)
    member = world.client()

    fused = _search(member, kb).json()["hits"]
    assert fused[0]["document_title"] == "Sailing club handbook" and fused[0]["rerank_score"] is None
    reranked = _search(member, kb, rerank_provider=provider.pk, rerank_model="bge-reranker")
    assert reranked.status_code == 200, reranked.content
    hits = reranked.json()["hits"]
    assert hits[0]["document_title"] == "Kitchen rules"
    assert hits[0]["rerank_score"] == hits[0]["score"] == pytest.approx(0.9)
    assert hits[1]["rerank_score"] == pytest.approx(0.1)


def test_the_search_api_refuses_a_bad_rerank_request(world, other_world, fake_llm, embedding_server,
                                                     no_ingest_task):
    kb = _kb(world.tenant, embedding_server, "Club", SAILING)
    provider = _reranker_provider(world.tenant, fake_llm.base_url)
    claude = _reranker_provider(world.tenant, "https://api.anthropic.com", api="anthropic", name="claude")
    theirs = _reranker_provider(other_world.tenant, fake_llm.base_url)
    route = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url]).route
    member = world.client()
    for body, field in [
        ({"rerank_model": "bge"}, "rerank_provider"),
        ({"rerank_provider": provider.pk}, "rerank_model"),
        ({"rerank_provider": provider.pk, "rerank_model": "bge", "rerank_route": route.pk}, "rerank_route"),
        ({"rerank_provider": claude.pk, "rerank_model": "bge"}, "rerank_provider"),
        ({"rerank_provider": theirs.pk, "rerank_model": "bge"}, "rerank_provider"),  # another tenant's: unknown
    ]:
        resp = _search(member, kb, **body)
        assert resp.status_code == 400, (body, resp.content)
        assert field in resp.json()["extra"]["fields"], (body, resp.json())
    assert fake_llm.rerank_requests == [] and fake_llm.requests == []


def test_a_failing_reranker_is_a_502_with_the_reason(world, fake_llm, embedding_server, no_ingest_task):
    kb = _kb(world.tenant, embedding_server, "Club", SAILING, KITCHEN)
    provider = _reranker_provider(world.tenant, fake_llm.base_url)
    fake_llm.rerank_with(lambda query, documents: Fail(401))
    member = world.client()

    resp = _search(member, kb, rerank_provider=provider.pk, rerank_model="bge-reranker")
    assert resp.status_code == 502, resp.content
    assert resp.json()["extra"]["code"] == "rerank_failed"
    assert resp.json()["message"].startswith("Not reranked: rerank by 'reranker' (bge-reranker)")

    # A model route as the reranker: its model failing is a 502 too, not a 500.
    dead = agent_with_route(tenant=world.tenant, base_urls=["http://127.0.0.1:9/v1"]).route
    resp = _search(member, kb, rerank_route=dead.pk)
    assert resp.status_code == 502, resp.content
    assert resp.json()["extra"]["code"] == "rerank_failed"
    assert resp.json()["message"].startswith(f"Not reranked: the model route {dead.name!r} failed")
