"""Create the database and the application's login role if missing (``scripts/bootstrap.sh``).

Connects as the owner (``DATABASE_OWNER_URL``; default: ``postgres`` on DATABASE_URL's host)
and makes sure that:

- the database named in ``DATABASE_URL`` exists (default ``agent_platform`` on 127.0.0.1);
- the application's role, ``DATABASE_URL``'s user (default ``agent_platform_app``), exists as
  ``LOGIN NOSUPERUSER NOBYPASSRLS NOCREATEDB NOCREATEROLE NOREPLICATION`` with
  ``DATABASE_URL``'s password (default: ``DATABASE_APP_PASSWORD`` from the environment or
  var/secrets.env). An existing role is brought to exactly these attributes and that
  password. Its grants and the row-level security policies come with ``manage.py migrate``
  (tenants/rls.py).

Names are read as the settings read them (agent_platform/local_secrets.py). Exit status 1 when
PostgreSQL cannot be reached or refuses.
"""

from __future__ import annotations

import sys
from pathlib import Path

import psycopg
from psycopg import sql

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agent_platform import local_secrets  # noqa: E402

ROLE_ATTRIBUTES = "LOGIN NOSUPERUSER NOBYPASSRLS NOCREATEDB NOCREATEROLE NOREPLICATION NOINHERIT"


def main() -> int:
    try:
        app, owner = local_secrets.database_logins(local_secrets.read(local_secrets.path_from_environment()))
    except (local_secrets.SecretsFileError, ValueError) as exc:
        print(exc, file=sys.stderr)
        return 1
    params = {
        "host": owner["HOST"] or "127.0.0.1",
        "port": owner["PORT"] or 5432,  # a DATABASE_URL without a port: PostgreSQL's default
        "user": owner["USER"],
        "password": owner["PASSWORD"] or None,
    }
    try:
        with psycopg.connect(dbname="postgres", autocommit=True, connect_timeout=10, **params) as conn:
            exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (app["NAME"],)).fetchone()
            if not exists:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(app["NAME"])))
                print(f"created database {app['NAME']}", file=sys.stderr)
            if app["USER"] != owner["USER"]:
                ensure_login_role(conn, role=app["USER"], password=app.get("PASSWORD") or "")
    except psycopg.Error as exc:
        print(f"PostgreSQL at {params['host']}:{params['port']} as {params['user']}: {exc}", file=sys.stderr)
        return 1
    return 0


def ensure_login_role(conn: psycopg.Connection, *, role: str, password: str) -> None:
    """Create ``role`` or bring it to :data:`ROLE_ATTRIBUTES` and ``password`` (none: no
    password, for a local cluster with trust or peer authentication)."""
    exists = conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)).fetchone()
    statement = sql.SQL("ALTER ROLE {} " if exists else "CREATE ROLE {} ").format(sql.Identifier(role))
    statement += sql.SQL(ROLE_ATTRIBUTES)
    statement += sql.SQL(" PASSWORD {}").format(sql.Literal(password)) if password else sql.SQL(" PASSWORD NULL")
    conn.execute(statement)
    if not exists:
        print(f"created login role {role}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
