"""Keys live with the data they open (issue 34): where this install's secrets file is.

The fault: the embedded PostgreSQL is one cluster per machine (``/var/lib/agent-platform/``),
but every checkout generated its own ``var/secrets.env``. A second clone on the machine, or the
same checkout deleted and cloned again, got a new ``ENCRYPTION_KEY`` that opens none of the
tenants' data keys in that cluster (creating a provider answered 500), and deleting the
checkout lost every tenant's stored secrets while the database lived on.

These tests run the real commands (``python -m agent_platform.local_secrets``, bootstrap's step
1c) in throwaway "checkouts" that hold a copy of the module, with the machine directory moved
under ``tmp_path`` (``AGENT_PLATFORM_DATA_DIR``): nothing touches this machine's real one.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

from agent_platform import local_secrets

ROOT = Path(__file__).resolve().parents[2]
_STRIPPED = ("SECRETS_FILE", "DATABASE_URL", "SECRET_KEY", "ENCRYPTION_KEY", "DATABASE_APP_PASSWORD",
             "AGENT_PLATFORM_DATA_DIR")


def _checkout(path: Path) -> Path:
    """A throwaway checkout: the package's secrets module, as a clone has it."""
    (path / "agent_platform").mkdir(parents=True)
    (path / "agent_platform" / "__init__.py").write_text("")
    shutil.copy(ROOT / "agent_platform" / "local_secrets.py", path / "agent_platform" / "local_secrets.py")
    return path


def _step_1c(checkout: Path, machine: Path, **env: str) -> subprocess.CompletedProcess:
    """Bootstrap's step 1c in ``checkout``, the machine directory being ``machine``."""
    base = {k: v for k, v in os.environ.items() if k not in _STRIPPED}
    return subprocess.run([sys.executable, "-m", "agent_platform.local_secrets"], cwd=checkout,
                          env={**base, "PYTHONPATH": str(checkout), "AGENT_PLATFORM_DATA_DIR": str(machine), **env},
                          capture_output=True, text=True, timeout=60)


def test_two_clones_and_a_reclone_on_one_machine_use_the_keys_beside_the_cluster(tmp_path):
    machine = tmp_path / "machine"
    first, second = _checkout(tmp_path / "clone1"), _checkout(tmp_path / "clone2")
    out = _step_1c(first, machine)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["SECRET_KEY", "ENCRYPTION_KEY", "DATABASE_APP_PASSWORD"]
    keys = local_secrets.read(machine / "secrets.env")
    assert stat.S_IMODE((machine / "secrets.env").stat().st_mode) == 0o600
    assert (machine / "secrets.env").stat().st_uid == os.geteuid()
    assert not (first / "var" / "secrets.env").exists(), "a checkout no longer gets keys of its own"
    # a second clone: nothing generated, the same keys
    out = _step_1c(second, machine)
    assert out.returncode == 0 and out.stdout == "", out.stderr
    assert not (second / "var" / "secrets.env").exists()
    # the first checkout deleted and cloned again: the same keys
    shutil.rmtree(first)
    out = _step_1c(_checkout(first), machine)
    assert out.returncode == 0 and out.stdout == "", out.stderr
    assert local_secrets.read(machine / "secrets.env") == keys
    # and the settings of each read them (path_from_environment with each checkout)
    for checkout in (first, second):
        path = local_secrets.path_from_environment({"AGENT_PLATFORM_DATA_DIR": str(machine)}, base_dir=checkout)
        assert path == machine / "secrets.env"


def test_an_older_checkouts_keys_move_beside_the_cluster_once(tmp_path):
    """An install from before the move: its var/secrets.env holds the keys the machine's data
    was made with; the first bootstrap copies it beside the cluster (0600) and leaves it."""
    machine, old = tmp_path / "machine", _checkout(tmp_path / "old")
    local_secrets.ensure(old / "var" / "secrets.env", environ={})
    old_keys = local_secrets.read(old / "var" / "secrets.env")
    out = _step_1c(old, machine)
    assert out.returncode == 0 and out.stdout == "", out.stderr
    assert "no longer read" in out.stderr
    assert local_secrets.read(machine / "secrets.env") == old_keys
    assert stat.S_IMODE((machine / "secrets.env").stat().st_mode) == 0o600
    # a second old checkout with keys of its own is not adopted: the operator is told
    other = _checkout(tmp_path / "other")
    local_secrets.ensure(other / "var" / "secrets.env", environ={})
    out = _step_1c(other, machine)
    assert out.returncode == 0, out.stderr
    assert local_secrets.read(machine / "secrets.env") == old_keys
    assert "holds another ENCRYPTION_KEY" in out.stderr and str(machine / "secrets.env") in out.stderr
    # a file the operator names (SECRETS_FILE) is never filled from a checkout's
    named = tmp_path / "named.env"
    out = _step_1c(old, machine, SECRETS_FILE=str(named))
    assert out.returncode == 0, out.stderr
    assert local_secrets.read(named)["ENCRYPTION_KEY"] != old_keys["ENCRYPTION_KEY"]


def test_with_an_operators_database_the_checkouts_file_or_secrets_file_is_used(tmp_path):
    machine, checkout = tmp_path / "machine", tmp_path / "checkout"
    environ = {"AGENT_PLATFORM_DATA_DIR": str(machine)}
    assert local_secrets.path_from_environment(environ, base_dir=checkout) == machine / "secrets.env"
    assert local_secrets.path_from_environment({**environ, "DATABASE_URL": "postgres://u@db.example/ap"},
                                               base_dir=checkout) == checkout / "var" / "secrets.env"
    assert local_secrets.path_from_environment({**environ, "SECRETS_FILE": "/etc/ap/secrets.env"},
                                               base_dir=checkout) == Path("/etc/ap/secrets.env")
    assert local_secrets.path_from_environment({**environ, "SECRETS_FILE": ""}, base_dir=checkout) is None
    # a checkout whose own file names the database keeps using it
    (checkout / "var").mkdir(parents=True)
    (checkout / "var" / "secrets.env").write_text("DATABASE_URL=postgres://u@db.example/ap\n")
    assert local_secrets.path_from_environment(environ, base_dir=checkout) == checkout / "var" / "secrets.env"


def test_the_machine_directory_is_the_clusters():
    assert local_secrets.machine_dir({}, euid=0) == Path("/var/lib/agent-platform")
    assert local_secrets.machine_dir({"XDG_DATA_HOME": "/home/u/.data"}, euid=1000) == Path("/home/u/.data/agent-platform")
    assert local_secrets.machine_dir({"AGENT_PLATFORM_DATA_DIR": "/srv/ap"}, euid=0) == Path("/srv/ap")
    spec = importlib.util.spec_from_file_location("ensure_postgres_under_test", ROOT / "scripts" / "ensure_postgres.py")
    ensure_postgres = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ensure_postgres)
    assert ensure_postgres.root_dir() == local_secrets.machine_dir() / "postgresql"
