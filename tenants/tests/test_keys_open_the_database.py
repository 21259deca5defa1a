"""Keys paired with a database they do not open (issue 34): bootstrap refuses (`make test` only
warns: CI on a machine whose demo database outlived its keys went red), the API says so.

The fault: a second clone (or a re-clone) generated a new ``ENCRYPTION_KEY`` and ran against
the machine's database anyway; creating a provider in the demo tenant then answered a bare 500
("cannot unwrap the data key"). Now ``scripts/ensure_database.py`` (bootstrap's step 3)
checks the configured key against the tenants' data keys and stops with a message naming the
file that opens them, and the API answers 503 with a message that says what is wrong.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
from cryptography.fernet import Fernet
from django.conf import settings
from django.db import connection

from llm import netrules
from llm.models import ModelProvider
from llm.testing import fake_dns
from tenants import rls

pytestmark = pytest.mark.usefixtures("all_tenants_scope")

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "ensure_database.py"
_STRIPPED = ("SECRETS_FILE", "DATABASE_URL", "DATABASE_OWNER_URL", "SECRET_KEY", "ENCRYPTION_KEY",
             "DATABASE_APP_PASSWORD", "AGENT_PLATFORM_DATA_DIR")


def _ensure_database_module():
    spec = importlib.util.spec_from_file_location("ensure_database_under_test", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _secrets_file(path: Path, encryption_key: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"ENCRYPTION_KEY={encryption_key}\n")
    path.chmod(0o600)
    return path


def _owner_connection() -> psycopg.Connection:
    owner = rls.owner_settings(connection.settings_dict)
    return psycopg.connect(host=owner["HOST"] or "127.0.0.1", port=owner["PORT"] or 5432, user=owner["USER"],
                           password=owner.get("PASSWORD") or None, dbname=connection.settings_dict["NAME"],
                           autocommit=True)


def _run_script(*args: str, secrets_file: Path, user: str, tmp_path: Path) -> subprocess.CompletedProcess:
    """``scripts/ensure_database.py`` against this suite's test database, logging in as ``user``."""
    params = connection.settings_dict
    base = {k: v for k, v in os.environ.items() if k not in _STRIPPED}
    env = {**base, "SECRETS_FILE": str(secrets_file), "AGENT_PLATFORM_DATA_DIR": str(tmp_path / "machine"),
           "DATABASE_URL": f"postgres://{user}@{params['HOST'] or '127.0.0.1'}:{params['PORT']}/{params['NAME']}"}
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)


@pytest.mark.django_db(transaction=True)  # committed: the script's own connection must see the tenants
def test_bootstrap_refuses_keys_that_do_not_open_the_tenants_data_keys(tenant, other_tenant, tmp_path):
    right = _secrets_file(tmp_path / "right.env", settings.ENCRYPTION_KEY)
    wrong = _secrets_file(tmp_path / "wrong.env", Fernet.generate_key().decode())
    role = "ap_keys_test_never_created"
    try:
        refused = _run_script(secrets_file=wrong, user=role, tmp_path=tmp_path)
        assert refused.returncode == 2, refused.stderr
        assert "does not open the data keys of 2 of the 2 tenant(s)" in refused.stderr
        assert "--drop-database" in refused.stderr and str(wrong) in refused.stderr
        with _owner_connection() as owner:  # refused before anything changed: no role was created
            assert owner.execute("SELECT count(*) FROM pg_roles WHERE rolname = %s", [role]).fetchone()[0] == 0
        checked = _run_script("--check-keys", secrets_file=wrong, user=role, tmp_path=tmp_path)
        assert checked.returncode == 2, checked.stderr
        passed = _run_script("--check-keys", secrets_file=right, user=role, tmp_path=tmp_path)
        assert passed.returncode == 0, passed.stderr
        # `make test` (CI on a machine whose demo database was made with keys now lost): a
        # warning, and the set-up goes on (the suite's databases have a key of their own)
        warned = _run_script("--keys-warn-only", secrets_file=wrong, user=role, tmp_path=tmp_path)
        assert warned.returncode == 0, warned.stderr
        assert "WARNING: The ENCRYPTION_KEY" in warned.stderr and "The tests go on" in warned.stderr
        with _owner_connection() as owner:  # and the login role the tests need is made
            assert owner.execute("SELECT count(*) FROM pg_roles WHERE rolname = %s", [role]).fetchone()[0] == 1
    finally:
        with _owner_connection() as owner:
            owner.execute(f'DROP ROLE IF EXISTS "{role}"')


