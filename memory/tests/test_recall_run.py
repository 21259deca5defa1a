"""Recall at a run's start: the memory kind's block reaches the model's first request (after the
system prompt), holds only the run user's memories with this agent, at most ``max_items``,
the most relevant to the user message first; a run without memories, or of an agent with
memory off, gets no block. Real runner, real embedder, scripted model."""

from __future__ import annotations

import pytest
from asgiref.sync import async_to_sync
from django.contrib.auth import get_user_model

from agents.tests.factories import agent_with_route
from capabilities.registry import OpenContext
from llm.embeddings import DEFAULT_EMBEDDING_MODEL, EmbeddingEndpoint, embed_texts
from llm.testing import Reply
from memory.kind import BLOCK_TITLE, MemoryBindingSpec, MemoryKind
from memory.models import Memory
from memory.policy import MemoryPolicy
from memory.tests.factories import memory_binding, memory_make
from sessions.models import Run
from sessions.runner.loop import execute_run
from sessions.tests.conftest import post_message_sync
from tenants.scoping import tenant_scope

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("all_tenants_scope")]

run_now = async_to_sync(execute_run)

FACTS = ["Is vegetarian.", "Lives in Lyon.", "Prefers answers in French.", "Has two cats.", "Works as a nurse."]


@pytest.fixture
def endpoint(settings, embedding_server):
    settings.EMBEDDINGS_BASE_URL = embedding_server
    return EmbeddingEndpoint(name="test", base_url=embedding_server)


def _remember(endpoint, *, tenant, user, agent, texts):
    vectors = embed_texts(endpoint, DEFAULT_EMBEDDING_MODEL, texts)
    return [memory_make(tenant=tenant, user=user, agent=agent, text=t, vector=v) for t, v in zip(texts, vectors, strict=True)]


def test_a_run_starts_with_the_users_most_relevant_memories(world, other_world, fake_llm, endpoint, no_enqueue):
    agent = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url])
    agent.system_prompt = "You are the test agent."
    agent.save()
    memory_binding(agent, max_items=2)
    other_agent = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url])
    colleague = get_user_model().objects.create_user(username="colleague", password="pw-colleague-123")
    _remember(endpoint, tenant=world.tenant, user=world.member, agent=agent, texts=FACTS)
    # as relevant to the question, but another user's, another agent's, another tenant's:
    _remember(endpoint, tenant=world.tenant, user=colleague, agent=agent, texts=["Is vegan and cooks every night."])
    _remember(endpoint, tenant=world.tenant, user=world.member, agent=other_agent, texts=["Loves cooking pasta."])
    their_agent = agent_with_route(tenant=other_world.tenant, base_urls=[fake_llm.base_url])
    _remember(endpoint, tenant=other_world.tenant, user=other_world.member, agent=their_agent,
              texts=["Is a vegetarian chef."])

    fake_llm.script(Reply("How about a ratatouille?"))
    run = post_message_sync(agent=agent, user=world.member, content="Can you suggest a vegetarian recipe for dinner?")
    run_now(run.pk)

    run = Run.all_tenants.get(pk=run.pk)
    assert run.status == "completed", run.error
    system = fake_llm.requests[0]["messages"][0]
    assert system["role"] == "system"
    assert system["content"].startswith("You are the test agent.")
    block = system["content"].split(BLOCK_TITLE, 1)[1]
    listed = [line[2:] for line in block.splitlines() if line.startswith("- ")]
    assert len(listed) == 2 and listed[0] == "Is vegetarian."  # the most relevant first, max_items of them
    assert set(listed) <= set(FACTS)
    [stored] = run.context
    assert stored["source"] == "memory" and stored["title"] == BLOCK_TITLE
    # Memories are the model's own notes of what users said (a pasted page could have planted
    # one): data, not instructions, framed like an untrusted tool's result.
    assert stored["untrusted"] is True
    assert block.lstrip().startswith("<untrusted-data") and "</untrusted-data" in block
    ids = stored["data"]["memory_ids"]
    assert list(Memory.all_tenants.filter(pk__in=ids).values_list("user_id", "agent_id").order_by().distinct()) == [
        (world.member.pk, agent.pk)]
    assert Memory.all_tenants.filter(last_used_at__isnull=False).count() == 2


