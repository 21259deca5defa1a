"""PostgreSQL row-level security (tenants/rls.py): the database holds every statement to the
tenant scope in context, whatever the ORM did or did not filter."""

from __future__ import annotations

import asyncio

import pytest
from django.db import DatabaseError, connection, transaction

from agents.models import AgentInstance
from agents.tests.factories import AgentFactory
from sessions.models import ChatSession, Run
from tenants import rls
from tenants.scoping import TenantOwnedModel, outside_scope, system_scope, tenant_scope, tenants_scope

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("all_tenants_scope")]


def _count_raw(table: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute(f'SELECT count(*) FROM "{table}"')
        return cursor.fetchone()[0]


def _agents(world, other_world):
    return (AgentFactory(tenant=world.tenant, name=f"agent of {world.tenant.slug}"),
            AgentFactory(tenant=other_world.tenant, name=f"agent of {other_world.tenant.slug}"))


def test_every_tenant_owned_table_has_the_policy():
    from django.apps import apps

    from tenants.models import Tenant

    tables = {m._meta.db_table for m in apps.get_models() if issubclass(m, TenantOwnedModel)}
    assert len(tables) >= 20
    tables.add(Tenant._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = current_schema() AND c.relrowsecurity AND EXISTS "
            "(SELECT 1 FROM pg_policies p WHERE p.tablename = c.relname AND p.policyname = %s)",
            [rls.POLICY_NAME],
        )
        protected = {row[0] for row in cursor.fetchall()}
    assert tables <= protected, sorted(tables - protected)


def test_statements_run_as_a_role_held_to_row_level_security():
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_user, session_user, r.rolsuper, r.rolbypassrls "
                       "FROM pg_roles r WHERE r.rolname = session_user")
        current, session, superuser, bypass = cursor.fetchone()
    assert current == session == rls.app_role()  # logged in as the role itself
    assert not superuser and not bypass


def test_owner_mode_runs_as_the_owner_and_the_role_comes_back_after():
    with rls.owner_mode():
        with connection.cursor() as cursor:
            cursor.execute("SELECT current_user = session_user, session_user")
            same, owner = cursor.fetchone()
            assert same is True and owner == connection.settings_dict["OWNER"]["USER"] != rls.app_role()
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_user, session_user")
        assert cursor.fetchone() == (rls.app_role(), rls.app_role())


def test_raw_sql_sees_only_the_tenant_in_scope(world, other_world):
    _agents(world, other_world)
    with tenant_scope(world.tenant.pk):
        assert _count_raw(AgentInstance._meta.db_table) == 1
    with tenant_scope(other_world.tenant.pk):
        assert _count_raw(AgentInstance._meta.db_table) == 1
    with tenants_scope([world.tenant.pk, other_world.tenant.pk]):
        assert _count_raw(AgentInstance._meta.db_table) == 2
    with system_scope():
        assert _count_raw(AgentInstance._meta.db_table) == 2


def test_outside_any_scope_no_tenant_owned_row_is_visible(world, other_world):
    from tenants.models import Tenant

    _agents(world, other_world)
    with outside_scope():
        assert Tenant.objects.count() == 0
        assert AgentInstance.all_tenants.count() == 0
        assert _count_raw(AgentInstance._meta.db_table) == 0
        with tenants_scope([]):
            assert AgentInstance.all_tenants.count() == 0


def test_the_orms_unfiltered_paths_are_held_too(world, other_world):
    """Forward relations (the base manager) and ``all_tenants`` are not filtered by the scoped
    managers; the database filters them."""
    from tenants.models import Tenant

    mine, theirs = _agents(world, other_world)
    theirs = AgentInstance.all_tenants.get(pk=theirs.pk)  # no tenant cached on it
    session = ChatSession.all_tenants.create(tenant=other_world.tenant, agent=theirs, user=other_world.member)
    run = Run.all_tenants.create(tenant=other_world.tenant, session=session, user=other_world.member, input="x")
    with tenant_scope(world.tenant.pk):
        assert list(AgentInstance.all_tenants.all()) == [mine]
        assert [t.pk for t in Tenant.objects.all()] == [world.tenant.pk]
        with pytest.raises(Tenant.DoesNotExist):
            theirs.tenant  # noqa: B018  (a forward relation to the other tenant's row)
        run_seen_elsewhere = Run.all_tenants.filter(pk=run.pk).first()
        assert run_seen_elsewhere is None
        with pytest.raises(ChatSession.DoesNotExist):
            Run(pk=run.pk, session_id=session.pk, tenant_id=other_world.tenant.pk).session  # noqa: B018


def test_writes_into_another_tenant_are_refused(world, other_world):
    mine, theirs = _agents(world, other_world)
    with tenant_scope(world.tenant.pk):
        assert AgentInstance.all_tenants.filter(pk=theirs.pk).update(name="taken over") == 0
        assert AgentInstance.all_tenants.filter(pk=theirs.pk).delete()[0] == 0
        with pytest.raises(DatabaseError, match="row-level security"), transaction.atomic():
            AgentFactory(tenant=other_world.tenant)
        with pytest.raises(DatabaseError, match="row-level security"), transaction.atomic():
            AgentInstance.all_tenants.filter(pk=mine.pk).update(tenant_id=other_world.tenant.pk)
    theirs.refresh_from_db()
    assert theirs.name != "taken over"


