"""Persistent data directories of catalogue programs (issue 37).

A confined program's writable places (``/home/sandbox``, ``/tmp``) vanish with its process, so
server-memory's graph, a sqlite database or a filesystem server's files were lost at every
idle close or restart. A template may declare a data directory::

    data_dir: {mount: /data, per: tenant, quota_mb: 256}

- ``mount``: where the program sees it (an absolute path, not a system directory);
- ``per``: ``tenant`` (one directory for every server or command of the tenant made from the
  template) or ``server`` (one for each of them);
- ``quota_mb``: the most it may hold (1-102400 MiB).

The host directory is ``SANDBOX_DATA_ROOT/<template slug>/tenant-<id>[/<owner>]`` (default
``/var/lib/agent-platform/sandbox-data`` for root, beside the embedded PostgreSQL, so it is
backed up with the rest of the machine directory), owned by the sandbox user, mode 0700, bound
writable at ``mount`` (:attr:`capabilities.confinement.SandboxProfile.data_binds`). It outlives
processes, idle closes and restarts, and goes with its tenant (:func:`tenant_data_dirs_remove`,
on the tenant's deletion).

The quota is checked when the program starts: a directory over it does not start the program
(the connection or the call fails with the reason), and each file is bounded by the template's
``file_size_mb`` limit while it runs. It is not a filesystem quota (no loop devices or project
quotas are assumed on the host): a running program may pass it by at most what it writes before
its next start.
"""

from __future__ import annotations

import os
import posixpath
import shutil
from pathlib import Path
from typing import Any

DATA_DIR_KEYS = ("mount", "per", "quota_mb")
DATA_DIR_PER = ("tenant", "server")
MAX_QUOTA_MB = 102_400
_SYSTEM_MOUNTS = ("/usr", "/bin", "/sbin", "/lib", "/lib64", "/etc", "/proc", "/dev", "/sys", "/run", "/tmp",
                  "/home/sandbox")


class DataDirFull(ValueError):
    """A program's data directory holds more than its quota: the program is not started."""


def data_dir_errors(spec: Any) -> list[str]:
    """What is wrong with a template's ``data_dir`` (``{}``: none declared, no error)."""
    if spec in (None, {}):
        return []
    if not isinstance(spec, dict) or set(spec) - set(DATA_DIR_KEYS) or "mount" not in spec:
        return [f"A JSON object with mount and optionally per ({' or '.join(DATA_DIR_PER)}) and quota_mb."]
    errors = _mount_errors(spec["mount"])
    if spec.get("per", "tenant") not in DATA_DIR_PER:
        errors.append(f"per: {' or '.join(DATA_DIR_PER)}.")
    quota = spec.get("quota_mb", 1024)
    if isinstance(quota, bool) or not isinstance(quota, int) or not 1 <= quota <= MAX_QUOTA_MB:
        errors.append(f"quota_mb: an integer from 1 to {MAX_QUOTA_MB}.")
    return errors


def _mount_errors(mount: Any) -> list[str]:
    if not isinstance(mount, str) or not mount.startswith("/") or posixpath.normpath(mount) != mount or mount == "/":
        return ["mount: an absolute, normalised path such as /data."]
    if any(mount == p or mount.startswith(p + "/") or p.startswith(mount + "/") for p in _SYSTEM_MOUNTS):
        return [f"mount: {mount} is (or holds) a directory the sandbox needs; use e.g. /data."]
    return []


def data_root() -> Path:
    """``settings.SANDBOX_DATA_ROOT``: where every data directory lives."""
    from django.conf import settings

    return Path(settings.SANDBOX_DATA_ROOT)


def data_dir_path(*, template_slug: str, tenant_id: int, owner: str | None, root: Path | None = None) -> Path:
    """The host directory of a program's data: per tenant (``owner`` None) or per server or
    command (``owner``, e.g. ``server-12``)."""
    path = (root or data_root()) / template_slug / f"tenant-{int(tenant_id)}"
    return path / owner if owner else path


def directory_bytes(path: Path) -> int:
    """Bytes of the regular files under ``path`` (links not followed; unreadable entries skipped)."""
    total = 0
    for directory, _subdirs, files in os.walk(path):
        for name in files:
            try:
                st = os.lstat(os.path.join(directory, name))
            except OSError:
                continue
            total += st.st_size
    return total


def data_dir_prepare(path: Path, *, quota_mb: int, uid: int, gid: int) -> Path:
    """Make ``path`` ready for a start: created if missing (the directories above it 0711, it
    0700 and, for a root worker, owned by the sandbox user ``uid``/``gid``), and within its quota.

    Raises:
        DataDirFull: it holds more than ``quota_mb`` MiB (the message says how much).
    """
    if not path.is_dir():
        path.mkdir(parents=True, mode=0o700, exist_ok=True)
        root = data_root()
        for parent in path.parents:
            if parent.is_relative_to(root):
                os.chmod(parent, 0o711)  # enterable by the sandbox user, not listable
        if os.geteuid() == 0:
            os.chown(path, uid, gid)
    used = directory_bytes(path)
    if used > quota_mb * 1024 * 1024:
        raise DataDirFull(f"its data directory holds {used / 1048576:.1f} MiB, over its quota of {quota_mb} MiB: "
                          "delete data through the program, or ask the operator to raise the template's quota_mb")
    return path


def template_data_bind(template: Any, *, tenant_id: int, owner: str, uid: int, gid: int) -> tuple[str, str] | None:
    """``(host directory, mount)`` of ``template``'s data directory for a tenant's server or
    command named ``owner`` (prepared: :func:`data_dir_prepare`), or None when the template
    declares none.

    Raises:
        DataDirFull: over its quota.
    """
    spec = template.data_dir or {}
    if not spec:
        return None
    path = data_dir_path(template_slug=template.slug, tenant_id=tenant_id,
                         owner=owner if spec.get("per", "tenant") == "server" else None)
    data_dir_prepare(path, quota_mb=int(spec.get("quota_mb", 1024)), uid=uid, gid=gid)
    return str(path), spec["mount"]


def tenant_data_dirs_remove(tenant_id: int, *, root: Path | None = None) -> int:
    """Delete every data directory of tenant ``tenant_id`` (all templates); how many went."""
    base = root or data_root()
    removed = 0
    if not base.is_dir():
        return 0
    for template_dir in base.iterdir():
        target = template_dir / f"tenant-{int(tenant_id)}"
        if target.is_dir():
            shutil.rmtree(target, ignore_errors=True)
            removed += 1
    return removed


def on_tenant_deleted(sender: Any, instance: Any, **kwargs: Any) -> None:
    """``post_delete`` of a tenant: its programs' data goes with it."""
    tenant_data_dirs_remove(instance.pk)
