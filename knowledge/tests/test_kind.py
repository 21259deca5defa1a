"""The ``knowledge`` capability kind: bindings (validation, another tenant's or a user's own
knowledge base refused), ``knowledge_search`` in a run (numbered passages for the model,
citations in the tool call's data and its event, no passages, bad arguments), retrieval before
the first turn (the passages in the model's first request, stored with the run, numbers that
later searches continue), and a user's own uploads searched only for their owner.

Real PostgreSQL (pgvector, full text), the real embedded embedder (``embedding_server``), the
scripted model server (``fake_llm``).
"""

from __future__ import annotations

import json

import pytest
from asgiref.sync import async_to_sync

from agents.models import CapabilityBinding
from agents.tests.factories import agent_with_route
from knowledge.ingestion import document_ingest
from knowledge.models import Document, KnowledgeBase
from knowledge.services import document_add_text, knowledge_base_create
from llm.testing import Reply, ToolCalls
from sessions.models import Run, ToolCall
from sessions.runner.loop import execute_run
from sessions.runner.tool_execution import UNTRUSTED_SYSTEM_NOTE
from sessions.tests.conftest import post_message_sync
from tenants.scoping import tenant_scope

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("all_tenants_scope")]

run_now = async_to_sync(execute_run)

SAILING = ("Sailing club handbook", """# Sailing club handbook

## Boats
The club owns four dinghies, kept in the blue boathouse next to the slipway.

## Opening hours
The boathouse opens at 8 in the morning and closes at sunset from April to October.
""")
KITCHEN = ("Kitchen rules", """# Kitchen rules

## Cleaning
Wash your own cup. The dishwasher runs every evening at six.
""")
SECRET = ("Private notes of Bob", """# Bob's notes

The combination of Bob's locker is 4711, and he keeps his spare keys in a red tin.
""")


@pytest.fixture
def no_ingest_task(monkeypatch):
    """Documents are ingested by the test itself (not handed to Celery)."""
    monkeypatch.setattr("knowledge.tasks.document_ingest_enqueue", lambda **kwargs: None)


def _provider(tenant, url):
    """The tenant's provider for the test's embedding server (made once)."""
    from llm.models import ModelProvider
    from llm.services import provider_save

    with tenant_scope(tenant.pk):
        existing = ModelProvider.objects.filter(name="test embedder").first()
        return existing or provider_save(tenant=tenant, name="test embedder", base_url=url)


def _kb(tenant, url, name, *docs, owner=None) -> KnowledgeBase:
    """A knowledge base with ``docs`` ((title, markdown) pairs), ingested for real."""
    provider = _provider(tenant, url)
    with tenant_scope(tenant.pk):
        kb = knowledge_base_create(tenant=tenant, name=name, owner=owner, embedding_provider=provider,
                                   embedding_model="all-minilm-l6-v2", dimensions=384)
        for title, text in docs:
            added = document_add_text(knowledge_base=kb, title=title, text=text)
            assert document_ingest(document_id=added.document.pk, generation=added.document.generation) == "ready"
    return kb


def _agent(world, fake_llm, config: dict, **fields):
    agent = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], **fields)
    binding = CapabilityBinding(tenant=world.tenant, agent=agent, kind="knowledge", config=config)
    binding.full_clean()
    binding.save()
    return agent


def _calls(run_id) -> list[ToolCall]:
    return list(ToolCall.all_tenants.filter(run_id=run_id).order_by("id"))


def _events(run_id, event_type):
    from sessions.events import events_since_sync

    run = Run.all_tenants.get(pk=run_id)
    return [e for e in events_since_sync(session_id=run.session_id, after_seq=0)
            if e["type"] == event_type and e["run_id"] == run_id]


# --- bindings ----------------------------------------------------------------------------------


