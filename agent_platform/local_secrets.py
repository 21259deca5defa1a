"""The per-install secrets file (``var/secrets.env``): generated once, read by the settings.

``scripts/bootstrap.sh`` (``make run``, ``make test``) runs :func:`ensure` once per machine: it
writes a ``SECRET_KEY``, an ``ENCRYPTION_KEY`` (a Fernet key) and ``DATABASE_APP_PASSWORD``
(the password of the application's PostgreSQL login role) into a file of mode 0600, unless
the environment gives them. The file is never overwritten: a value already in it is kept, a
missing one is appended. ``var/`` is git-ignored.

The settings (``agent_platform/settings.py``) read each of these names from the environment
first, then from this file (:func:`lookup`). They stay out of the environment of ``make run``'s
processes on purpose: every child process (a model server, a CLI tool, an MCP server) inherits
an environment and anyone with the same uid can read ``/proc/<pid>/environ``.

Format: ``NAME=value`` lines; blank lines and lines starting with ``#`` are ignored; no quoting,
no expansion. ``SECRETS_FILE`` (environment) names another file; an empty value reads none.

This module imports nothing from Django, so ``scripts/ensure_database.py`` can use it before
Django is set up.
"""

from __future__ import annotations

import base64
import binascii
import os
import secrets
import stat
from collections.abc import Mapping
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent
DEFAULT_PATH = BASE_DIR / "var" / "secrets.env"

GENERATED_NAMES = ("SECRET_KEY", "ENCRYPTION_KEY", "DATABASE_APP_PASSWORD")
"""What :func:`ensure` generates when neither the environment nor the file has it."""

PUBLISHED_KEY_MARKERS = (b"dev-only-insecure", b"test-only-insecure", b"django-insecure")
"""A key whose text (``SECRET_KEY``) or decoded bytes (``ENCRYPTION_KEY``) start with one of
these was published in this repository (the former development defaults, the test settings'
keys) or by ``django-admin startproject``: refused outside the test settings."""


PUBLISHED_DEV_SECRET_KEY = "dev-only-insecure-secret-key-change-me"
PUBLISHED_DEV_ENCRYPTION_KEY = "ZGV2LW9ubHktaW5zZWN1cmUtbWFzdGVyLWtleS0zMmI="
"""The development keys that settings.py used to fall back to with DEBUG on (published, so
refused now). The encryption key is kept for one purpose: ``manage.py rotate_encryption_key
--from-published-dev-key`` unwraps the data keys of an install that ran with it."""


class SecretsFileError(Exception):
    """The secrets file cannot be used (unreadable, malformed, or readable by other users)."""


def path_from_environment(environ: Mapping[str, str] | None = None) -> Path | None:
    """The secrets file to read: ``SECRETS_FILE`` if set (empty: none), else ``var/secrets.env``."""
    environ = os.environ if environ is None else environ
    value = environ.get("SECRETS_FILE")
    if value is None:
        return DEFAULT_PATH
    return Path(value) if value.strip() else None


def read(path: Path | None) -> dict[str, str]:
    """The ``NAME=value`` pairs of ``path`` (``{}`` when ``path`` is None or does not exist).

    Raises:
        SecretsFileError: the file is readable or writable by its group or others (it must be
            0600 or stricter), or a line is not ``NAME=value``.
    """
    if path is None:
        return {}
    try:
        info = path.stat()
    except FileNotFoundError:
        return {}
    if info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise SecretsFileError(
            f"{path} is accessible to other users (mode {stat.S_IMODE(info.st_mode):04o}); run: chmod 600 {path}"
        )
    values: dict[str, str] = {}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, value = line.partition("=")
        if not sep or not name.strip().isidentifier():
            raise SecretsFileError(f"{path}, line {number}: expected NAME=value")
        values[name.strip()] = value.strip()
    return values


def lookup(name: str, file_values: Mapping[str, str], environ: Mapping[str, str] | None = None) -> str:
    """``name`` from the environment if set and not empty, else from ``file_values``, else ""."""
    environ = os.environ if environ is None else environ
    return (environ.get(name) or "").strip() or file_values.get(name, "")


def new_fernet_key() -> str:
    """A new Fernet key: urlsafe base64 of 32 random bytes (what ``ENCRYPTION_KEY`` holds)."""
    return base64.urlsafe_b64encode(os.urandom(32)).decode()


def _generate(name: str) -> str:
    if name == "ENCRYPTION_KEY":
        return new_fernet_key()
    if name == "SECRET_KEY":
        return secrets.token_urlsafe(50)
    return secrets.token_urlsafe(32)  # DATABASE_APP_PASSWORD: URL-safe, so it fits in a DATABASE_URL