def test_a_rollback_that_undoes_the_scope_is_noticed(world, other_world):
    """``set_config`` in a transaction is undone by its rollback; the backend must then set the
    scope again instead of trusting what it remembers (else the next statement would run in
    the scope from before the transaction)."""
    _agents(world, other_world)
    table = AgentInstance._meta.db_table
    with tenant_scope(world.tenant.pk):
        assert _count_raw(table) == 1  # the connection's scope: the first tenant (outside a transaction)
    with pytest.raises(ZeroDivisionError):
        with transaction.atomic(), tenant_scope(other_world.tenant.pk):
            assert _count_raw(table) == 1  # set inside the transaction…
            1 / 0  # noqa: B018 - …and undone by its rollback
    with tenant_scope(other_world.tenant.pk):
        with connection.cursor() as cursor:
            cursor.execute(f'SELECT DISTINCT tenant_id FROM "{table}"')
            assert [row[0] for row in cursor.fetchall()] == [other_world.tenant.pk]
    with transaction.atomic():
        with tenant_scope(world.tenant.pk):
            sid = transaction.savepoint()
            with tenant_scope(other_world.tenant.pk):
                assert _count_raw(table) == 1
            transaction.savepoint_rollback(sid)
        with tenant_scope(other_world.tenant.pk):
            with connection.cursor() as cursor:
                cursor.execute(f'SELECT DISTINCT tenant_id FROM "{table}"')
                assert [row[0] for row in cursor.fetchall()] == [other_world.tenant.pk]


def test_the_run_hosts_connections_follow_the_scope(world, other_world):
    from sessions.runner.pg import LoopPool, connection_kwargs

    _agents(world, other_world)
    table = AgentInstance._meta.db_table

    async def main() -> list[tuple[str, list[int]]]:
        pool = LoopPool(size=1, timeout_seconds=5, connect_kwargs=connection_kwargs())
        seen = []
        try:
            for scope in (tenant_scope(world.tenant.pk), tenant_scope(other_world.tenant.pk), outside_scope(),
                          system_scope()):
                with scope:
                    async with pool.connection() as conn:  # one connection, lent four times
                        user = (await (await conn.execute("SELECT current_user")).fetchone())[0]
                        cursor = await conn.execute(f'SELECT tenant_id FROM "{table}" ORDER BY tenant_id')
                        seen.append((user, [row[0] for row in await cursor.fetchall()]))
        finally:
            await pool.aclose()
        return seen

    seen = asyncio.run(main())
    assert {user for user, _ in seen} == {rls.app_role()}
    assert [tenants for _, tenants in seen] == [
        [world.tenant.pk], [other_world.tenant.pk], [], sorted([world.tenant.pk, other_world.tenant.pk])
    ]


def test_lookups_that_decide_the_tenant_work_outside_any_scope(world, no_scope):
    from tenants.selectors import admin_tenant_ids, api_token_authenticate, membership_for_user

    token = api_token_authenticate(raw=world.member_token)
    assert token is not None and token.membership.tenant_id == world.tenant.pk
    membership = membership_for_user(user=world.member)
    assert membership is not None and membership.tenant_id == world.tenant.pk
    assert admin_tenant_ids(user=world.admin) == [world.tenant.pk]


def test_the_sweeper_sees_every_tenants_runs_outside_any_scope(world, other_world, no_scope, no_enqueue):
    from datetime import timedelta

    from django.utils import timezone

    from sessions.models import RunStatus
    from sessions.services import runs_sweep

    long_ago = timezone.now() - timedelta(hours=1)
    with system_scope():
        for w in (world, other_world):
            agent = AgentFactory(tenant=w.tenant)
            session = ChatSession.all_tenants.create(tenant=w.tenant, agent=agent, user=w.member)
            Run.all_tenants.create(tenant=w.tenant, session=session, user=w.member, input="x",
                                   status=RunStatus.RUNNING, started_at=long_ago, heartbeat_at=long_ago)
    counts = runs_sweep()
    assert counts["resumed"] == 2


def test_api_requests_reach_the_database_in_their_callers_tenant(world, other_world):
    """A request starts in no scope (as in production); the API view's scope must be the one
    the database applies, or the caller would see nothing."""
    mine, theirs = _agents(world, other_world)
    with outside_scope():
        response = world.client().get("/api/v1/agents/")
    assert response.status_code == 200, response.content
    assert [a["name"] for a in response.json()["results"]] == [mine.name]


def test_the_console_sees_the_rows_of_its_users_tenants(world, other_world, client):
    from django.contrib.auth import get_user_model

    mine, theirs = _agents(world, other_world)
    client.force_login(world.admin)  # a tenant admin (staff, not superuser)
    with outside_scope():
        page = client.get("/admin/agents/agentinstance/").content.decode()
    assert mine.name in page and theirs.name not in page
    root = get_user_model().objects.create_superuser(username="root", password="pw-root-123")
    client.force_login(root)
    with outside_scope():
        page = client.get("/admin/agents/agentinstance/").content.decode()
    assert mine.name in page and theirs.name in page


def test_migrate_grants_a_new_table_to_the_role():
    from django.core.management import call_command

    with rls.owner_mode(), connection.cursor() as cursor:
        cursor.execute("CREATE TABLE rls_probe_plain (id int)")
    try:
        call_command("migrate", verbosity=0)
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM rls_probe_plain")  # the role may read it
            assert cursor.fetchone()[0] == 0
    finally:
        with rls.owner_mode(), connection.cursor() as cursor:
            cursor.execute("DROP TABLE rls_probe_plain")


def test_migrate_puts_back_a_missing_policy():
    from django.core.management import call_command

    table = AgentInstance._meta.db_table
    with rls.owner_mode(), connection.cursor() as cursor:
        cursor.execute(f'ALTER TABLE "{table}" DISABLE ROW LEVEL SECURITY')
        cursor.execute(f'DROP POLICY "{rls.POLICY_NAME}" ON "{table}"')
    call_command("migrate", verbosity=0)
    test_every_tenant_owned_table_has_the_policy()
