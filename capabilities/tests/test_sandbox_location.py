"""Where the sandbox's Python environment lives (issue 34): a checkout under a directory the
sandbox user cannot enter (root's home, mode 0700) must not break every confined program.

The test builds such a checkout (the settings package and the sandbox's requirement files, under
a 0700 directory, holding the environment an earlier bootstrap made inside it), asks *its*
settings for ``SANDBOX_PYTHON`` and ``SANDBOX_RO_BINDS``, and runs that Python confined with
those binds, as every stdio MCP server of the catalogue does. No database.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.conf import settings

from agent_platform.sandbox_paths import READY_MARKER, requirements_digest, sandbox_venv
from capabilities.confinement import SandboxProfile, bwrap_resolve, confined_argv, confined_env, drops_privileges

REPO = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(bwrap_resolve("bwrap") is None, reason="bubblewrap is not installed (scripts/bootstrap.sh)"),
    pytest.mark.skipif(not drops_privileges(), reason="only a root worker runs programs as another user"),
    pytest.mark.skipif(not os.path.exists(settings.SANDBOX_PYTHON),
                       reason="the sandbox's Python environment (scripts/bootstrap.sh)"),
    pytest.mark.usefixtures("all_tenants_scope"),
]


@pytest.fixture
def private_checkout() -> Iterator[Path]:
    """A checkout at ``<0700 directory>/checkout``, as a clone in ``/root`` is."""
    parent = Path(tempfile.mkdtemp(prefix="ap-0700-"))
    os.chmod(parent, 0o700)
    checkout = parent / "checkout"
    shutil.copytree(REPO / "agent_platform", checkout / "agent_platform",
                    ignore=shutil.ignore_patterns("tests", "__pycache__"))
    (checkout / "scripts").mkdir()
    for name in ("sandbox-requirements.txt", "sandbox-constraints.txt"):
        shutil.copy(REPO / "scripts" / name, checkout / "scripts" / name)
    # What an earlier bootstrap left in such a checkout: its own environment, world-readable
    # (here this machine's, linked: a copy would take minutes to build).
    for layout in (Path("var/sandbox/venv"), Path("var/sandbox") / requirements_digest(checkout) / "venv"):
        (checkout / layout).parent.mkdir(parents=True, exist_ok=True)
        (checkout / layout).symlink_to(Path(settings.SANDBOX_RO_BINDS[0]))
    try:
        yield checkout
    finally:
        shutil.rmtree(parent, ignore_errors=True)


def _checkout_settings(checkout: Path) -> dict[str, object]:
    """``SANDBOX_PYTHON`` and ``SANDBOX_RO_BINDS`` as the settings of ``checkout`` have them."""
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(checkout), "SECRETS_FILE": "",
           "SECRET_KEY": secrets.token_urlsafe(50),
           "ENCRYPTION_KEY": base64.urlsafe_b64encode(os.urandom(32)).decode()}
    code = ("import json; from agent_platform import settings as s; "
            "print(json.dumps({'python': s.SANDBOX_PYTHON, 'binds': s.SANDBOX_RO_BINDS, 'base': str(s.BASE_DIR)}))")
    result = subprocess.run([sys.executable, "-c", code], env=env, cwd=str(checkout), capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_a_checkout_under_a_0700_directory_runs_its_confined_python(private_checkout: Path) -> None:
    found = _checkout_settings(private_checkout)
    assert found["base"] == str(private_checkout), "the settings of the private checkout were read"
    profile = SandboxProfile(ro_binds=tuple(found["binds"]))  # type: ignore[arg-type]
    argv = confined_argv([str(found["python"]), "-c", "import mcp_server_time; print('imported')"], profile)
    result = subprocess.run(argv, env=confined_env(profile), capture_output=True, text=True, timeout=60)
    assert (result.returncode, result.stdout) == (0, "imported\n"), (found, result.stderr)
    assert not str(found["python"]).startswith(str(private_checkout.parent)), found


def test_root_builds_machine_wide_and_others_find_it_there(tmp_path: Path) -> None:
    """One rule for the settings and the bootstrap (``python -m agent_platform.sandbox_paths``)."""
    checkout = tmp_path / "checkout"
    (checkout / "scripts").mkdir(parents=True)
    (checkout / "scripts" / "sandbox-requirements.txt").write_text("mcp-server-time==1\n")
    shared = tmp_path / "shared"
    digest = requirements_digest(checkout)
    assert sandbox_venv(checkout, shared_root=shared, as_root=True) == shared / digest / "venv"
    assert sandbox_venv(checkout, shared_root=shared, as_root=False) == checkout / "var" / "sandbox" / digest / "venv"
    (shared / digest / "venv").mkdir(parents=True)
    (shared / digest / "venv" / READY_MARKER).touch()
    assert sandbox_venv(checkout, shared_root=shared, as_root=False) == shared / digest / "venv"
    (checkout / "scripts" / "sandbox-requirements.txt").write_text("mcp-server-time==2\n")
    assert requirements_digest(checkout) != digest, "a changed pin gets a fresh environment"
    printed = subprocess.run([sys.executable, "-m", "agent_platform.sandbox_paths", str(checkout)], cwd=str(REPO),
                             capture_output=True, text=True, timeout=60, check=True).stdout.strip()
    assert printed == str(sandbox_venv(checkout))
