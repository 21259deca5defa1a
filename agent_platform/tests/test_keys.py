"""Keys (issue 23, H1): no key published in the source ever runs the platform.

The production settings module is imported in child processes, with the environment and the
secrets file each test chooses, as ``make run``/``manage.py`` would import it.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography.fernet import Fernet

from agent_platform import local_secrets

pytestmark = pytest.mark.usefixtures("all_tenants_scope")

ROOT = Path(__file__).resolve().parents[2]
GOOD_SECRET_KEY = "k" * 10 + "-a-secret-key-for-these-tests-only-not-published-x"
_PROBE = ("import json; from django.conf import settings as s; "
          "print(json.dumps([s.DEBUG, s.SECRET_KEY, s.ENCRYPTION_KEY, s.SECRET_KEY_FALLBACKS]))")
_KEY_NAMES = ("SECRET_KEY", "ENCRYPTION_KEY", "SECRET_KEY_FALLBACKS", "DEBUG", "SECRETS_FILE")


def _child(env: dict[str, str], probe: str = _PROBE) -> subprocess.CompletedProcess:
    """Import the production settings in a child with ``env`` over this environment minus the
    key variables (and no secrets file unless ``env`` names one)."""
    base = {k: v for k, v in os.environ.items() if k not in _KEY_NAMES}
    full = {**base, "DJANGO_SETTINGS_MODULE": "agent_platform.settings", "SECRETS_FILE": "", **env}
    return subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env=full, capture_output=True, text=True,
                          timeout=120)


def _settings(env: dict[str, str]) -> list:
    out = _child(env)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def _refused(env: dict[str, str], reason: str) -> None:
    out = _child(env)
    assert out.returncode != 0, f"settings accepted {env}"
    assert "ImproperlyConfigured" in out.stderr and reason in out.stderr, out.stderr[-2000:]


def test_without_keys_the_settings_refuse_to_start_and_say_how_to_get_keys():
    """H1: with DEBUG on, the settings fell back to the development keys in settings.py."""
    for debug in ("1", "0"):
        _refused({"DEBUG": debug}, "scripts/bootstrap.sh")


def test_the_published_development_keys_are_refused_with_debug_on_and_off():
    """H1: whoever read the database could decrypt every provider key with the development
    ENCRYPTION_KEY published in settings.py; it must never be the key of a running platform."""
    good_encryption_key = Fernet.generate_key().decode()
    for debug in ("1", "0"):
        _refused({"DEBUG": debug, "SECRET_KEY": local_secrets.PUBLISHED_DEV_SECRET_KEY,
                  "ENCRYPTION_KEY": good_encryption_key}, "SECRET_KEY is a key published")
        _refused({"DEBUG": debug, "SECRET_KEY": GOOD_SECRET_KEY,
                  "ENCRYPTION_KEY": local_secrets.PUBLISHED_DEV_ENCRYPTION_KEY}, "published in the source code")
        # …nor as a decryption key behind a good one
        _refused({"DEBUG": debug, "SECRET_KEY": GOOD_SECRET_KEY,
                  "ENCRYPTION_KEY": f"{good_encryption_key},{local_secrets.PUBLISHED_DEV_ENCRYPTION_KEY}"},
                 "item 2 is a key published")
        # the test settings' keys are published too
        from django.conf import settings

        _refused({"DEBUG": debug, "SECRET_KEY": settings.SECRET_KEY, "ENCRYPTION_KEY": good_encryption_key},
                 "SECRET_KEY is a key published")
        _refused({"DEBUG": debug, "SECRET_KEY": GOOD_SECRET_KEY, "ENCRYPTION_KEY": settings.ENCRYPTION_KEY},
                 "published in the source code")
        _refused({"DEBUG": debug, "SECRET_KEY": GOOD_SECRET_KEY, "SECRET_KEY_FALLBACKS": local_secrets.PUBLISHED_DEV_SECRET_KEY,
                  "ENCRYPTION_KEY": good_encryption_key}, "SECRET_KEY is a key published")


def test_malformed_keys_are_refused_at_start_not_at_the_first_decryption():
    _refused({"SECRET_KEY": GOOD_SECRET_KEY, "ENCRYPTION_KEY": "not-a-fernet-key"}, "not urlsafe base64 of 32 bytes")
    _refused({"SECRET_KEY": "short", "ENCRYPTION_KEY": Fernet.generate_key().decode()}, "shorter than 32")


def test_debug_is_off_unless_asked_for():
    key = Fernet.generate_key().decode()
    assert _settings({"SECRET_KEY": GOOD_SECRET_KEY, "ENCRYPTION_KEY": key})[0] is False
    assert _settings({"SECRET_KEY": GOOD_SECRET_KEY, "ENCRYPTION_KEY": key, "DEBUG": "1"})[0] is True


def test_keys_come_from_the_secrets_file_when_the_environment_has_none(tmp_path):
    path = tmp_path / "secrets.env"
    assert local_secrets.ensure(path, environ={}) == list(local_secrets.GENERATED_NAMES)
    values = local_secrets.read(path)
    debug, secret_key, encryption_key, fallbacks = _settings({"SECRETS_FILE": str(path)})
    assert (secret_key, encryption_key, fallbacks) == (values["SECRET_KEY"], values["ENCRYPTION_KEY"], [])
    assert debug is False
    # the environment wins over the file
    other = Fernet.generate_key().decode()
    assert _settings({"SECRETS_FILE": str(path), "ENCRYPTION_KEY": other})[2] == other


def test_a_secrets_file_other_users_can_read_is_refused(tmp_path):
    path = tmp_path / "secrets.env"
    local_secrets.ensure(path, environ={})
    path.chmod(0o644)
    _refused({"SECRETS_FILE": str(path)}, "chmod 600")


def test_the_secrets_file_is_generated_once_0600_and_never_overwritten(tmp_path):
    path = tmp_path / "var" / "secrets.env"
    env = {k: v for k, v in os.environ.items() if k not in ("SECRET_KEY", "ENCRYPTION_KEY", "DATABASE_APP_PASSWORD")}
    run = lambda: subprocess.run([sys.executable, "-m", "agent_platform.local_secrets"], cwd=ROOT,  # noqa: E731
                                 env={**env, "SECRETS_FILE": str(path)}, capture_output=True, text=True, check=True)
    assert run().stdout.split() == ["SECRET_KEY", "ENCRYPTION_KEY", "DATABASE_APP_PASSWORD"]
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    first = path.read_text()
    values = local_secrets.read(path)
    assert local_secrets.encryption_key_problem(values["ENCRYPTION_KEY"]) is None
    assert len(values["SECRET_KEY"]) >= 50 and len(values["DATABASE_APP_PASSWORD"]) >= 32
    assert run().stdout == "" and path.read_text() == first  # a second bootstrap keeps every value
    # a value the operator removed is added back; the others stay
    path.write_text("\n".join(line for line in first.splitlines() if not line.startswith("DATABASE_APP_PASSWORD")) + "\n")
    assert run().stdout.split() == ["DATABASE_APP_PASSWORD"]
    assert local_secrets.read(path)["ENCRYPTION_KEY"] == values["ENCRYPTION_KEY"]
    # two installs never share a key
    other = tmp_path / "other.env"
    local_secrets.ensure(other, environ={})
    assert local_secrets.read(other)["ENCRYPTION_KEY"] != values["ENCRYPTION_KEY"]


def test_names_the_environment_gives_are_not_written(tmp_path):
    path = tmp_path / "secrets.env"
    written = local_secrets.ensure(path, environ={"SECRET_KEY": GOOD_SECRET_KEY})
    assert written == ["ENCRYPTION_KEY", "DATABASE_APP_PASSWORD"]
    assert "SECRET_KEY" not in local_secrets.read(path)


def test_make_run_serves_with_debug_off():
    """``make run`` (scripts/run.sh) does not turn DEBUG on; the settings default is off."""
    script = (ROOT / "scripts" / "run.sh").read_text()
    assert "export DEBUG=${DEBUG:-0}" in script


@pytest.mark.parametrize("relative", ["var/secrets.env", ".env"])
def test_the_secrets_files_are_git_ignored(relative):
    out = subprocess.run(["git", "check-ignore", "-q", relative], cwd=ROOT)
    assert out.returncode == 0, f"{relative} is not ignored by git"


def test_plain_manage_py_reads_the_secrets_file_bootstrap_wrote():
    """``manage.py`` on a developer machine finds the keys bootstrap generated, without them
    being exported: beside the machine's cluster (test_key_location.py), or the checkout's
    ``var/secrets.env`` with DATABASE_URL; ``SECRETS_FILE`` names another file, empty: none."""
    assert local_secrets.path_from_environment({}) == local_secrets.machine_dir({}) / "secrets.env"
    assert local_secrets.path_from_environment({"DATABASE_URL": "postgres://u@db/ap"}) == ROOT / "var" / "secrets.env"
    assert local_secrets.path_from_environment({"SECRETS_FILE": "/etc/agent-platform/secrets.env"}) == Path(
        "/etc/agent-platform/secrets.env")
    assert local_secrets.path_from_environment({"SECRETS_FILE": ""}) is None