def test_a_binding_is_checked_and_another_tenants_knowledge_base_is_not_found(
        world, other_world, embedding_server, no_ingest_task):
    ours = _kb(world.tenant, embedding_server, "Handbook", SAILING)
    theirs = _kb(other_world.tenant, embedding_server, "Theirs", KITCHEN)
    own = _kb(world.tenant, embedding_server, "Mine", SECRET, owner=world.member)
    agent = agent_with_route(tenant=world.tenant, base_urls=["http://127.0.0.1:9/v1"])
    client = world.client(admin=True)

    def bind(config):
        return client.post("/api/v1/admin/bindings/", {"agent": agent.pk, "kind": "knowledge", "config": config},
                           format="json")

    for config, complaint in [
        ({"knowledge_bases": [theirs.pk]}, f"[{theirs.pk}] not found"),  # another tenant's: as if missing
        ({"knowledge_bases": [own.pk]}, f"[{own.pk}] not found"),  # a user's own is not bindable
        ({"knowledge_bases": [ours.pk], "top_k": 0}, "top_k must be an integer from 1 to 20"),
        ({"knowledge_bases": [ours.pk], "top_k": 21}, "top_k must be an integer from 1 to 20"),
        ({"knowledge_bases": [ours.pk], "retrieve": True}, "Unknown keys ['retrieve']"),
        ({"knowledge_bases": ["1"]}, "knowledge_bases must be a list of knowledge base ids"),
        ({"knowledge_bases": []}, "Name at least one knowledge base"),
        ({"knowledge_bases": [ours.pk], "user_uploads": "yes"}, "user_uploads must be true or false"),
        ({"knowledge_bases": [ours.pk], "search_first": 1}, "search_first must be true or false"),
        ({"knowledge_bases": [ours.pk], "focus": "on"}, "focus must be true or false"),
        ({"knowledge_bases": [ours.pk], "search_tool": False}, "search_tool can be false only with"),
        ({"knowledge_bases": [ours.pk], "search_tool": False, "search_first": True}, "search_tool can be false only"),
        ({"knowledge_bases": [ours.pk], "search_first": True, "retrieve_before_first_turn": True},
         "Choose one of search_first"),
    ]:
        resp = bind(config)
        assert resp.status_code == 400, (config, resp.content)
        assert complaint in json.dumps(resp.json()), (config, resp.json())
    resp = bind({"knowledge_bases": [ours.pk], "top_k": 3, "retrieve_before_first_turn": True})
    assert resp.status_code == 201, resp.content
    assert bind({"knowledge_bases": [], "user_uploads": True}).status_code == 201
    assert bind({"knowledge_bases": [ours.pk], "search_first": True}).status_code == 201


# --- knowledge_search ---------------------------------------------------------------------------


def test_knowledge_search_returns_numbered_passages_and_citations(world, fake_llm, embedding_server, no_enqueue,
                                                                   no_ingest_task):
    kb = _kb(world.tenant, embedding_server, "Club", SAILING, KITCHEN)
    agent = _agent(world, fake_llm, {"knowledge_bases": [kb.pk], "top_k": 2})
    fake_llm.script(ToolCalls([("knowledge_search", {"query": "When does the boathouse open?"})]),
                    Reply("It opens at 8 [1]."))
    run = post_message_sync(agent=agent, user=world.member, content="When does the boathouse open?")
    run_now(run.pk)

    run = Run.all_tenants.get(pk=run.pk)
    assert run.status == "completed", run.error
    tool = next(t for t in fake_llm.requests[0]["tools"] if t["function"]["name"] == "knowledge_search")
    assert "“Club”" in tool["function"]["description"]
    [call] = _calls(run.pk)
    assert call.status == "succeeded"
    citations = call.result_data["citations"]
    assert [c["n"] for c in citations] == [1, 2]
    first = citations[0]
    hours = Document.all_tenants.get(knowledge_base=kb, title="Sailing club handbook")
    assert (first["document_id"], first["document_title"], first["knowledge_base_id"]) == (
        hours.pk, "Sailing club handbook", kb.pk)
    assert "Opening hours" in first["heading"] and "opens at 8" in first["snippet"]
    assert set(first) == {"n", "knowledge_base_id", "document_id", "document_title", "chunk_id", "position",
                          "heading", "score", "snippet"}
    assert call.result.startswith("[1] Sailing club handbook › ")
    assert "Cite the passages" not in call.result  # the platform asks, outside the (framed) passages
    assert "cite the ones you use as [n]" in tool["function"]["description"]
    model_saw = fake_llm.requests[1]["messages"][-1]["content"]
    assert "[1] Sailing club handbook" in model_saw and "opens at 8 in the morning" in model_saw
    [event] = _events(run.pk, "tool_call_succeeded")
    assert event["data"]["data"] == {"citations": citations}


