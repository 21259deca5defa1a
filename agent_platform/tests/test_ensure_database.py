"""scripts/ensure_database.py (run by bootstrap): the application's login role is created as a
LOGIN role with the install's password and no privilege of its own, and an existing role is
brought back to exactly that."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import psycopg
import pytest
from django.db import connection

from tenants import rls

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("all_tenants_scope")]


def _owner_params() -> dict:
    with rls.owner_mode():
        params = connection.get_connection_params()
    return {k: params[k] for k in ("dbname", "user", "password", "host", "port") if params.get(k)}


def _role(owner: psycopg.Connection, name: str) -> tuple | None:
    return owner.execute(
        "SELECT rolcanlogin, rolsuper, rolbypassrls, rolcreatedb, rolcreaterole, rolreplication "
        "FROM pg_roles WHERE rolname = %s", [name]).fetchone()


def test_the_login_role_is_created_unprivileged_with_the_installs_password_and_repaired():
    owner_params = _owner_params()
    role, password = f"hb_probe_{uuid.uuid4().hex[:8]}", "pw-" + uuid.uuid4().hex
    db = connection.settings_dict
    host, port, name = db["HOST"] or "127.0.0.1", db["PORT"] or 5432, db["NAME"]
    owner_url = f"postgres://{owner_params['user']}" + (f":{owner_params['password']}" if owner_params.get("password") else "")
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("DATABASE_")}, "SECRETS_FILE": "",
           "DATABASE_URL": f"postgres://{role}:{password}@{host}:{port}/{name}",
           "DATABASE_OWNER_URL": f"{owner_url}@{host}:{port}/{name}"}
    run = lambda: subprocess.run([sys.executable, "scripts/ensure_database.py"], cwd=ROOT, env=env,  # noqa: E731
                                 capture_output=True, text=True, timeout=60)
    with psycopg.connect(**owner_params, autocommit=True) as owner:
        try:
            out = run()
            assert out.returncode == 0, out.stderr
            assert _role(owner, role) == (True, False, False, False, False, False)
            hashed = owner.execute("SELECT rolpassword FROM pg_authid WHERE rolname = %s", [role]).fetchone()[0]
            assert hashed and password not in hashed  # stored hashed (scram-sha-256)
            # someone made it privileged: the next bootstrap takes that back
            owner.execute(f'ALTER ROLE "{role}" SUPERUSER BYPASSRLS CREATEDB CREATEROLE')
            out = run()
            assert out.returncode == 0, out.stderr
            assert _role(owner, role) == (True, False, False, False, False, False)
        finally:
            owner.execute(f'DROP ROLE IF EXISTS "{role}"')
