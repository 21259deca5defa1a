"""PostgreSQL row-level security: the database's own check of the tenant scope (DESIGN §3).

:mod:`tenants.scoping` filters the ORM's querysets by the tenant in context. This module makes
PostgreSQL apply the same context to every statement, so a query that escapes that filter (a
forward relation through the base manager, ``prefetch_related``, raw SQL, a forgotten
``all_tenants``) still sees only the tenant's rows, and cannot write another tenant's.

How:

- **The application logs in as a role without privileges of its own.** ``DATABASE_URL``'s
  user is :func:`app_role` (``DATABASE_APP_ROLE``, default ``agent_platform_app``): ``LOGIN
  NOSUPERUSER NOBYPASSRLS`` with a password (``scripts/ensure_database.py`` creates it with
  ``DATABASE_APP_PASSWORD``), with ``SELECT, INSERT, UPDATE, DELETE`` on the tables and use
  of the sequences, and nothing else. It does not own the tables, so their policies apply to
  it, and it cannot become another role: ``SET ROLE postgres`` is refused, ``RESET ROLE``
  leaves it itself. A connection whose login is a superuser or bypasses row-level security
  is refused at its first statement (:class:`PrivilegedLogin`): the settings cannot quietly
  fall back to a superuser login. Each statement still sets the role (``set_config('role',
  …)``), a no-op for that login; it keeps a login that is a *member* of the role (not the
  role itself) working as the role.
- **One policy per tenant-owned table** (every concrete :class:`~tenants.scoping.
  TenantOwnedModel`, and the tenants table itself by its ``id``), ``tenant_isolation``, for
  reads and writes alike: a row is visible, and may be written, when its ``tenant_id`` is one
  of ``app.tenant_ids`` or when ``app.all_tenants`` is ``on``. Outside any scope both are
  empty: no row (fails closed).
- **The two settings follow the scope of the code that runs the statement.**
  :func:`sync` runs before each statement on a Django connection (the project's database
  backend, ``agent_platform.postgresql``, calls it when a cursor is made) and
  :func:`async_sync` when the run host's pool lends a connection. Each remembers what it set
  on the connection, so a statement costs an extra round trip only when the scope changed
  since that connection's last one: one ``SELECT set_config(…)`` that sets the role and
  both settings. A rollback undoes a ``set_config`` made in its transaction, so the backend
  forgets what it set whenever it rolls back.
- **The audit log is append-only for the application.** The tables of
  :data:`APPEND_ONLY_MODELS` (``tenants_auditevent``) are granted ``SELECT, INSERT`` only:
  :func:`apply` revokes ``UPDATE``, ``DELETE`` and ``TRUNCATE`` on them from the role, and a
  trigger (tenants migration 0004) refuses ``UPDATE`` and ``DELETE`` to every role that is not
  the table's owner (or a superuser), whatever the grants say. So SQL run through the
  application's connection (a compromised tenant admin's session, an injection) cannot rewrite
  or erase history; its foreign keys leave the rows alone when a user or tenant is deleted.
- **Migrations run as the owner** (:func:`owner_mode`, entered by this project's ``migrate``
  and ``flush`` commands; the database backend's connection without a database, which
  creates and drops the test database, logs in as the owner too). The owner's login is
  ``DATABASE_OWNER_URL`` (``settings.DATABASES["default"]["OWNER"]``): the tables stay owned
  by it, and DDL needs it. The application's processes never hold it open. After
  ``migrate``, :func:`apply` makes sure the role, its grants and the policies exist
  (idempotent; run by the ``post_migrate`` signal).

What this does not stop: the scope lives in session settings that any statement on the
application's connection may change (``set_config('app.all_tenants', 'on', false)``), so SQL
injected into the application's own queries could read every tenant's rows. It guards against
the application's mistakes (a query that forgot its filter), not against arbitrary SQL. What
arbitrary SQL on that login cannot do: become a superuser or another role, switch the policies
or row-level security off, change a table, read files or run programs on the database host.

Why not Django 5.2's ``OPTIONS["assume_role"]``: it sets the role once per connection, for
every command, so ``migrate`` and the test runner's database creation would run as a role that
may not create tables, or exist yet. Here the role is one more value :func:`sync` keeps right.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import DEFAULT_DB_ALIAS
from psycopg import sql

from tenants.context import ALL_TENANTS, current_scope

logger = logging.getLogger(__name__)

POLICY_NAME = "tenant_isolation"
SCOPE_SQL = (
    "SELECT set_config('role', %s, false), set_config('app.tenant_ids', %s, false), "
    "set_config('app.all_tenants', %s, false)"
)
"""Sets the role and the scope of a connection in one statement (``set_config('role', …)`` is
``SET ROLE``; ``none`` is the login user)."""
FIRST_SCOPE_SQL = SCOPE_SQL + (
    ", (SELECT rolsuper OR rolbypassrls FROM pg_roles WHERE rolname = session_user)"
)
""":data:`SCOPE_SQL` plus whether the login is privileged: a connection's first statement
as the application (the check costs no round trip of its own)."""


APPEND_ONLY_MODELS = ("tenants.AuditEvent",)
"""Models whose rows the application adds and reads but never changes or deletes."""


class PrivilegedLogin(ImproperlyConfigured):
    """The application's database login is a superuser or bypasses row-level security."""