@pytest.mark.django_db(transaction=True)
def test_the_refusal_names_the_file_that_opens_the_data(tenant, tmp_path):
    """Two clones on one machine, the older one with keys of its own (before the keys moved
    beside the cluster): the message says which file holds the keys of the database."""
    ensure_database = _ensure_database_module()
    machine = _secrets_file(tmp_path / "machine" / "secrets.env", Fernet.generate_key().decode())
    old_clone = _secrets_file(tmp_path / "clone1" / "var" / "secrets.env", settings.ENCRYPTION_KEY)
    unrelated = _secrets_file(tmp_path / "clone2" / "var" / "secrets.env", Fernet.generate_key().decode())
    with _owner_connection() as owner:
        message = ensure_database.data_keys_check(
            owner, encryption_key=ensure_database.local_secrets.read(machine)["ENCRYPTION_KEY"], source=str(machine),
            secrets_path=machine, candidates=[unrelated, old_clone], database="agent_platform")
        assert message is not None
        assert f"{old_clone} opens all of them: keep a copy of {machine}, then: cp -p {old_clone} {machine}" in message
        assert str(unrelated) not in message
        # the keys that made the data pass, and so does the first key of a rotation in progress
        for key in (settings.ENCRYPTION_KEY, f"{Fernet.generate_key().decode()},{settings.ENCRYPTION_KEY}"):
            assert ensure_database.data_keys_check(owner, encryption_key=key, source="env", secrets_path=machine,
                                                   candidates=[], database="agent_platform") is None


@pytest.mark.django_db
def test_creating_a_provider_when_the_key_does_not_open_the_tenant_answers_a_clear_503(world, settings, monkeypatch):
    """Reproduced first as the issue saw it: the provider's key is encrypted with the tenant's
    data key, which the configured ENCRYPTION_KEY does not open (500 before)."""
    fake_dns(monkeypatch, {"api.openai.com": "203.0.113.10"})
    monkeypatch.setattr(netrules, "address_block_reason", lambda ip, allowed=None: None)
    settings.ENCRYPTION_KEY = Fernet.generate_key().decode()  # the tenant was made with the suite's key
    client = world.client(admin=True)
    client.raise_request_exception = False
    resp = client.post("/api/v1/admin/providers/", {"name": "openai", "base_url": "https://api.openai.com/v1",
                                                    "api_key": "sk-test-1"}, format="json")
    assert resp.status_code == 503, resp.content
    body = resp.json()
    assert "ENCRYPTION_KEY" in body["message"] and "restore the secrets file" in body["message"]
    assert body["extra"] == {"reason": "tenant_secrets_unavailable"}
    assert not ModelProvider.all_tenants.filter(tenant=world.tenant, name="openai").exists()


@pytest.mark.django_db
def test_starting_the_demo_over_drops_only_the_database_named(tmp_path):
    """The refusal's way out (``--drop-database NAME``), on a scratch database of its own."""
    import uuid

    name = f"ap_keys_scratch_{uuid.uuid4().hex[:8]}"
    params = connection.settings_dict
    base = {k: v for k, v in os.environ.items() if k not in _STRIPPED}
    env = {**base, "SECRETS_FILE": str(_secrets_file(tmp_path / "s.env", Fernet.generate_key().decode())),
           "DATABASE_URL": f"postgres://postgres@{params['HOST'] or '127.0.0.1'}:{params['PORT']}/{name}"}

    def script(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=120)

    def exists() -> bool:
        with _owner_connection() as owner:
            return owner.execute("SELECT count(*) FROM pg_database WHERE datname = %s", [name]).fetchone()[0] == 1

    try:
        assert script().returncode == 0 and exists()  # created (as bootstrap does)
        refused = script("--drop-database", "agent_platform")
        assert refused.returncode == 1 and "nothing dropped" in refused.stderr and exists()
        dropped = script("--drop-database", name)
        assert dropped.returncode == 0, dropped.stderr
        assert not exists()
    finally:
        with _owner_connection() as owner:
            owner.execute(f'DROP DATABASE IF EXISTS "{name}"')


@pytest.mark.django_db
def test_saving_a_provider_in_the_console_when_the_key_does_not_open_the_tenant_answers_a_clear_503(
        world, settings, monkeypatch):
    """The console's provider form meets the same unopened data key: a 503 page with the remedy,
    not a server error, and nothing saved."""
    from django.test import Client

    fake_dns(monkeypatch, {"api.openai.com": "203.0.113.10"})
    monkeypatch.setattr(netrules, "address_block_reason", lambda ip, allowed=None: None)
    settings.ENCRYPTION_KEY = Fernet.generate_key().decode()
    client = Client(raise_request_exception=False)
    client.force_login(world.admin)
    resp = client.post("/admin/llm/modelprovider/add/", {
        "tenant": world.tenant.pk, "name": "openai", "api": "openai", "base_url": "https://api.openai.com/v1",
        "api_key": "sk-test-1"})
    assert resp.status_code == 503, resp.content[:2000]
    assert "restore the secrets file" in resp.content.decode()
    assert not ModelProvider.all_tenants.filter(tenant=world.tenant, name="openai").exists()
