"""Which sessions the beat extracts, retention, and the vector search behind recall (hand-made
unit vectors: the ordering is known exactly)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from agents.tests.factories import AgentFactory
from memory.models import Memory, MemoryExtraction
from memory.selectors import sessions_due_for_extraction
from memory.services import memories_expire, memory_recall
from memory.tests.factories import memory_binding, memory_make, unit_vector
from sessions.models import ChatSession, Message, Run
from tenants.scoping import system_scope, tenant_scope

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("all_tenants_scope")]


def _session_with_messages(tenant, agent, user, *, minutes_ago: float, count: int = 2) -> tuple[ChatSession, list]:
    session = ChatSession.all_tenants.create(tenant=tenant, agent=agent, user=user)
    run = Run.all_tenants.create(tenant=tenant, session=session, user=user, input="hi", status="completed")
    rows = [Message.all_tenants.create(tenant=tenant, session=session, run=run, position=i,
                                       role="user" if i % 2 == 0 else "assistant", content=f"message {i}")
            for i in range(count)]
    Message.all_tenants.filter(session=session).update(created_at=timezone.now() - timedelta(minutes=minutes_ago))
    return session, rows


# --- the beat's scan -------------------------------------------------------------------------------


def test_due_sessions_are_idle_ones_with_new_messages_of_agents_with_memory(world, other_world):
    now = timezone.now()
    agent = AgentFactory(tenant=world.tenant)
    memory_binding(agent, extract_after_idle_minutes=30)
    quick = AgentFactory(tenant=other_world.tenant)
    memory_binding(quick, extract_after_idle_minutes=5)
    off = AgentFactory(tenant=world.tenant)  # no memory binding

    idle, rows = _session_with_messages(world.tenant, agent, world.member, minutes_ago=45)
    busy, _ = _session_with_messages(world.tenant, agent, world.member, minutes_ago=10)
    other_idle, _ = _session_with_messages(other_world.tenant, quick, other_world.member, minutes_ago=10)
    _session_with_messages(world.tenant, off, world.member, minutes_ago=600)
    deleted, _ = _session_with_messages(world.tenant, agent, world.member, minutes_ago=600)
    ChatSession.all_tenants.filter(pk=deleted.pk).update(deleted_at=now)
    ChatSession.all_tenants.create(tenant=world.tenant, agent=agent, user=world.member)  # no messages

    with system_scope():
        due = sessions_due_for_extraction(now=now)
    assert sorted(due) == sorted([(idle.pk, world.tenant.pk), (other_idle.pk, other_world.tenant.pk)])

    # extracted up to its last message: not due again until a new message arrives
    MemoryExtraction.all_tenants.create(tenant=world.tenant, session=idle, last_message_id=rows[-1].pk)
    with system_scope():
        assert (idle.pk, world.tenant.pk) not in sessions_due_for_extraction(now=now)
    run = Run.all_tenants.filter(session=idle).first()
    new = Message.all_tenants.create(tenant=world.tenant, session=idle, run=run, position=5, role="user",
                                     content="one more")
    Message.all_tenants.filter(pk=new.pk).update(created_at=now - timedelta(minutes=40))
    with system_scope():
        assert (idle.pk, world.tenant.pk) in sessions_due_for_extraction(now=now)

    # a failure asked to wait; a running extraction holds it
    MemoryExtraction.all_tenants.filter(session=idle).update(retry_after=now + timedelta(minutes=5))
    with system_scope():
        assert (idle.pk, world.tenant.pk) not in sessions_due_for_extraction(now=now)
    MemoryExtraction.all_tenants.filter(session=idle).update(retry_after=None, lease_until=now + timedelta(minutes=5))
    with system_scope():
        assert (idle.pk, world.tenant.pk) not in sessions_due_for_extraction(now=now)
    assert busy.pk not in [s for s, _ in due]


def test_an_evaluation_experiments_sessions_are_never_extracted(world):
    """An experiment's items are its admin's runs in sessions of their own: the questions of a
    dataset are not what the admin said, so nothing of them becomes the admin's memory."""
    agent = AgentFactory(tenant=world.tenant)
    memory_binding(agent, extract_after_idle_minutes=30)
    chat, _ = _session_with_messages(world.tenant, agent, world.admin, minutes_ago=45)
    experiment_item, _ = _session_with_messages(world.tenant, agent, world.admin, minutes_ago=45)
    Run.all_tenants.filter(session=experiment_item).update(purpose="evaluation")
    with system_scope():
        assert sessions_due_for_extraction(now=timezone.now()) == [(chat.pk, world.tenant.pk)]


def test_a_disabled_binding_or_inactive_agent_means_no_extraction(world):
    agent = AgentFactory(tenant=world.tenant)
    binding = memory_binding(agent)
    _session_with_messages(world.tenant, agent, world.member, minutes_ago=600)
    binding.enabled = False
    binding.save()
    with system_scope():
        assert sessions_due_for_extraction(now=timezone.now()) == []
    binding.enabled = True
    binding.save()
    agent.is_active = False
    agent.save()
    with system_scope():
        assert sessions_due_for_extraction(now=timezone.now()) == []


