"""Where the sandbox's Python environment lives: one answer for the settings and the bootstrap.

Standard library only, no Django: ``agent_platform/settings.py`` calls :func:`sandbox_venv` for
the defaults of ``SANDBOX_PYTHON`` and ``SANDBOX_RO_BINDS``, and ``scripts/bootstrap.sh`` runs
``python -m agent_platform.sandbox_paths`` to learn where to build it, so both name one path.

Confined programs run as ``SANDBOX_UID`` (65534) when the worker is root, and bubblewrap, running
as that user, binds the environment into the sandbox: every directory above it must let that
user through. A checkout in root's home (mode 0700), or in any 0700 directory, does not; an
environment inside the checkout then broke every stdio MCP server and CLI command (issue 34).
So:

- **root** (a fresh VPS or container): :func:`machine_sandbox_root` ``/<digest>/venv``, machine-wide
  beside the embedded PostgreSQL (``scripts/ensure_postgres.py``), every directory mode 0755;
- **any other user**: the same shared environment when a root bootstrap already built it, else
  ``<checkout>/var/sandbox/<digest>/venv`` (a non-root worker runs its programs as itself, and it
  can read its own checkout).

``<digest>`` is the first 16 hex digits of the SHA-256 of ``scripts/sandbox-requirements.txt``
and ``scripts/sandbox-constraints.txt``: a changed pin gets a fresh environment, and every
checkout with the same pins shares one. An environment is complete once :data:`READY_MARKER`
exists in it (the bootstrap writes it last).
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

from agent_platform.local_secrets import machine_dir


def machine_sandbox_root() -> Path:
    """The machine-wide home of sandbox environments (root's bootstrap builds them here):
    ``sandbox/`` in the machine directory of the cluster and its keys
    (:func:`agent_platform.local_secrets.machine_dir` as root: ``AGENT_PLATFORM_DATA_DIR``,
    default ``/var/lib/agent-platform``)."""
    return machine_dir(euid=0) / "sandbox"

READY_MARKER = ".complete"
"""The file a finished environment holds (written after its packages are installed)."""

REQUIREMENT_FILES = ("scripts/sandbox-requirements.txt", "scripts/sandbox-constraints.txt")


def requirements_digest(base_dir: Path) -> str:
    """16 hex digits of the SHA-256 of the sandbox's requirement files (a missing file reads empty)."""
    digest = hashlib.sha256()
    for name in REQUIREMENT_FILES:
        try:
            digest.update((base_dir / name).read_bytes())
        except OSError:
            pass
    return digest.hexdigest()[:16]


def sandbox_venv(base_dir: Path, *, shared_root: Path | None = None, as_root: bool | None = None) -> Path:
    """The sandbox's virtualenv for the checkout at ``base_dir`` (it may not exist yet).

    Args:
        base_dir: The checkout (``settings.BASE_DIR``).
        shared_root: The machine-wide directory (default :func:`machine_sandbox_root`; tests point it
            elsewhere).
        as_root: Whether the caller is root (default: ``os.geteuid() == 0``).

    Returns:
        ``shared_root/<digest>/venv`` for root, or for anyone when it is complete; else
        ``base_dir/var/sandbox/<digest>/venv``.
    """
    digest = requirements_digest(base_dir)
    shared = (shared_root or machine_sandbox_root()) / digest / "venv"
    if as_root is None:
        as_root = os.geteuid() == 0
    if as_root or (shared / READY_MARKER).exists():
        return shared
    return base_dir / "var" / "sandbox" / digest / "venv"


if __name__ == "__main__":  # scripts/bootstrap.sh: where to build the environment
    checkout = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent
    print(sandbox_venv(checkout))  # noqa: T201 - the command's output