def ensure(path: Path, environ: Mapping[str, str] | None = None) -> list[str]:
    """Write the :data:`GENERATED_NAMES` that neither the environment nor ``path`` has.

    Creates ``path`` (and its directory) with mode 0600 if missing; appends to it otherwise,
    never changing a value it holds.

    Returns:
        The names written now (empty when nothing was missing).

    Raises:
        SecretsFileError: as :func:`read`.
    """
    environ = os.environ if environ is None else environ
    present = read(path)
    missing = [n for n in GENERATED_NAMES if not lookup(n, present, environ)]
    if not missing:
        return []
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    with os.fdopen(fd, "a", encoding="utf-8") as handle:
        os.fchmod(handle.fileno(), 0o600)
        if handle.tell() == 0:
            handle.write("# Generated by scripts/bootstrap.sh for this installation. Keep it secret; never commit it.\n"
                         "# Losing ENCRYPTION_KEY loses every tenant's stored secrets (README, key rotation).\n")
        for name in missing:
            handle.write(f"{name}={_generate(name)}\n")
    return missing


def published_secret_key(value: str) -> bool:
    """True when ``value`` (a ``SECRET_KEY``) is one of the keys published in this repository."""
    return value.encode().startswith(PUBLISHED_KEY_MARKERS)


def encryption_key_problem(value: str) -> str | None:
    """Why ``value`` (``ENCRYPTION_KEY``: comma-separated Fernet keys, the first encrypts) is
    unusable, or None when it is fine: empty, an item that is not urlsafe base64 of 32 bytes,
    or an item that is a published key (:data:`PUBLISHED_KEY_MARKERS`)."""
    keys = [k.strip() for k in value.split(",") if k.strip()]
    if not keys:
        return "ENCRYPTION_KEY is empty"
    for position, key in enumerate(keys, start=1):
        try:
            raw = base64.urlsafe_b64decode(key.encode())
        except (binascii.Error, ValueError):
            raw = b""
        if len(raw) != 32:
            return f"ENCRYPTION_KEY item {position} is not urlsafe base64 of 32 bytes (a Fernet key)"
        if raw.startswith(PUBLISHED_KEY_MARKERS):
            return f"ENCRYPTION_KEY item {position} is a key published in the source code"
    return None


DEFAULT_APP_ROLE = "agent_platform_app"
DEFAULT_DATABASE = "agent_platform"
DEFAULT_PORT = int(os.environ.get("LOCAL_POSTGRES_PORT") or "5433")
"""The platform's own local PostgreSQL 18 with pgvector (scripts/ensure_postgres.py), beside a
system PostgreSQL on 5432."""


def database_logins(file_values: Mapping[str, str], environ: Mapping[str, str] | None = None) -> tuple[dict, dict]:
    """The application's and the owner's PostgreSQL logins (``dj_database_url`` dicts).

    - application: ``DATABASE_URL``; default ``postgres://<DATABASE_APP_ROLE>@127.0.0.1:5433/
      agent_platform`` (the local cluster of scripts/ensure_postgres.py; :data:`DEFAULT_PORT`). Without a password in it, its user being ``DATABASE_APP_ROLE``, the
      password is ``DATABASE_APP_PASSWORD``.
    - owner: ``DATABASE_OWNER_URL``; default user ``postgres`` without password on the
      application's host and port. Its database is always the application's.

    Each name is looked up with :func:`lookup` (environment, then ``file_values``).

    Raises:
        ValueError: ``DATABASE_OWNER_URL`` names another database than ``DATABASE_URL``.
    """
    import dj_database_url

    environ = os.environ if environ is None else environ
    role = (environ.get("DATABASE_APP_ROLE") or "").strip() or DEFAULT_APP_ROLE
    url = lookup("DATABASE_URL", file_values, environ)
    app = dj_database_url.parse(url or f"postgres://{role}@127.0.0.1:{DEFAULT_PORT}/{DEFAULT_DATABASE}", conn_max_age=0)
    if not app.get("PASSWORD") and app.get("USER") == role:
        app["PASSWORD"] = lookup("DATABASE_APP_PASSWORD", file_values, environ)
    owner_url = lookup("DATABASE_OWNER_URL", file_values, environ)
    if owner_url:
        owner = dj_database_url.parse(owner_url)
        if owner.get("NAME") and owner["NAME"] != app["NAME"]:
            raise ValueError(f"DATABASE_OWNER_URL names database {owner['NAME']!r}, DATABASE_URL {app['NAME']!r}: "
                             "they must be the same database")
    else:
        owner = {"USER": "postgres", "PASSWORD": ""}
    owner = {"USER": owner.get("USER") or "postgres", "PASSWORD": owner.get("PASSWORD") or "",
             "HOST": owner.get("HOST") or app.get("HOST") or "", "PORT": owner.get("PORT") or app.get("PORT") or ""}
    return app, owner


def main() -> int:
    """``python -m agent_platform.local_secrets``: :func:`ensure` the secrets file
    (``SECRETS_FILE`` or ``var/secrets.env``); prints the names it generated, one a line."""
    import sys

    path = path_from_environment()
    if path is None:
        return 0
    try:
        written = ensure(path)
    except SecretsFileError as exc:
        print(exc, file=sys.stderr)  # noqa: T201 - the module is a command (bootstrap runs it)
        return 1
    for name in written:
        print(name)  # noqa: T201 - the command's output: the names it generated
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
