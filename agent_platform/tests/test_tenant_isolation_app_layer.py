"""The cross-tenant matrix once more, with row-level security out of the way (issue 24).

``test_tenant_isolation.py`` calls every endpoint with another tenant's token. Two layers
keep tenants apart there: the application's scoped managers and filters
(:mod:`tenants.scoping`) and PostgreSQL's row-level security (:mod:`tenants.rls`). With both
on, a leak in the application layer (a view that reads ``Model.all_tenants``) is hidden by the
database and the matrix passes. Here the database is told that every statement may see every
tenant (``app.all_tenants = on``, as for the sweeper) while the application keeps its own
scope, so only the application layer protects, and each of its leaks fails a test.

The tests are the matrix's own (imported, so one list of endpoints serves both runs); the
row-level layer on its own is tested in ``tenants/tests``.
"""

from __future__ import annotations

import pytest
from django.db import connection

from agent_platform.tests.test_tenant_isolation import *  # noqa: F403 (the matrix, collected again here)
from agent_platform.tests.test_tenant_isolation import theirs  # noqa: F401 (fixture)
from sessions.models import Run
from tenants import rls
from tenants.scoping import tenant_scope


@pytest.fixture(autouse=True)
def rls_out_of_the_way(monkeypatch):
    """Every statement of this process runs with ``app.all_tenants = on`` (same role, same
    login): the database shows and lets write every tenant's rows, whatever the scope in
    context. The application's scope (the ContextVar, the scoped managers) is untouched."""
    real_wanted_state = rls.wanted_state

    def every_tenant() -> tuple[str, str, str]:
        role, _tenant_ids, _all = real_wanted_state()
        return role, "", "on"

    monkeypatch.setattr(rls, "wanted_state", every_tenant)
    yield


pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("all_tenants_scope")]

test_row_level_security_hides_every_row_of_theirs = None
"""Not collected here: that test is of the database layer, which this module opens (its
inverse, the premise below, runs instead)."""


def test_the_database_layer_is_really_out_of_the_way(world, theirs):  # noqa: F811
    """The premise of this module: in one tenant's scope, the application's managers show
    only that tenant's rows while plain SQL (what row-level security would have filtered)
    sees the other tenant's too, in every table of the matrix."""
    with tenant_scope(world.tenant.pk):
        assert not Run.objects.filter(pk=theirs["run"].pk).exists()
        with connection.cursor() as cursor:
            for name, obj in theirs.items():
                cursor.execute(f'SELECT COUNT(*) FROM "{type(obj)._meta.db_table}" WHERE "id" = %s', [obj.pk])
                assert cursor.fetchone()[0] == 1, name