def policy_expression(column: str = "tenant_id") -> str:
    """True for the rows the connection's scope may see and write, by their tenant ``column``.
    ``current_setting(…, true)`` is NULL for a setting never made on the connection: no row."""
    return (
        "current_setting('app.all_tenants', true) = 'on' OR "
        f"{column} = ANY (coalesce(nullif(current_setting('app.tenant_ids', true), ''), '{{}}')::bigint[])"
    )


_STATE_ATTRIBUTE = "_agent_platform_rls"
_CHECKED_ATTRIBUTE = "_agent_platform_login_checked"
_owner = threading.local()


def app_role() -> str:
    """The role the application's statements run as (``DATABASE_APP_ROLE``)."""
    return settings.DATABASE_APP_ROLE


def _owner_mode_active() -> bool:
    return getattr(_owner, "depth", 0) > 0


def wanted_state() -> tuple[str, str, str]:
    """``(role, app.tenant_ids, app.all_tenants)`` for a statement run now, in this context.

    The role is ``none`` (the login user) inside :func:`owner_mode`, else :func:`app_role`.
    The tenant ids are a PostgreSQL array literal (``{3}``, ``{3,5}``) or empty.
    """
    role = "none" if _owner_mode_active() else app_role()
    scope = current_scope()
    if scope is ALL_TENANTS:
        return role, "", "on"
    if isinstance(scope, int):
        return role, f"{{{scope}}}", "off"
    if isinstance(scope, frozenset):
        return role, "{" + ",".join(str(i) for i in sorted(scope)) + "}", "off"
    return role, "", "off"


def _login_check_due(connection: Any, wanted: tuple[str, str, str]) -> bool:
    return wanted[0] != "none" and not getattr(connection, _CHECKED_ATTRIBUTE, False)


def _refuse_privileged(connection: Any, privileged: bool | None) -> None:
    if privileged is not False:
        raise PrivilegedLogin(
            "the application's database login is a superuser or bypasses row-level security (or does not "
            "exist as a role): set DATABASE_URL to the application role's login (README, \"Database roles\")"
        )
    setattr(connection, _CHECKED_ATTRIBUTE, True)


def sync(connection: Any) -> None:
    """Bring a (sync) psycopg connection's role and scope in line with :func:`wanted_state`.

    The connection's first statement as the application also checks its login.

    Raises:
        PrivilegedLogin: the login is a superuser or bypasses row-level security (outside
            :func:`owner_mode`); raised again at every statement on that connection.
        psycopg.Error: the statement failed (the role does not exist: run ``migrate``).
    """
    wanted = wanted_state()
    if getattr(connection, _STATE_ATTRIBUTE, None) != wanted:
        if _login_check_due(connection, wanted):
            row = connection.execute(FIRST_SCOPE_SQL, wanted).fetchone()
            _refuse_privileged(connection, row[3])
        else:
            connection.execute(SCOPE_SQL, wanted)
        setattr(connection, _STATE_ATTRIBUTE, wanted)


async def async_sync(connection: Any) -> None:
    """:func:`sync` for an :class:`psycopg.AsyncConnection` (the run host's pool)."""
    wanted = wanted_state()
    if getattr(connection, _STATE_ATTRIBUTE, None) != wanted:
        if _login_check_due(connection, wanted):
            row = await (await connection.execute(FIRST_SCOPE_SQL, wanted)).fetchone()
            _refuse_privileged(connection, row[3])
        else:
            await connection.execute(SCOPE_SQL, wanted)
        setattr(connection, _STATE_ATTRIBUTE, wanted)


def forget(connection: Any) -> None:
    """Forget what :func:`sync` set on ``connection`` (a rollback may have undone it); the
    next statement sets it again."""
    if connection is not None:
        with contextlib.suppress(AttributeError):
            delattr(connection, _STATE_ATTRIBUTE)


