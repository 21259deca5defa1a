"""Create the database and the application's login role if missing, after checking that this
install's keys open the database's data (``scripts/bootstrap.sh``).

Connects as the owner (``DATABASE_OWNER_URL``; default: ``postgres`` on DATABASE_URL's host)
and makes sure that:

- the database named in ``DATABASE_URL`` exists (default ``agent_platform`` on 127.0.0.1);
- the tenants already in it have data keys that the configured ``ENCRYPTION_KEY`` opens
  (:func:`data_keys_check`); if not, it stops (exit status 2) before changing anything, and
  says which file holds the keys that open them, or how to start the demo over. Data keys
  wrapped by the development key this project once published count as opened: bootstrap
  re-wraps them (``manage.py rotate_encryption_key --from-published-dev-key``);
- the application's role, ``DATABASE_URL``'s user (default ``agent_platform_app``), exists as
  ``LOGIN NOSUPERUSER NOBYPASSRLS NOCREATEDB NOCREATEROLE NOREPLICATION`` with
  ``DATABASE_URL``'s password (default: ``DATABASE_APP_PASSWORD`` from the environment or the
  secrets file). An existing role is brought to exactly these attributes and that password.
  Its grants and the row-level security policies come with ``manage.py migrate``
  (tenants/rls.py).

Names are read as the settings read them (agent_platform/local_secrets.py: with the embedded
cluster the secrets file is the machine's, beside the cluster; with ``DATABASE_URL`` the
checkout's ``var/secrets.env``). Exit status 1 when PostgreSQL cannot be reached or refuses.

``--check-keys`` only checks the keys (exit status 0 or 2). ``--keys-warn-only`` (``make test``:
the suite makes databases of its own, with a key of its own) prints the same message as a
warning and goes on: a demo database whose keys are lost must not stop the tests. ``--drop-database NAME`` drops
``DATABASE_URL``'s database, which must be called NAME (every tenant, user and chat in it is
lost; the way to start the demo over when its keys are lost), and exits.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import psycopg
from psycopg import sql

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agent_platform import local_secrets  # noqa: E402

ROLE_ATTRIBUTES = "LOGIN NOSUPERUSER NOBYPASSRLS NOCREATEDB NOCREATEROLE NOREPLICATION NOINHERIT"
KEYS_REFUSED = 2
"""Exit status when the configured keys do not open the database's tenants' data keys."""


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check-keys", action="store_true", help="Only check that ENCRYPTION_KEY opens the data.")
    parser.add_argument("--keys-warn-only", action="store_true",
                        help="Warn, and go on, when ENCRYPTION_KEY does not open the data (make test).")
    parser.add_argument("--drop-database", metavar="NAME",
                        help="Drop DATABASE_URL's database (named NAME) with everything in it, and exit.")
    args = parser.parse_args(argv)
    environ = os.environ if environ is None else environ
    try:
        secrets_path = local_secrets.path_from_environment(environ)
        file_values = local_secrets.read(secrets_path)
        app, owner = local_secrets.database_logins(file_values, environ)
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
        if args.drop_database is not None:
            return drop_database(params, name=app["NAME"], confirm=args.drop_database)
        with psycopg.connect(dbname="postgres", autocommit=True, connect_timeout=10, **params) as conn:
            exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (app["NAME"],)).fetchone()
            if not exists and not args.check_keys:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(app["NAME"])))
                print(f"created database {app['NAME']}", file=sys.stderr)
        if exists:
            with psycopg.connect(dbname=app["NAME"], autocommit=True, connect_timeout=10, **params) as conn:
                problem = data_keys_check(
                    conn, encryption_key=local_secrets.lookup("ENCRYPTION_KEY", file_values, environ),
                    source="the environment" if (environ.get("ENCRYPTION_KEY") or "").strip() else str(secrets_path),
                    secrets_path=secrets_path, candidates=_candidates(secrets_path), database=app["NAME"])
            if problem and args.keys_warn_only and not args.check_keys:
                print(f"WARNING: {problem}\n(The tests go on: they use databases and a key of their own; "
                      "`make run` stops here until this is settled.)", file=sys.stderr)
            elif problem:
                print(problem, file=sys.stderr)
                return KEYS_REFUSED
        if args.check_keys:
            return 0
        if app["USER"] != owner["USER"]:
            with psycopg.connect(dbname="postgres", autocommit=True, connect_timeout=10, **params) as conn:
                ensure_login_role(conn, role=app["USER"], password=app.get("PASSWORD") or "")
    except psycopg.Error as exc:
        print(f"PostgreSQL at {params['host']}:{params['port']} as {params['user']}: {exc}", file=sys.stderr)
        return 1
    return 0


def _candidates(secrets_path: Path | None) -> list[Path]:
    """Other secrets files of this machine that may hold the database's keys: the machine's
    file and this checkout's ``var/secrets.env``, minus the one in use."""
    paths = [local_secrets.machine_dir() / local_secrets.MACHINE_FILE_NAME, local_secrets.checkout_path()]
    return [p for p in paths if p != secrets_path]


