"""What a message POST asks of the database: the run start every chat message pays for
(bench/scale_out.py puts 600 of them through two web processes)."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from agents.tests.factories import agent_with_route

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("all_tenants_scope")]


def _message_post_statements(world) -> list[str]:
    """The SQL of one message POST to a new chat, in order."""
    agent = agent_with_route(tenant=world.tenant, base_urls=["http://127.0.0.1:9/v1"])
    client = world.client()
    session = client.post("/api/v1/sessions/", {"agent": agent.pk}, format="json").json()
    with CaptureQueriesContext(connection) as queries:
        posted = client.post(f"/api/v1/sessions/{session['id']}/messages/", {"content": "go"}, format="json")
    assert posted.status_code == 201, posted.content
    return [q["sql"] for q in queries.captured_queries]


def test_a_message_post_reads_the_agent_once(world, no_enqueue) -> None:
    """The session's selector joins its agent; the locked re-read of the session inside the
    transaction reuses it rather than reading the agent again (one query of ten before)."""
    statements = _message_post_statements(world)
    assert not [s for s in statements if 'FROM "agents_agentinstance"' in s], statements
    assert sum('"agents_agentinstance"' in s for s in statements) == 1  # the session selector's join
    assert len(statements) == 9, statements


def test_a_message_posts_lookups_by_key_build_no_ordering(world, no_enqueue) -> None:
    """The token's lookup (by its unique hash) and the session's (by primary key) find one row
    or none: ``get()``, not ``first()``, whose ORDER BY of the model's ordering Django built and
    compiled on every request for nothing (~0.25-0.3 ms of CPU each on a 2-vCPU machine)."""
    lookups = [sql for sql in _message_post_statements(world)
               if sql.startswith("SELECT") and ('"token_hash" =' in sql or 'JOIN "agents_agentinstance"' in sql)]
    assert len(lookups) == 2, lookups
    assert not [sql for sql in lookups if "ORDER BY" in sql], lookups


def test_a_steer_mode_agent_still_marks_a_message_behind_a_running_run(world, no_enqueue) -> None:
    """The reused agent is the one the run is made for: its message mode still decides."""
    from sessions.models import Run, RunStatus

    agent = agent_with_route(tenant=world.tenant, base_urls=["http://127.0.0.1:9/v1"])
    agent.message_mode = "steer"
    agent.save(update_fields=["message_mode"])
    client = world.client()
    session = client.post("/api/v1/sessions/", {"agent": agent.pk}, format="json").json()
    first = client.post(f"/api/v1/sessions/{session['id']}/messages/", {"content": "one"}, format="json").json()["run"]
    Run.all_tenants.filter(pk=first["id"]).update(status=RunStatus.RUNNING)
    second = client.post(f"/api/v1/sessions/{session['id']}/messages/", {"content": "two"}, format="json").json()["run"]
    assert Run.all_tenants.get(pk=second["id"]).steer is True


def _field_values(instance) -> dict:
    return {f.attname: getattr(instance, f.attname) for f in type(instance)._meta.concrete_fields}


def test_the_chat_lookup_is_one_statement_and_makes_what_the_orm_reads(world, other_world, django_assert_num_queries):
    """``chat_session_get_for_user`` runs one hand-written statement (``agent_platform.model_rows``):
    the chat and its agent it makes hold what the ORM's ``select_related`` read holds, column by
    column, and it finds only the caller's own chat, in the tenant in scope, not deleted."""
    from django.utils import timezone

    from sessions.models import ChatSession
    from sessions.selectors import chat_session_get_for_user
    from sessions.services import chat_session_create
    from tenants.context import TenantScopeError
    from tenants.scoping import tenant_scope

    agent = agent_with_route(tenant=world.tenant, base_urls=["http://127.0.0.1:9/v1"])
    with tenant_scope(world.tenant.pk):
        session = chat_session_create(user=world.member, agent=agent)
        with django_assert_num_queries(1):
            found = chat_session_get_for_user(session_id=session.pk, user_id=world.member.pk)
            agent_name = found.agent.name
        orm = ChatSession.objects.select_related("agent").get(pk=session.pk)
        assert _field_values(found) == _field_values(orm) and _field_values(found.agent) == _field_values(orm.agent)
        assert agent_name == agent.name and not found._state.adding
        assert chat_session_get_for_user(session_id=session.pk, user_id=world.admin.pk) is None  # not the caller's
        ChatSession.objects.filter(pk=session.pk).update(deleted_at=timezone.now())
        assert chat_session_get_for_user(session_id=session.pk, user_id=world.member.pk) is None  # deleted
    with tenant_scope(other_world.tenant.pk):
        assert chat_session_get_for_user(session_id=session.pk, user_id=world.member.pk) is None  # another tenant
    with pytest.raises(TenantScopeError):
        chat_session_get_for_user(session_id=session.pk, user_id=world.member.pk)  # no tenant in scope