def owner_settings(settings_dict: dict[str, Any]) -> dict[str, Any]:
    """A copy of a database's Django settings that logs in as its owner: ``USER``,
    ``PASSWORD``, ``HOST`` and ``PORT`` from its ``OWNER`` entry (settings.py:
    ``DATABASE_OWNER_URL``), and no connection pool (the pool belongs to the application's
    login; Django keys pools by alias)."""
    owner = settings_dict.get("OWNER") or {}
    result = {**settings_dict, **{k: owner[k] for k in ("USER", "PASSWORD", "HOST", "PORT") if owner.get(k)}}
    if "PASSWORD" in owner and not owner.get("PASSWORD"):
        result["PASSWORD"] = ""
    result["OPTIONS"] = {k: v for k, v in (settings_dict.get("OPTIONS") or {}).items() if k != "pool"}
    return result


@contextlib.contextmanager
def owner_mode(using: str = DEFAULT_DB_ALIAS) -> Iterator[None]:
    """Run this thread's statements in the body as the owner, not :func:`app_role`: for
    ``migrate`` and ``flush``, whose DDL and ``TRUNCATE`` the role may not run. Nestable.

    In the body, ``django.db.connections[using]`` (and ``django.db.connection`` for the
    default alias) is a connection of its own that logs in as the owner
    (:func:`owner_settings`), opened at its first statement and closed on exit; the
    application's connection is put back then. Code that kept a reference to the
    application's connection still runs as the application. The owner's connection does not
    see what the application's connection has not committed.
    """
    depth = getattr(_owner, "depth", 0)
    if depth:
        _owner.depth = depth + 1
        try:
            yield
        finally:
            _owner.depth -= 1
        return
    from django.db import connections

    app_connection = connections[using]
    owner_connection = app_connection.__class__(owner_settings(app_connection.settings_dict), alias=app_connection.alias)
    connections[using] = owner_connection
    _owner.depth = 1
    try:
        yield
    finally:
        _owner.depth = 0
        connections[using] = app_connection
        owner_connection.close()


def protected_tables() -> dict[str, str]:
    """``{table: tenant column}`` of every table the policy protects: each concrete
    tenant-owned model's (``tenant_id``) and the tenants' own (``id``)."""
    from django.apps import apps

    from tenants.models import Tenant
    from tenants.scoping import TenantOwnedModel

    tables = {
        model._meta.db_table: "tenant_id"
        for model in apps.get_models()
        if issubclass(model, TenantOwnedModel) and not model._meta.proxy and model._meta.managed
    }
    tables[Tenant._meta.db_table] = "id"
    return dict(sorted(tables.items()))


def append_only_tables() -> list[str]:
    """The tables of :data:`APPEND_ONLY_MODELS`."""
    from django.apps import apps

    return sorted(apps.get_model(label)._meta.db_table for label in APPEND_ONLY_MODELS)


