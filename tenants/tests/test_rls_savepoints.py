"""A statement that fails inside a nested ``atomic`` block (a savepoint) leaves the outer
transaction usable, as Django promises, also with row-level security's per-statement scope.

The fault (found by issue 34's audit test): the backend forgot the connection's scope before
rolling back to the savepoint, so the ``ROLLBACK TO SAVEPOINT``'s cursor first re-sent the
scope in the aborted transaction, which PostgreSQL refused; Django then marked the whole outer
transaction broken. ``get_or_create``'s recovery from a concurrent insert (an IntegrityError
in a savepoint) and every ``try: with atomic(): … except DatabaseError`` inside a request's
transaction failed that way.
"""

from __future__ import annotations

import pytest
from django.db import DatabaseError, IntegrityError, connection, transaction

from tenants.models import Tenant
from tenants.scoping import system_scope, tenant_scope

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("all_tenants_scope")]


def test_the_outer_transaction_survives_an_error_in_a_savepoint(tenant):
    with tenant_scope(tenant.pk):
        with pytest.raises(DatabaseError), transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SELECT 1/0")
        assert Tenant.objects.filter(pk=tenant.pk).exists()  # the outer transaction goes on
    with system_scope():
        with pytest.raises(IntegrityError), transaction.atomic():
            Tenant.objects.create(slug=tenant.slug, name="a duplicate slug")
        assert Tenant.objects.filter(slug=tenant.slug).count() == 1


def test_a_scope_changed_inside_the_savepoint_is_set_again_after_it(tenant, other_tenant):
    with tenant_scope(tenant.pk), connection.cursor() as cursor:
        with pytest.raises(DatabaseError), transaction.atomic(), system_scope():
            cursor.execute("SELECT count(*) FROM tenants_tenant")
            cursor.execute("SELECT 1/0")
        cursor.execute("SELECT array_agg(id ORDER BY id) FROM tenants_tenant")
        assert cursor.fetchone()[0] == [tenant.pk]