def test_no_block_without_memories_or_with_memory_off(world, fake_llm, endpoint, no_enqueue):
    agent = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url])
    memory_binding(agent)
    fake_llm.script(Reply("Hi."), Reply("Hi again."))
    run = post_message_sync(agent=agent, user=world.member, content="Hello")
    run_now(run.pk)
    assert Run.all_tenants.get(pk=run.pk).context == []
    assert BLOCK_TITLE not in fake_llm.requests[0]["messages"][0]["content"]

    off = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url])
    _remember(endpoint, tenant=world.tenant, user=world.member, agent=off, texts=["Is vegetarian."])
    run = post_message_sync(agent=off, user=world.member, content="Hello")
    run_now(run.pk)
    assert BLOCK_TITLE not in fake_llm.requests[1]["messages"][0]["content"]


def test_an_evaluation_run_recalls_no_memories(world, fake_llm, endpoint, no_enqueue):
    """An experiment measures the agent's configuration: its results must not depend on the
    memories of the admin who started it."""
    agent = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url])
    memory_binding(agent)
    _remember(endpoint, tenant=world.tenant, user=world.member, agent=agent, texts=FACTS)
    fake_llm.script(Reply("Ratatouille."), Reply("Ratatouille."))
    chat = post_message_sync(agent=agent, user=world.member, content="A vegetarian recipe for dinner?")
    run_now(chat.pk)
    assert BLOCK_TITLE in fake_llm.requests[0]["messages"][0]["content"]  # the same question in a chat: recalled
    item = post_message_sync(agent=agent, user=world.member, content="A vegetarian recipe for dinner?")
    Run.all_tenants.filter(pk=item.pk).update(purpose="evaluation")
    run_now(item.pk)
    assert Run.all_tenants.get(pk=item.pk).status == "completed"
    assert BLOCK_TITLE not in fake_llm.requests[1]["messages"][0]["content"]
    assert Run.all_tenants.get(pk=item.pk).context == []


def test_run_context_directly_searches_only_the_given_user(world, endpoint):
    """The hook on its own (the OpenContext the runner passes), without a run."""
    agent = agent_with_route(tenant=world.tenant, base_urls=["http://127.0.0.1:9/v1"])
    colleague = get_user_model().objects.create_user(username="colleague2", password="pw-colleague-123")
    _remember(endpoint, tenant=world.tenant, user=world.member, agent=agent, texts=FACTS)
    _remember(endpoint, tenant=world.tenant, user=colleague, agent=agent, texts=["Is a vegetarian chef."])
    spec = MemoryBindingSpec(agent_id=agent.pk, policy=MemoryPolicy(max_items=3))

    async def ask(user_id):
        import contextlib

        async with contextlib.AsyncExitStack() as stack:
            ctx = OpenContext(tenant_id=world.tenant.pk, run_id=0, tool_timeout_seconds=10, stack=stack,
                              user_id=user_id, agent_id=agent.pk)
            return await MemoryKind().run_context([spec], ctx, "What should I cook tonight? No meat please.")

    with tenant_scope(world.tenant.pk):
        [block] = async_to_sync(ask)(world.member.pk)
        assert [line for line in block.text.splitlines() if line.startswith("- ")][0] == "- Is vegetarian."
        assert len(block.data["memory_ids"]) == 3 and "chef" not in block.text
        [theirs] = async_to_sync(ask)(colleague.pk)
        assert theirs.text.endswith("- Is a vegetarian chef.")
        assert async_to_sync(ask)(None) == []  # no user (and no run spec to take one from): no block