def tenant_data_keys(conn: psycopg.Connection) -> dict[int, str]:
    """Tenant id → wrapped data key of every tenant in ``conn``'s database (``{}`` before the
    first migration). ``conn`` logs in as the owner (row-level security does not hide rows
    from the tables' owner)."""
    if conn.execute("SELECT to_regclass('tenants_tenant')").fetchone()[0] is None:
        return {}
    return dict(conn.execute("SELECT id, wrapped_data_key FROM tenants_tenant").fetchall())


def data_keys_check(conn: psycopg.Connection, *, encryption_key: str, source: str, secrets_path: Path | None,
                    candidates: Sequence[Path], database: str) -> str | None:
    """Why ``encryption_key`` must not run with ``conn``'s database, or None when it opens the
    data key of every tenant in it (or there is none).

    Args:
        conn: a connection to the database, as its owner.
        encryption_key: the configured ``ENCRYPTION_KEY``.
        source: where it comes from (a file's path, or "the environment"), for the message.
        secrets_path: the secrets file in use (None: none), where the message says to restore.
        candidates: other secrets files to try (each one that opens some of the data keys is
            named, with the command that puts it in place).
        database: the database's name, for the message.

    Returns:
        A message for the operator: how many tenants' data keys stay closed, which of
        ``candidates`` open them, how to restore the file or start the demo over.
    """
    wrapped = tenant_data_keys(conn)
    if not wrapped:
        return None
    also = [local_secrets.PUBLISHED_DEV_ENCRYPTION_KEY]  # bootstrap re-wraps these (rotate_encryption_key)
    closed = local_secrets.unopened_data_keys(wrapped, encryption_key=encryption_key, also=also)
    if not closed:
        return None
    shown = ", ".join(str(i) for i in closed[:20]) + (", ..." if len(closed) > 20 else "")
    target = secrets_path or "the secrets file"
    lines = [
        f"The ENCRYPTION_KEY from {source} does not open the data keys of {len(closed)} of the {len(wrapped)} "
        f"tenant(s) in database {database!r} (tenant ids {shown}): their stored secrets (provider API keys, MCP "
        "headers, CLI secrets) would be unreadable. These keys are not the ones this database was made with.",
    ]
    for candidate in candidates:
        try:
            key = local_secrets.read(candidate).get("ENCRYPTION_KEY", "")
        except (local_secrets.SecretsFileError, OSError):
            continue
        if not key:
            continue
        still = local_secrets.unopened_data_keys({i: wrapped[i] for i in closed}, encryption_key=key, also=also)
        if len(still) < len(closed):
            opened = "all of them" if not still else f"{len(closed) - len(still)} of them"
            lines.append(f"{candidate} opens {opened}: keep a copy of {target}, then: cp -p {candidate} {target}")
    lines += [
        f"Restore the secrets file that was used with this database to {target} (from your backup, or the "
        "var/secrets.env of the checkout that ran scripts/bootstrap.sh on this machine before), then run "
        "scripts/bootstrap.sh again.",
        f"Or start the demo over (drops database {database!r}: every tenant, user and chat in it is lost): "
        f"python scripts/ensure_database.py --drop-database {database}; then run scripts/bootstrap.sh again.",
    ]
    return "\n".join(lines)


def drop_database(params: dict, *, name: str, confirm: str) -> int:
    """Drop database ``name`` (closing its connections) when ``confirm`` names it; else refuse
    (exit status 1)."""
    if confirm != name:
        print(f"--drop-database {confirm!r}: DATABASE_URL's database is {name!r}; nothing dropped", file=sys.stderr)
        return 1
    with psycopg.connect(dbname="postgres", autocommit=True, connect_timeout=10, **params) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
    print(f"dropped database {name}", file=sys.stderr)
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
