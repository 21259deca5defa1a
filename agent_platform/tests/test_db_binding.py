"""Django's database connections bind parameters server-side and prepare frequent statements
(``DB_SERVER_SIDE_BINDING``, agent_platform/settings.py); ``0`` restores Django's default."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.db import connection

from tenants.models import Tenant

pytestmark = pytest.mark.usefixtures("all_tenants_scope")

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.django_db
def test_an_orm_query_run_often_is_prepared_with_its_values_bound_server_side(world) -> None:
    for _ in range(6):  # psycopg prepares from the 5th run on a connection (prepare_threshold)
        assert Tenant.objects.filter(pk=world.tenant.pk, slug=world.tenant.slug).exists()
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements WHERE statement LIKE %s", ['%"tenants_tenant"%'])
        statements = [row[0] for row in cursor.fetchall()]
    assert statements, "the query was not prepared"
    assert any("$1" in s and world.tenant.slug not in s for s in statements), statements


def _options_in_a_child(value: str) -> str:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "agent_platform.settings", "DB_SERVER_SIDE_BINDING": value}
    probe = ("from django.conf import settings; o = settings.DATABASES['default']['OPTIONS']; "
             "print(o.get('server_side_binding'), o.get('prepare_threshold'))")
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_the_setting_turns_binding_and_preparing_off() -> None:
    assert _options_in_a_child("1") == "True 5"
    assert _options_in_a_child("0") == "None None"
