"""The application's database login (issue 23, "Keys and credentials"): the application
connects to PostgreSQL as its row-level-security role, a LOGIN role with a password, not as a
superuser; migrations run as the owner.

The attack: code running with the application's database connection (a SQL injection, or a
program that got hold of its credentials) tries to leave the role (``SET ROLE postgres``,
``RESET ROLE``) and read another tenant's provider rows. Before issue 23 the connection logged
in as the ``postgres`` superuser and only *set* the role per statement, so a ``RESET ROLE`` was
enough to read every tenant's rows.
"""

from __future__ import annotations

import asyncio

import psycopg
import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError, connection, transaction

from llm.models import ModelProvider
from tenants import rls
from tenants.scoping import tenant_scope

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("all_tenants_scope")]


def _providers(world, other_world) -> tuple[ModelProvider, ModelProvider]:
    return (ModelProvider.all_tenants.create(tenant=world.tenant, name="mine", base_url="https://api.example.com/v1"),
            ModelProvider.all_tenants.create(tenant=other_world.tenant, name="theirs",
                                             base_url="https://api.example.org/v1", api_key_encrypted="ciphertext"))


def _login(cursor) -> tuple[str, str, bool, bool]:
    cursor.execute("SELECT current_user, session_user, r.rolsuper, r.rolbypassrls FROM pg_roles r "
                   "WHERE r.rolname = session_user")
    return cursor.fetchone()


def test_the_application_logs_in_as_its_role_not_a_superuser():
    assert connection.settings_dict["USER"] == rls.app_role()
    with connection.cursor() as cursor:
        current, session, superuser, bypass = _login(cursor)
        cursor.execute("SELECT rolcanlogin, rolcreaterole, rolcreatedb FROM pg_roles WHERE rolname = session_user")
        can_login, create_role, create_db = cursor.fetchone()
    assert current == session == rls.app_role()
    assert (superuser, bypass, create_role, create_db) == (False, False, False, False)
    assert can_login is True


def test_the_connection_cannot_become_a_superuser(world, other_world):
    mine, theirs = _providers(world, other_world)
    with tenant_scope(world.tenant.pk):
        with pytest.raises(DatabaseError, match="permission denied to set role"), transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute("SET ROLE postgres")
        with pytest.raises(DatabaseError, match="permission denied"), transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute("SELECT set_config('role', 'postgres', false)")
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("RESET ROLE")  # back to the login: still the role, still held to the policies
            current, session, superuser, bypass = _login(cursor)
            assert (current, superuser, bypass) == (rls.app_role(), False, False)
            cursor.execute("SELECT name FROM llm_modelprovider ORDER BY name")
            assert [row[0] for row in cursor.fetchall()] == ["mine"]
            cursor.execute("SELECT count(*) FROM llm_modelprovider WHERE tenant_id = %s", [other_world.tenant.pk])
            assert cursor.fetchone()[0] == 0
            cursor.execute("UPDATE llm_modelprovider SET base_url = 'https://evil.example/v1' WHERE id = %s", [theirs.pk])
            assert cursor.rowcount == 0


def test_the_connection_cannot_switch_row_level_security_off_or_take_the_tables(world, other_world):
    _providers(world, other_world)
    attempts = [
        "ALTER TABLE llm_modelprovider DISABLE ROW LEVEL SECURITY",
        "DROP POLICY tenant_isolation ON llm_modelprovider",
        "ALTER TABLE llm_modelprovider OWNER TO agent_platform_app",
        "SET row_security = off; SELECT count(*) FROM llm_modelprovider",
        "ALTER ROLE agent_platform_app BYPASSRLS",
        "CREATE ROLE intruder SUPERUSER LOGIN",
        "COPY llm_modelprovider TO PROGRAM 'id'",
    ]
    with tenant_scope(world.tenant.pk):
        for statement in attempts:
            with pytest.raises(DatabaseError), transaction.atomic(), connection.cursor() as cursor:
                cursor.execute(statement)


def test_a_second_login_with_the_applications_credentials_is_held_the_same(world, other_world):
    """What a program that read the application's credentials gets: its own session as the
    role, which sees no tenant's rows until it claims a scope (and cannot become postgres)."""
    _providers(world, other_world)
    params = connection.get_connection_params()
    keys = ("dbname", "user", "password", "host", "port")
    with psycopg.connect(**{k: params[k] for k in keys if params.get(k)}, autocommit=True) as intruder:
        assert intruder.execute("SELECT session_user, current_user").fetchone() == (rls.app_role(), rls.app_role())
        assert intruder.execute("SELECT count(*) FROM llm_modelprovider").fetchone()[0] == 0
        assert intruder.execute("SELECT rolsuper FROM pg_roles WHERE rolname = session_user").fetchone()[0] is False
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            intruder.execute("SET ROLE postgres")


def test_migrations_and_flush_run_as_the_owner(world):
    from django.core.management import call_command

    with rls.owner_mode(), connection.cursor() as cursor:
        cursor.execute("SELECT session_user")
        owner = cursor.fetchone()[0]
        cursor.execute("SELECT tableowner FROM pg_tables WHERE tablename = 'llm_modelprovider'")
        assert cursor.fetchone()[0] == owner != rls.app_role()
    call_command("migrate", verbosity=0)  # DDL and grants: refused to the role, done as the owner
    with connection.cursor() as cursor:
        cursor.execute("SELECT session_user")
        assert cursor.fetchone()[0] == rls.app_role()