def test_no_passages_is_a_result_and_bad_arguments_fail_the_call(world, fake_llm, embedding_server, no_enqueue,
                                                                 no_ingest_task):
    kb = _kb(world.tenant, embedding_server, "Club", SAILING)
    agent = _agent(world, fake_llm, {"knowledge_bases": [kb.pk]})
    other_doc = Document.all_tenants.get(knowledge_base=kb).pk + 1000
    fake_llm.script(ToolCalls([
        ("knowledge_search", {"query": "boats", "filters": {"document_ids": [other_doc]}}),
        ("knowledge_search", {"query": "boats", "top_k": 99}),
        ("knowledge_search", {"query": "  "}),
        ("knowledge_search", {"query": "boats", "filters": {"colour": "red"}}),
    ]), Reply("Nothing."))
    run = post_message_sync(agent=agent, user=world.member, content="Boats?")
    run_now(run.pk)

    assert Run.all_tenants.get(pk=run.pk).status == "completed"
    empty, too_many, blank, unknown = _calls(run.pk)
    assert (empty.status, empty.result, empty.result_data) == (
        "succeeded", "No passages found for this query in the knowledge bases.", {"citations": []})
    assert (too_many.status, too_many.error) == ("failed", "top_k must be an integer from 1 to 20.")
    assert blank.status == "failed" and "query must be a non-empty string" in blank.error
    assert unknown.status == "failed" and "Unknown filters ['colour']" in unknown.error


# --- retrieval before the first turn --------------------------------------------------------------


def test_passages_before_the_first_turn_are_in_the_first_request_and_numbers_continue(
        world, fake_llm, embedding_server, no_enqueue, no_ingest_task):
    kb = _kb(world.tenant, embedding_server, "Club", SAILING, KITCHEN)
    agent = _agent(world, fake_llm, {"knowledge_bases": [kb.pk], "top_k": 2, "retrieve_before_first_turn": True},
                   system_prompt="Answer from the passages.")
    fake_llm.script(ToolCalls([("knowledge_search", {"query": "dishwasher"})]), Reply("At six [3]."))
    run = post_message_sync(agent=agent, user=world.member, content="Where are the dinghies kept?")
    run_now(run.pk)

    run = Run.all_tenants.get(pk=run.pk)
    assert run.status == "completed", run.error
    system = fake_llm.requests[0]["messages"][0]["content"]
    assert system.startswith(f"Answer from the passages.\n\n{UNTRUSTED_SYSTEM_NOTE}\n\nPassages from “Club” that may "
                             "answer the user's message (use them when relevant). Cite the passages you use")
    assert "[1] Sailing club handbook › " in system and "blue boathouse" in system
    [block] = run.context
    assert block["source"] == "knowledge"
    context_citations = block["data"]["citations"]
    assert [c["n"] for c in context_citations] == [1, 2]
    assert context_citations[0]["document_title"] == "Sailing club handbook"
    # A later search in the same run goes on numbering; a chunk found again keeps its number.
    [call] = _calls(run.pk)
    by_chunk = {c["chunk_id"]: c["n"] for c in context_citations}
    for c in call.result_data["citations"]:
        assert c["n"] == by_chunk.get(c["chunk_id"], c["n"])
        assert c["chunk_id"] in by_chunk or c["n"] >= 3
    kitchen = next(c for c in call.result_data["citations"] if c["document_title"] == "Kitchen rules")
    assert f"[{kitchen['n']}] Kitchen rules" in call.result


HARBOUR = ("Harbour rules", """# Harbour rules

## Moorings
Visitors pay 12 euros a night for a mooring. The harbour master's office opens at seven. Dinghies are kept in the
blue boathouse next to the slipway. The fuel pontoon closes at noon on Sundays.
""")


def test_with_focus_the_model_reads_only_the_passages_lines_about_the_message_and_the_citation_stays_whole(
        world, fake_llm, embedding_server, no_enqueue, no_ingest_task):
    kb = _kb(world.tenant, embedding_server, "Harbour", HARBOUR)
    agent = _agent(world, fake_llm, {"knowledge_bases": [kb.pk], "top_k": 1, "retrieve_before_first_turn": True,
                                     "focus": True, "search_tool": False}, system_prompt="Answer from the passages.")
    fake_llm.script(Reply("In the blue boathouse."))
    run = post_message_sync(agent=agent, user=world.member, content="Where are the dinghies kept?")
    run_now(run.pk)

    run = Run.all_tenants.get(pk=run.pk)
    assert run.status == "completed", run.error
    system = fake_llm.requests[0]["messages"][0]["content"]
    assert "[1] Harbour rules › " in system
    assert "Dinghies are kept in the\nblue boathouse next to the slipway." not in system  # one line, not the chunk's
    assert "Dinghies are kept in the blue boathouse next to the slipway." in system
    assert "12 euros" not in system and "fuel pontoon" not in system
    offered = [t["function"]["name"] for t in fake_llm.requests[0].get("tools", [])]
    assert "knowledge_search" not in offered and "knowledge_search" not in system  # search_tool false: not offered
    [block] = run.context
    assert "fuel pontoon" not in block["text"]
    [citation] = block["data"]["citations"]
    assert "12 euros" in citation["snippet"]  # the chat app's citation is the whole passage


