"""The flush between transactional tests (conftest.py ``_flush_by_delete``): one ``DELETE`` per
table instead of Django's ``TRUNCATE`` + ``post_migrate``.

It relies on two facts checked here: the schema has no foreign key that is checked per
statement (so the order of the deletes does not matter), and a flush leaves every table but
content types and permissions empty, the audit log (append-only to the application) included.
"""

from __future__ import annotations

import pytest
from django.db import connection
from django.test import TransactionTestCase

from agents.tests.factories import agent_with_route
from sessions.tests.conftest import post_message_sync
from tenants.audit import audit_record
from tenants.rls import owner_mode

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("all_tenants_scope")]


def _row_counts() -> dict[str, int]:
    with owner_mode(), connection.cursor() as cursor:
        tables = connection.introspection.django_table_names(only_existing=True, include_views=False)
        counts = {}
        for table in tables:
            cursor.execute(f"SELECT count(*) FROM {connection.ops.quote_name(table)}")
            counts[table] = cursor.fetchone()[0]
        return counts


def test_every_foreign_key_is_deferrable():
    with owner_mode(), connection.cursor() as cursor:
        cursor.execute(
            "SELECT conrelid::regclass::text, conname FROM pg_constraint"
            " WHERE contype = 'f' AND NOT condeferrable AND connamespace = 'public'::regnamespace"
        )
        assert cursor.fetchall() == []


def test_the_flush_empties_every_table_but_content_types_and_permissions(world, no_enqueue):
    agent = agent_with_route(tenant=world.tenant, base_urls=["http://127.0.0.1:9/v1"])
    post_message_sync(agent=agent, user=world.member, content="hello")
    audit_record(action="update", obj=agent, actor=world.admin)
    before = _row_counts()
    for table in ("tenants_tenant", "tenants_auditevent", "agent_sessions_run", "agents_agentinstance"):
        assert before[table] > 0, table

    TransactionTestCase._fixture_teardown(TransactionTestCase())

    after = _row_counts()
    assert {table: n for table, n in after.items() if n} == {
        "django_content_type": before["django_content_type"],
        "auth_permission": before["auth_permission"],
    }


def test_the_flush_survives_a_deadlock_with_a_lingering_writer(world, no_enqueue):
    """A worker thread still ending its run when the test ends holds one table and then writes
    another that the flush locked: PostgreSQL picks one of them as the deadlock's victim. The
    flush rolls back and tries again; nothing is left behind."""
    import threading

    from django.db import connections

    agent = agent_with_route(tenant=world.tenant, base_urls=["http://127.0.0.1:9/v1"])
    run = post_message_sync(agent=agent, user=world.member, content="hello")
    holding, done = threading.Event(), threading.Event()

    def lingering_writer() -> None:  # writes a late table first, then an early one
        try:
            with owner_mode(), connections["default"].cursor() as cursor:
                cursor.execute("BEGIN")
                cursor.execute('UPDATE "tenants_tenant" SET "name" = "name" WHERE "id" = %s', [world.tenant.pk])
                holding.set()
                threading.Event().wait(0.5)  # the flush is waiting for tenants_tenant by now
                try:
                    cursor.execute('UPDATE "agent_sessions_run" SET "input" = "input" WHERE "id" = %s', [run.pk])
                    cursor.execute("COMMIT")
                except Exception:
                    cursor.execute("ROLLBACK")
        finally:
            connections["default"].close()
            done.set()

    writer = threading.Thread(target=lingering_writer)
    writer.start()
    assert holding.wait(10)
    TransactionTestCase._fixture_teardown(TransactionTestCase())
    writer.join(10)
    assert done.is_set()
    after = _row_counts()
    assert {table: n for table, n in after.items() if n and table not in ("django_content_type", "auth_permission")} == {}
