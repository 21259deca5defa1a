"""The install's secrets file: generated once, kept with the data its keys open, read by the settings.

Where it lives (:func:`path_from_environment`):

- ``SECRETS_FILE`` (environment) names it; an empty value reads none.
- Without ``DATABASE_URL`` the platform's data is in the machine-wide embedded PostgreSQL
  (``scripts/ensure_postgres.py``: one cluster per machine, shared by every checkout), so its
  keys are too: ``<machine dir>/secrets.env`` beside the cluster (:func:`machine_dir`:
  ``/var/lib/agent-platform`` as root, else ``~/.local/share/agent-platform``). Every clone
  on the machine, and a checkout deleted and cloned again, reads the same keys as the data.
- With ``DATABASE_URL`` (the environment's, or one written in the checkout's file) the
  database is the operator's: the checkout's ``var/secrets.env``.

``scripts/bootstrap.sh`` (``make run``, ``make test``) runs :func:`prepare`: it writes a
``SECRET_KEY``, an ``ENCRYPTION_KEY`` (a Fernet key) and ``DATABASE_APP_PASSWORD`` (the
password of the application's PostgreSQL login role) into that file, mode 0600, unless the
environment gives them. The file is never overwritten: a value already in it is kept, a missing
one is appended. A checkout's ``var/secrets.env`` from before the keys moved beside the cluster
is copied there when the machine has no file yet (it holds the keys the data was made with).
``scripts/ensure_database.py`` then refuses a database whose tenants' data keys this
``ENCRYPTION_KEY`` does not open (:func:`unopened_data_keys`), naming the file that does.

The settings (``agent_platform/settings.py``) read each of these names from the environment
first, then from this file (:func:`lookup`). They stay out of the environment of ``make run``'s
processes on purpose: every child process (a model server, a CLI tool, an MCP server) inherits
an environment and anyone with the same uid can read ``/proc/<pid>/environ``.

Format: ``NAME=value`` lines; blank lines and lines starting with ``#`` are ignored; no quoting,
no expansion.

This module imports nothing from Django, so ``scripts/ensure_database.py`` can use it before
Django is set up.
"""

from __future__ import annotations

import base64
import binascii
import os
import secrets
import stat
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent
CHECKOUT_RELATIVE_PATH = Path("var") / "secrets.env"
"""The checkout's own file (with ``DATABASE_URL``; before the keys moved beside the cluster)."""
MACHINE_FILE_NAME = "secrets.env"

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


def machine_dir(environ: Mapping[str, str] | None = None, *, euid: int | None = None) -> Path:
    """The machine-wide directory of the embedded PostgreSQL and of the keys that open its data.

    ``AGENT_PLATFORM_DATA_DIR`` if set; else ``/var/lib/agent-platform`` when ``euid``
    (default: this process's) is root, else ``$XDG_DATA_HOME/agent-platform`` (default
    ``~/.local/share/agent-platform``). The cluster is in ``<dir>/postgresql``
    (``scripts/ensure_postgres.py``), the secrets file in ``<dir>/secrets.env``.
    """
    environ = os.environ if environ is None else environ
    configured = (environ.get("AGENT_PLATFORM_DATA_DIR") or "").strip()
    if configured:
        return Path(configured)
    euid = os.geteuid() if euid is None else euid
    if euid == 0:
        return Path("/var/lib/agent-platform")
    base = environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "agent-platform"


def checkout_path(base_dir: Path = BASE_DIR) -> Path:
    """The checkout's ``var/secrets.env`` under ``base_dir``."""
    return base_dir / CHECKOUT_RELATIVE_PATH


def _names_database(path: Path) -> bool:
    """True when ``path`` exists and has a ``DATABASE_URL=`` line (an operator's database)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return False
    return any(line.strip().startswith("DATABASE_URL=") and line.partition("=")[2].strip()
               for line in text.splitlines())


def path_from_environment(environ: Mapping[str, str] | None = None, *, base_dir: Path = BASE_DIR,
                          machine: Path | None = None) -> Path | None:
    """The secrets file to read and write (module docstring, "Where it lives").

    Args:
        environ: the environment (default ``os.environ``).
        base_dir: the checkout (default: this one).
        machine: the machine directory (default :func:`machine_dir`).

    Returns:
        ``SECRETS_FILE`` if set (None if empty); else the checkout's ``var/secrets.env`` when
        ``DATABASE_URL`` is set in ``environ`` or in that file; else ``<machine>/secrets.env``.
    """
    environ = os.environ if environ is None else environ
    value = environ.get("SECRETS_FILE")
    if value is not None:
        return Path(value) if value.strip() else None
    checkout = checkout_path(base_dir)
    if (environ.get("DATABASE_URL") or "").strip() or _names_database(checkout):
        return checkout
    return (machine_dir(environ) if machine is None else machine) / MACHINE_FILE_NAME


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
            handle.write("# Generated by scripts/bootstrap.sh. Keep it secret; never commit it; back it up with the\n"
                         "# database whose keys it holds. Losing ENCRYPTION_KEY loses every tenant's stored secrets\n"
                         "# (docs/operations-security.md, \"Key handling\").\n")
        for name in missing:
            handle.write(f"{name}={_generate(name)}\n")
    return missing


@dataclass(frozen=True)
class Prepared:
    """What :func:`prepare` did."""

    path: Path | None
    """The secrets file (None: ``SECRETS_FILE`` is empty, the environment gives everything)."""
    written: list[str] = field(default_factory=list)
    """The names generated into it now."""
    adopted_from: Path | None = None
    """The checkout's ``var/secrets.env`` copied to it now (an install from before the move)."""
    notes: list[str] = field(default_factory=list)
    """What the operator should know (a checkout file with other keys that is not read)."""