def test_extract_due_task_sends_one_task_per_due_session(world, monkeypatch):
    from memory import tasks

    agent = AgentFactory(tenant=world.tenant)
    memory_binding(agent, extract_after_idle_minutes=1)
    session, _ = _session_with_messages(world.tenant, agent, world.member, minutes_ago=2)
    sent = []
    monkeypatch.setattr(tasks.memory_extract_session, "delay", lambda *args: sent.append(args))
    assert tasks.memory_extract_due() == 1
    assert sent == [(session.pk, world.tenant.pk)]


# --- retention -------------------------------------------------------------------------------------


def test_retention_deletes_memories_not_updated_for_the_agents_retention_days(world, other_world):
    now = timezone.now()
    short = AgentFactory(tenant=world.tenant)
    memory_binding(short, retention_days=30)
    off = AgentFactory(tenant=other_world.tenant)  # memory off: the default 365 days
    old = memory_make(tenant=world.tenant, user=world.member, agent=short, text="Old.")
    recent = memory_make(tenant=world.tenant, user=world.member, agent=short, text="Recent.")
    off_old = memory_make(tenant=other_world.tenant, user=other_world.member, agent=off, text="Off, very old.")
    off_kept = memory_make(tenant=other_world.tenant, user=other_world.member, agent=off, text="Off, 200 days.")
    for memory, days in ((old, 31), (recent, 29), (off_old, 366), (off_kept, 200)):
        Memory.all_tenants.filter(pk=memory.pk).update(updated_at=now - timedelta(days=days))
    with system_scope():
        assert memories_expire(now=now) == 2
    assert set(Memory.all_tenants.values_list("text", flat=True)) == {"Recent.", "Off, 200 days."}


def test_retention_task_runs_in_system_scope(world):
    from memory.tasks import memories_expire as expire_task

    agent = AgentFactory(tenant=world.tenant)
    memory_binding(agent, retention_days=1)
    m = memory_make(tenant=world.tenant, user=world.member, agent=agent, text="Stale.")
    Memory.all_tenants.filter(pk=m.pk).update(updated_at=timezone.now() - timedelta(days=2))
    assert expire_task() == 1


# --- vector search behind recall -------------------------------------------------------------------


def test_recall_returns_only_this_users_and_agents_memories_most_similar_first(world, other_world):
    from django.contrib.auth import get_user_model

    agent = AgentFactory(tenant=world.tenant)
    other_agent = AgentFactory(tenant=world.tenant)
    colleague = get_user_model().objects.create_user(username="colleague", password="pw-colleague-123")
    q = unit_vector((0, 1.0))
    best = memory_make(tenant=world.tenant, user=world.member, agent=agent, text="Best.", vector=unit_vector((0, 1.0), (1, 0.1)))
    second = memory_make(tenant=world.tenant, user=world.member, agent=agent, text="Second.", vector=unit_vector((0, 1.0), (1, 1.0)))
    memory_make(tenant=world.tenant, user=world.member, agent=agent, text="Far.", vector=unit_vector((1, 1.0)))
    # closer to the query than any of the user's own, but not theirs to recall:
    memory_make(tenant=world.tenant, user=colleague, agent=agent, text="Colleague's.", vector=q)
    memory_make(tenant=world.tenant, user=world.member, agent=other_agent, text="Other agent's.", vector=q)
    their_agent = AgentFactory(tenant=other_world.tenant)
    memory_make(tenant=other_world.tenant, user=other_world.member, agent=their_agent, text="Other tenant's.", vector=q)
    # another embedding model's vector is never compared
    memory_make(tenant=world.tenant, user=world.member, agent=agent, text="Other model's.", vector=q, model="other")

    with tenant_scope(world.tenant.pk):
        got = memory_recall(user_id=world.member.pk, agent_id=agent.pk, embedding=q,
                            embedding_model="all-minilm-l6-v2", limit=2)
    assert [m.pk for m in got] == [best.pk, second.pk]
    used = dict(Memory.all_tenants.filter(last_used_at__isnull=False).values_list("text", "last_used_at"))
    assert set(used) == {"Best.", "Second."}


def test_recall_query_uses_the_owner_index(world):
    """The search is an exact scan of one user's memories, which the (tenant, user, agent,
    dimensions) index can find without reading the table (sequential scans are switched off
    here: with 50 rows the planner would rightly read the table)."""
    agent = AgentFactory(tenant=world.tenant)
    for i in range(50):
        memory_make(tenant=world.tenant, user=world.member, agent=agent, text=f"Fact {i}.",
                    vector=unit_vector((i % 384, 1.0), (0, 0.1)))
    from memory.selectors import memory_similar

    with tenant_scope(world.tenant.pk), connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        from django.test.utils import CaptureQueriesContext

        with CaptureQueriesContext(connection) as ctx:
            memory_similar(user_id=world.member.pk, agent_id=agent.pk, embedding=unit_vector((0, 1.0)),
                           embedding_model="all-minilm-l6-v2", limit=5)
        qs_sql = next(q["sql"] for q in ctx.captured_queries if "memory_memory" in q["sql"])
        cursor.execute("EXPLAIN " + qs_sql)
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "memory_owner_idx" in plan, plan