def test_a_superuser_login_is_refused(world):
    """The settings cannot quietly fall back to a superuser login: a connection that logs in as
    one is refused at its first statement as the application."""
    from django.db import connections

    settings_dict = {**rls.owner_settings(connection.settings_dict)}
    settings_dict.pop("OWNER", None)  # a misconfigured deployment: DATABASE_URL is the superuser
    privileged = connections["default"].__class__(settings_dict, alias="privileged")
    try:
        with pytest.raises(ImproperlyConfigured, match="superuser or bypasses row-level security"):
            with privileged.cursor() as cursor:
                cursor.execute("SELECT 1")
        with pytest.raises(ImproperlyConfigured):  # and at every later statement
            with privileged.cursor() as cursor:
                cursor.execute("SELECT 1")
    finally:
        privileged.close()
    assert "privileged" not in connections


def test_the_run_hosts_pool_logs_in_as_the_role_and_refuses_a_superuser(world):
    from sessions.runner.pg import LoopPool, connection_kwargs

    async def login(kwargs) -> tuple[str, bool]:
        pool = LoopPool(size=1, timeout_seconds=5, connect_kwargs=kwargs)
        try:
            async with pool.connection() as conn:
                row = await (await conn.execute(
                    "SELECT session_user, rolsuper FROM pg_roles WHERE rolname = session_user")).fetchone()
                return row[0], row[1]
        finally:
            await pool.aclose()

    assert asyncio.run(login(connection_kwargs())) == (rls.app_role(), False)
    owner = connection.settings_dict["OWNER"]
    superuser_kwargs = {**connection_kwargs(), "user": owner["USER"], "password": owner.get("PASSWORD") or None}
    with pytest.raises(ImproperlyConfigured):
        asyncio.run(login(superuser_kwargs))


@pytest.mark.parametrize("login", [True, False], ids=["login role", "nologin role"])
def test_a_new_role_is_made_without_privileges_and_the_owner_may_become_it(login):
    """On a fresh database ``rls.apply`` creates the application's role (``_ensure_role``): no
    superuser, no BYPASSRLS, no CREATEDB/CREATEROLE; LOGIN with the configured password only
    for the application's own login user, NOLOGIN otherwise; the owner can switch to it.
    (Mutation testing found the creation untested: the suite's role always exists already.)"""
    import uuid

    from psycopg import sql

    role = f"ap_test_role_{uuid.uuid4().hex[:10]}"
    settings_dict = {"USER": role, "PASSWORD": "pw-fresh-role-1"} if login else {"USER": "somebody_else"}
    with rls.owner_mode(), connection.cursor() as cursor:
        try:
            rls._ensure_role(cursor, role, exists=False, settings_dict=settings_dict)
            cursor.execute("SELECT rolsuper, rolbypassrls, rolcreatedb, rolcreaterole, rolcanlogin, "
                           "rolpassword IS NOT NULL FROM pg_authid WHERE rolname = %s", [role])
            assert cursor.fetchone() == (False, False, False, False, login, login)
            cursor.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(role)).as_string(cursor.connection))
            cursor.execute("SELECT current_user")
            assert cursor.fetchone()[0] == role
            cursor.execute("RESET ROLE")
            rls._ensure_role(cursor, role, exists=True, settings_dict=settings_dict)  # an existing role: kept
        finally:
            cursor.execute("RESET ROLE")
            cursor.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)).as_string(cursor.connection))



def test_an_owner_that_is_not_a_superuser_may_set_the_role_it_creates():
    """A managed PostgreSQL's owner is often no superuser, only CREATEROLE. From PostgreSQL 16
    the creator of a role becomes a member of it WITH ADMIN but SET FALSE, so ``_ensure_role``
    must grant it the role although ``pg_has_role(…, 'MEMBER')`` already says yes; without that
    the owner (or a login that is a member, working as the role) cannot ``SET ROLE``. Run as
    such an owner over a login of its own (``SET ROLE`` is checked against the session user)."""
    import uuid

    from psycopg import sql

    settings_dict = rls.owner_settings(connection.settings_dict)
    suffix = uuid.uuid4().hex[:10]
    owner, role = f"ap_test_owner_{suffix}", f"ap_test_role_{suffix}"
    with rls.owner_mode(), connection.cursor() as admin:
        admin.execute(sql.SQL("CREATE ROLE {} LOGIN CREATEROLE").format(sql.Identifier(owner)).as_string(admin.connection))
        try:
            try:
                login = psycopg.connect(host=settings_dict["HOST"], port=settings_dict["PORT"],
                                        dbname=settings_dict["NAME"], user=owner, autocommit=True)
            except psycopg.OperationalError as exc:  # a server that wants a password for new logins
                pytest.skip(f"cannot log in as a new role here: {exc}")
            with login, login.cursor() as cursor:
                rls._ensure_role(cursor, role, exists=False, settings_dict={"USER": "somebody_else"})
                cursor.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(role)).as_string(login))
                cursor.execute("SELECT current_user")
                assert cursor.fetchone()[0] == role
        finally:
            for name in (role, owner):
                admin.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(name)).as_string(admin.connection))
