"""The audit log is append-only in the database, not by convention (issue 34).

The fault: the application's database role (``agent_platform_app``) could ``UPDATE`` and
``DELETE`` audit rows, so SQL run through the application's connection (a tenant admin's
compromised session, an injection) could rewrite or erase its own history. Now the role is
granted ``SELECT, INSERT`` only on the table (tenants/rls.py) and a trigger refuses both to
every role but the table's owner (tenants migration 0004).
"""

from __future__ import annotations

import psycopg
import pytest
from django.contrib.auth import get_user_model
from django.db import DatabaseError, connection, transaction

from tenants import rls
from tenants.audit import audit_record
from tenants.models import AuditEvent
from tenants.scoping import system_scope, tenant_scope

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("all_tenants_scope")]


def _event(world) -> AuditEvent:
    return audit_record(action="create", tenant_id=world.tenant.pk, actor=world.admin, source="console",
                        detail={"what": "the original"})


def _unchanged(event: AuditEvent) -> bool:
    with system_scope():
        return AuditEvent.all_tenants.filter(pk=event.pk, action=event.action, detail=event.detail,
                                             actor_id=event.actor_id).exists()


def test_the_applications_connection_cannot_rewrite_or_erase_an_event(world):
    event = _event(world)
    attempts = [
        ("UPDATE tenants_auditevent SET detail = '{}'::jsonb, action = 'nothing' WHERE id = %s", [event.pk]),
        ("UPDATE tenants_auditevent SET actor_id = NULL, actor_repr = '' WHERE id = %s", [event.pk]),
        ("DELETE FROM tenants_auditevent WHERE id = %s", [event.pk]),
        ("TRUNCATE tenants_auditevent", []),
    ]
    with tenant_scope(world.tenant.pk):  # the tenant admin's session, running SQL of its choice
        for statement, params in attempts:
            with pytest.raises(DatabaseError, match="permission denied|append-only"), transaction.atomic():
                with connection.cursor() as cursor:
                    cursor.execute(statement, params)
        for orm_write in (lambda: AuditEvent.objects.filter(pk=event.pk).update(action="nothing"),
                          lambda: AuditEvent.objects.filter(pk=event.pk).delete()):
            with pytest.raises(DatabaseError), transaction.atomic():
                orm_write()
    assert _unchanged(event)


def test_a_second_login_with_the_applications_credentials_claiming_every_tenant_is_refused_too(world):
    event = _event(world)
    params = connection.get_connection_params()
    keys = ("dbname", "user", "password", "host", "port")
    with psycopg.connect(**{k: params[k] for k in keys if params.get(k)}, autocommit=True) as intruder:
        intruder.execute("SELECT set_config('app.all_tenants', 'on', false)")
        assert intruder.execute("SELECT count(*) FROM tenants_auditevent WHERE id = %s", [event.pk]).fetchone()[0] == 1
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            intruder.execute("UPDATE tenants_auditevent SET action = 'nothing' WHERE id = %s", [event.pk])
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            intruder.execute("DELETE FROM tenants_auditevent WHERE id = %s", [event.pk])
    assert _unchanged(event)


def test_the_trigger_refuses_even_a_role_granted_update_and_delete(world):
    """Defence in depth: should a grant come back (an operator's GRANT ALL), the trigger still
    refuses every role but the table's owner."""
    event = _event(world)
    role = rls.app_role()
    with rls.owner_mode(), connection.cursor() as cursor:
        cursor.execute(f'GRANT UPDATE, DELETE ON tenants_auditevent TO "{role}"')
    try:
        with tenant_scope(world.tenant.pk):
            for statement in ("UPDATE tenants_auditevent SET action = 'nothing' WHERE id = %s",
                              "DELETE FROM tenants_auditevent WHERE id = %s"):
                with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
                    with connection.cursor() as cursor:
                        cursor.execute(statement, [event.pk])
    finally:
        with rls.owner_mode(), connection.cursor() as cursor:
            cursor.execute(f'REVOKE UPDATE, DELETE ON tenants_auditevent FROM "{role}"')
    assert _unchanged(event)


def test_the_owner_may_still_delete_events(world):
    """A retention job or a manual fix runs as the table's owner (as migrations do)."""
    event = _event(world)
    with rls.owner_mode(), connection.cursor() as cursor:
        cursor.execute("DELETE FROM tenants_auditevent WHERE id = %s", [event.pk])
        assert cursor.rowcount == 1


def test_deleting_the_actor_leaves_the_event_as_it_was(world):
    """Deleting a user must not rewrite the events it made (before: its actor was set to null)."""
    user = get_user_model().objects.create_user(username="short-lived-admin", password="pw-x-1")
    user_id = user.pk
    event = audit_record(action="create", tenant_id=world.tenant.pk, actor=user, source="console")
    with system_scope():
        user.delete()
        kept = AuditEvent.all_tenants.get(pk=event.pk)
    assert (kept.actor_id, kept.actor_repr) == (user_id, "short-lived-admin")


def test_apply_keeps_the_role_off_the_audit_table_and_is_idempotent():
    role = rls.app_role()
    with rls.owner_mode():
        rls.apply(connection)
        assert rls.apply(connection) == []
    with connection.cursor() as cursor:
        cursor.execute("SELECT has_table_privilege(%s, 'tenants_auditevent', 'SELECT'), "
                       "has_table_privilege(%s, 'tenants_auditevent', 'INSERT'), "
                       "has_table_privilege(%s, 'tenants_auditevent', 'UPDATE'), "
                       "has_table_privilege(%s, 'tenants_auditevent', 'DELETE'), "
                       "has_table_privilege(%s, 'tenants_membership', 'DELETE')", [role] * 5)
        assert cursor.fetchone() == (True, True, False, False, True)