# --- a user's own uploads -------------------------------------------------------------------------


def test_a_run_of_user_a_never_retrieves_user_bs_own_uploads(world, fake_llm, embedding_server, no_enqueue,
                                                              no_ingest_task):
    from tenants.models import Membership, Role

    kb = _kb(world.tenant, embedding_server, "Club", SAILING)
    bob = type(world.member).objects.create_user(username="bob-kind", password="x")
    Membership.all_tenants.create(tenant=world.tenant, user=bob, role=Role.MEMBER)
    _kb(world.tenant, embedding_server, "Bob's uploads", SECRET, owner=bob)
    mine = _kb(world.tenant, embedding_server, "My uploads", KITCHEN, owner=world.member)
    agent = _agent(world, fake_llm, {"knowledge_bases": [kb.pk], "top_k": 5, "user_uploads": True,
                                     "retrieve_before_first_turn": True})
    fake_llm.script(ToolCalls([("knowledge_search", {"query": "Bob's locker combination and spare keys"})]),
                    Reply("I don't know."))
    run = post_message_sync(agent=agent, user=world.member, content="What is the combination of Bob's locker?")
    run_now(run.pk)

    run = Run.all_tenants.get(pk=run.pk)
    assert run.status == "completed", run.error
    [call] = _calls(run.pk)
    seen = [c for block in run.context for c in block["data"]["citations"]] + call.result_data["citations"]
    assert seen, "the run's own and tenant-wide passages are found"
    titles = {c["document_title"] for c in seen}
    assert "Private notes of Bob" not in titles and "4711" not in json.dumps(fake_llm.requests)
    assert {c["knowledge_base_id"] for c in seen} <= {kb.pk, mine.pk}
    assert "Kitchen rules" in titles  # the run's user's own upload is searched (user_uploads)
    assert ToolCall.all_tenants.get(pk=call.pk).status == "succeeded"


def test_without_user_uploads_the_users_own_knowledge_base_is_not_searched(world, fake_llm, embedding_server,
                                                                            no_enqueue, no_ingest_task):
    kb = _kb(world.tenant, embedding_server, "Club", SAILING)
    _kb(world.tenant, embedding_server, "My uploads", KITCHEN, owner=world.member)
    agent = _agent(world, fake_llm, {"knowledge_bases": [kb.pk], "top_k": 5})
    fake_llm.script(ToolCalls([("knowledge_search", {"query": "dishwasher cup cleaning"})]), Reply("Unknown."))
    run = post_message_sync(agent=agent, user=world.member, content="When does the dishwasher run?")
    run_now(run.pk)
    [call] = _calls(run.pk)
    assert call.status == "succeeded"
    assert {c["document_title"] for c in call.result_data["citations"]} <= {"Sailing club handbook"}


# --- rewrite and rerank through the run's route ---------------------------------------------------


def test_rewrite_and_rerank_ask_the_runs_model_and_rerank_reorders(world, fake_llm, embedding_server, no_enqueue,
                                                                   no_ingest_task):
    from llm.testing import Reply as R

    kb = _kb(world.tenant, embedding_server, "Club", SAILING, KITCHEN)
    agent = _agent(world, fake_llm, {"knowledge_bases": [kb.pk], "top_k": 1, "rewrite": True, "rerank": True})

    def answer(body):
        last = body["messages"][-1]
        text = last.get("content") or ""
        if text.startswith("You judge search results"):  # the rerank step: only the kitchen passage is relevant
            return R("9" if "dishwasher" in text else "1")
        if text.startswith("Rewrite the question"):
            return R("boathouse hours")
        if last["role"] == "tool":
            return R("Done.")
        return ToolCalls([("knowledge_search", {"query": "When does the boathouse open?"})])

    fake_llm.respond(answer)
    run = post_message_sync(agent=agent, user=world.member, content="Go")
    run_now(run.pk)

    assert Run.all_tenants.get(pk=run.pk).status == "completed"
    [call] = _calls(run.pk)
    # Fused, the boathouse passage comes first; the (scripted) reranker prefers the kitchen's.
    assert [c["document_title"] for c in call.result_data["citations"]] == ["Kitchen rules"]
    prompts = [r["messages"][-1].get("content") or "" for r in fake_llm.requests]
    assert sum(p.startswith("Rewrite the question") for p in prompts) == 1
    assert sum(p.startswith("You judge search results") for p in prompts) >= 2