def apply(connection: Any) -> list[str]:
    """Make sure the role, its grants and every protected table's policy exist
    (:func:`protected_tables`), and that the role may not change or delete the rows of the
    append-only tables (:func:`append_only_tables`).

    Idempotent and cheap when nothing is missing (three catalogue queries). Every table and
    sequence of the schema is granted, not only the tenant-owned ones. Runs as the owner
    (call it in :func:`owner_mode`), which must be allowed to create the role the first time
    (a superuser, or ``CREATEROLE``), or the role must exist already (``scripts/
    ensure_database.py`` creates it). A role created here can log in (with the application's
    password from the settings) when it is the application's login user.

    Raises:
        PrivilegedLogin: the role exists and is a superuser or bypasses row-level security.

    Args:
        connection: a Django database connection (``django.db.connection``).

    Returns:
        The tables whose policy was created now.
    """
    role = app_role()
    tables = protected_tables()
    append_only = append_only_tables()
    with connection.cursor() as cursor:
        state: dict[str, tuple[bool, bool]] = {}
        role_exists = _role_exists(cursor, role)
        if role_exists:
            _refuse_privileged_role(cursor, role)
            cursor.execute(
                "SELECT c.relname, c.relrowsecurity, EXISTS (SELECT 1 FROM pg_policies p "
                "  WHERE p.schemaname = n.nspname AND p.tablename = c.relname AND p.policyname = %s) "
                "FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE n.nspname = current_schema() AND c.relkind = 'r' AND c.relname = ANY(%s)",
                [POLICY_NAME, list(tables)],
            )
            state = {name: (rls_on, has_policy) for name, rls_on, has_policy in cursor.fetchall()}
            cursor.execute(
                "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE n.nspname = current_schema() AND ("
                "  (c.relkind = 'r' AND c.relname <> ALL(%s) AND NOT has_table_privilege(%s, c.oid, 'DELETE')) "
                "  OR (c.relkind = 'r' AND c.relname = ANY(%s) AND (NOT has_table_privilege(%s, c.oid, 'INSERT') "
                "      OR has_table_privilege(%s, c.oid, 'UPDATE, DELETE, TRUNCATE'))) "
                "  OR (c.relkind = 'S' AND NOT has_sequence_privilege(%s, c.oid, 'UPDATE')))",
                [append_only, role, append_only, role, role, role],
            )
            ungranted = cursor.fetchone()[0]
            if not ungranted and len(state) == len(tables) and all(all(flags) for flags in state.values()):
                return []
        _ensure_role(cursor, role, exists=role_exists, settings_dict=settings.DATABASES.get(connection.alias, {}))

        def run(statement: sql.Composable) -> None:
            cursor.execute(statement.as_string(connection.connection))

        schema = sql.Identifier(_current_schema(cursor))
        role_id = sql.Identifier(role)
        run(sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(schema, role_id))
        run(sql.SQL("GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {} TO {}").format(schema, role_id))
        run(sql.SQL("GRANT USAGE, SELECT, UPDATE ON ALL SEQUENCES IN SCHEMA {} TO {}").format(schema, role_id))
        for table in append_only:  # history is added to, never rewritten (the trigger refuses it too)
            run(sql.SQL("REVOKE UPDATE, DELETE, TRUNCATE ON {} FROM {}").format(sql.Identifier(table), role_id))
        created = []
        for table, column in tables.items():
            rls_on, has_policy = state.get(table, (False, False))
            table_id = sql.Identifier(table)
            if not rls_on:
                run(sql.SQL("ALTER TABLE {} ENABLE ROW LEVEL SECURITY").format(table_id))
            if not has_policy:
                expression = sql.SQL(policy_expression(column))
                run(sql.SQL("CREATE POLICY {} ON {} USING ({}) WITH CHECK ({})").format(
                    sql.Identifier(POLICY_NAME), table_id, expression, expression))
                created.append(table)
    if created:
        logger.info("row-level security policies created on %s", ", ".join(created))
    return created


def _role_exists(cursor: Any, role: str) -> bool:
    cursor.execute("SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = %s)", [role])
    return bool(cursor.fetchone()[0])


def _current_schema(cursor: Any) -> str:
    cursor.execute("SELECT current_schema()")
    return cursor.fetchone()[0]


def _refuse_privileged_role(cursor: Any, role: str) -> None:
    cursor.execute("SELECT rolsuper OR rolbypassrls FROM pg_roles WHERE rolname = %s", [role])
    if cursor.fetchone()[0]:
        raise PrivilegedLogin(
            f"the database role {role!r} is a superuser or bypasses row-level security: "
            f"ALTER ROLE {role} NOSUPERUSER NOBYPASSRLS"
        )


def _ensure_role(cursor: Any, role: str, *, exists: bool, settings_dict: dict[str, Any]) -> None:
    """Create the role unless it ``exists`` (``LOGIN`` with the application's password when it
    is the application's login user, else ``NOLOGIN``), and let the owner switch to it (``SET
    ROLE``, as a login that is a member of the role does each statement): a superuser may
    already; another owner is granted the role unless it may set it."""
    if not exists:
        statement = sql.SQL("CREATE ROLE {} NOSUPERUSER NOBYPASSRLS NOCREATEDB NOCREATEROLE").format(sql.Identifier(role))
        if settings_dict.get("USER") == role:
            statement += sql.SQL(" LOGIN")
            if settings_dict.get("PASSWORD"):
                statement += sql.SQL(" PASSWORD {}").format(sql.Literal(settings_dict["PASSWORD"]))
        else:
            statement += sql.SQL(" NOLOGIN")
        cursor.execute(statement.as_string(cursor.connection))
    cursor.execute("SELECT rolsuper, current_setting('server_version_num')::int >= 160000 FROM pg_roles "
                   "WHERE rolname = current_user")
    superuser, has_set_option = cursor.fetchone()
    if not superuser:
        # From PostgreSQL 16 a role's creator is made a member WITH ADMIN but SET FALSE, so
        # "member" is not enough: it must be allowed to SET ROLE (tested as such an owner).
        cursor.execute("SELECT pg_has_role(current_user, %s, %s)", [role, "SET" if has_set_option else "MEMBER"])
        if not cursor.fetchone()[0]:
            cursor.execute(sql.SQL("GRANT {} TO CURRENT_USER").format(sql.Identifier(role)).as_string(cursor.connection))