def _create_exclusive(path: Path, text: str) -> bool:
    """Write ``text`` to a new file ``path`` (mode 0600, its directory made if missing).
    False, writing nothing, when ``path`` exists already."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        os.fchmod(handle.fileno(), 0o600)
        handle.write(text)
    return True


def prepare(environ: Mapping[str, str] | None = None, *, base_dir: Path = BASE_DIR,
            machine: Path | None = None) -> Prepared:
    """Bootstrap's step 1c: make this install's secrets file hold every generated name.

    1. The file is :func:`path_from_environment`'s (``environ``, ``base_dir``, ``machine``).
    2. When it is the machine's file and does not exist yet while the checkout's
       ``var/secrets.env`` does (an install from before the keys moved beside the cluster),
       that file's content is copied to it, mode 0600: those are the keys the machine's
       database was made with. The checkout's file is left as it is, and no longer read.
    3. :func:`ensure` adds what is missing.

    A checkout's ``var/secrets.env`` that is not the file and holds another ``ENCRYPTION_KEY``
    is reported in ``notes``; which key opens the database is ``scripts/ensure_database.py``'s
    check.

    Raises:
        SecretsFileError: the file or the checkout's file is unusable (as :func:`read`).
    """
    environ = os.environ if environ is None else environ
    path = path_from_environment(environ, base_dir=base_dir, machine=machine)
    if path is None:
        return Prepared(path=None)
    checkout = checkout_path(base_dir)
    adopted_from = None
    notes = []
    machine_file = (machine_dir(environ) if machine is None else machine) / MACHINE_FILE_NAME
    if path == machine_file and checkout.exists():
        old = read(checkout)
        if not path.exists() and old:
            header = (f"# Copied by scripts/bootstrap.sh from {checkout}: the keys of the machine's database\n"
                      f"# live beside it now. Keep it secret; back it up with the database.\n")
            if _create_exclusive(path, header + checkout.read_text(encoding="utf-8")):
                adopted_from = checkout
        current = read(path)
        if adopted_from is None and old.get("ENCRYPTION_KEY") and old.get("ENCRYPTION_KEY") != current.get("ENCRYPTION_KEY"):
            notes.append(f"{checkout} holds another ENCRYPTION_KEY than {path}; it is not read (the keys of the "
                         f"machine's database are in {path}). scripts/ensure_database.py checks which of the two "
                         "opens the database.")
    written = ensure(path, environ)
    return Prepared(path=path, written=written, adopted_from=adopted_from, notes=notes)


def unopened_data_keys(wrapped: Mapping[int, str], *, encryption_key: str, also: Iterable[str] = ()) -> list[int]:
    """The tenants whose data key no configured key opens.

    Args:
        wrapped: tenant id → its wrapped data key (``tenants_tenant.wrapped_data_key``).
        encryption_key: ``ENCRYPTION_KEY`` (comma-separated Fernet keys; an item that is not a
            Fernet key opens nothing).
        also: more Fernet keys that may open them (e.g. :data:`PUBLISHED_DEV_ENCRYPTION_KEY`,
            whose data keys bootstrap re-wraps).

    Returns:
        The ids of ``wrapped`` that none of these keys unwraps, ascending.
    """
    from cryptography.fernet import Fernet, InvalidToken, MultiFernet

    fernets = []
    for key in [*encryption_key.split(","), *also]:
        try:
            fernets.append(Fernet(key.strip().encode()))
        except ValueError:  # not urlsafe base64 of 32 bytes (binascii.Error is a ValueError)
            continue
    if not fernets:
        return sorted(wrapped)
    keys = MultiFernet(fernets)
    unopened = []
    for tenant_id, token in wrapped.items():
        try:
            keys.decrypt(token.encode())
        except InvalidToken:
            unopened.append(tenant_id)
    return sorted(unopened)


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


def _say(message: str) -> None:
    print(f"\033[1m[secrets]\033[0m {message}", file=sys.stderr)  # noqa: T201 - bootstrap's messages


def main() -> int:
    """``python -m agent_platform.local_secrets``: :func:`prepare` this install's secrets file.

    Prints the names it generated on stdout, one a line; says what it did on stderr. Exit
    status 1 when a secrets file is unusable.
    """
    try:
        result = prepare()
    except SecretsFileError as exc:
        _say(str(exc))
        return 1
    if result.adopted_from is not None:
        _say(f"copied {result.adopted_from} to {result.path}: the keys of the machine's database live beside "
             f"it now; {result.adopted_from} is no longer read (delete it once {result.path} is backed up)")
    for name in result.written:
        print(name)  # noqa: T201 - the command's output: the names it generated
        _say(f"generated {name} into {result.path} (keep it; back it up with the database)")
    for note in result.notes:
        _say(note)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
