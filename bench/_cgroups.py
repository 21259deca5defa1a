"""CPU cgroups for benchmarks: PostgreSQL scheduled as one group, as its container runs it.

On a host without a container runtime or service manager, Linux schedules a process started in
a session of its own as one group (an *autogroup*, ``kernel.sched_autogroup_enabled``, on by
default), of the same weight as any other. The benchmarks start every platform process in its
own session, so each is one group, as each container or systemd unit would be. PostgreSQL is
not: every backend it starts calls ``setsid()`` (``InitPostmasterChild`` in its source), so a
cluster serving 60 connections is 60 groups, each weighing as much as a whole web process,
where a container or a systemd unit makes the cluster one.

:class:`CpuCgroups` puts the processes it is given in CPU cgroups of its own (cgroup v1's
``cpu`` hierarchy or cgroup v2 with the ``cpu`` controller; default weights) and moves them
back where they were when closed. It needs root (or a delegated hierarchy); without one it
raises :class:`CgroupsUnavailable` with the reason.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from pathlib import Path

import yaml

CGROUP_ROOT = Path("/sys/fs/cgroup")


class CgroupsUnavailable(RuntimeError):
    """No writable CPU cgroup hierarchy here (the message says why)."""


def _proc_cgroup(pid: int) -> str:
    return Path(f"/proc/{pid}/cgroup").read_text()


class CpuCgroups:
    """Groups ``<hierarchy>/<name>-<group>``, one per :meth:`place` call's ``group``, each at the
    top of the hierarchy, beside the host's other groups; or, given ``parent``, under one
    group ``<hierarchy>/<parent>``, as Docker's cgroupfs driver puts every container under
    ``/docker`` (bench/README.md has what each layout did to the token p95).

    Args:
        name: the groups' prefix (unique per invocation: the benchmark's queue name).
        root: where the cgroup file systems are mounted (tests pass a directory of their own).
        read_cgroup: ``pid`` → the text of ``/proc/<pid>/cgroup`` (tests replace it).
        parent: the common parent's name, created here and removed on :meth:`close`; None:
            no parent.

    Raises:
        CgroupsUnavailable: neither a cgroup v1 ``cpu`` hierarchy nor a cgroup v2 one whose root
            gives its children the ``cpu`` controller, or a group cannot be created (not root).
    """

    def __init__(self, name: str, *, root: Path = CGROUP_ROOT,
                 read_cgroup: Callable[[int], str] = _proc_cgroup, parent: str | None = None) -> None:
        self.name = name
        self._read_cgroup = read_cgroup
        if (root / "cpu" / "cgroup.procs").exists():
            self.version, self.mount = 1, root / "cpu"
        elif "cpu" in _read(root / "cgroup.controllers").split():
            self.version, self.mount = 2, root
            if "cpu" not in _read(root / "cgroup.subtree_control").split():
                raise CgroupsUnavailable(f"cgroup v2 at {root}: the cpu controller is not enabled for its children")
        else:
            raise CgroupsUnavailable(f"no cgroup v1 cpu hierarchy or cgroup v2 cpu controller under {root}")
        self._origin: dict[Path, Path] = {}  # a group's path -> the cgroup its first process came from
        self.parent = None if parent is None else self.mount / parent
        if self.parent is not None:
            try:
                self.parent.mkdir(exist_ok=True)
                if self.version == 2:
                    (self.parent / "cgroup.subtree_control").write_text("+cpu\n")
            except OSError as exc:
                raise CgroupsUnavailable(f"cannot create {self.parent}: {exc}") from exc

    def path(self, group: str) -> Path:
        """Where ``group`` is (or will be)."""
        return (self.parent or self.mount) / f"{self.name}-{group}"

    def origin(self, pid: int) -> Path:
        """The cgroup ``pid`` is in now, in this hierarchy."""
        for line in self._read_cgroup(pid).splitlines():
            _, controllers, path = line.split(":", 2)
            if (self.version == 1 and "cpu" in controllers.split(",")) or (self.version == 2 and controllers == ""):
                return self.mount / path.lstrip("/")
        return self.mount

    def place(self, group: str, pids: Iterable[int], *, shares: int | None = None) -> None:
        """Move ``pids`` (whole processes, with their threads; the processes they start later
        stay in the group) into ``group``, created on first use. A process that has exited
        meanwhile is skipped. ``shares``: the group's relative CPU weight as Docker's
        ``cpu_shares`` gives it (default 1024): cgroup v1's ``cpu.shares``, or on cgroup v2
        ``cpu.weight`` at the same ratio to its default (100 for 1024).

        Raises:
            CgroupsUnavailable: the group cannot be created (not root).
        """
        path = self.path(group)
        try:
            path.mkdir(exist_ok=True)
            if shares is not None:
                if self.version == 1:
                    (path / "cpu.shares").write_text(f"{shares}\n")
                else:
                    (path / "cpu.weight").write_text(f"{max(1, min(10_000, round(shares * 100 / 1024)))}\n")
        except OSError as exc:
            raise CgroupsUnavailable(f"cannot create {path}: {exc}") from exc
        for pid in pids:
            try:
                self._origin.setdefault(path, self.origin(pid))
                _move(pid, path)
            except (FileNotFoundError, ProcessLookupError):
                continue
        self._origin.setdefault(path, self.mount)

    def close(self) -> None:
        """Move every process still in a group back to where that group's first process came
        from, and remove the groups."""
        for path, origin in self._origin.items():
            for pid in _read(path / "cgroup.procs").split():
                with contextlib.suppress(FileNotFoundError, ProcessLookupError):
                    _move(int(pid), origin)
            with contextlib.suppress(OSError):  # (a group that still has a process stays)
                path.rmdir()
        if self.parent is not None:
            with contextlib.suppress(OSError):
                self.parent.rmdir()


def compose_cpu_shares(compose_file: Path) -> dict[str, int]:
    """``{service: cpu_shares}`` for the services of a Compose file that set ``cpu_shares``
    (the Compose specification's relative CPU weight; Docker's default is 1024).

    Raises:
        OSError: the file cannot be read.
        ValueError: it is not a mapping with ``services``, or a ``cpu_shares`` is not an
            integer of at least 2 (Docker's minimum).
    """
    spec = yaml.safe_load(compose_file.read_text())
    if not isinstance(spec, dict) or not isinstance(spec.get("services"), dict):
        raise ValueError(f"{compose_file}: no services")
    out = {}
    for name, service in spec["services"].items():
        shares = (service or {}).get("cpu_shares")
        if shares is None:
            continue
        if isinstance(shares, bool) or not isinstance(shares, int) or shares < 2:
            raise ValueError(f"{compose_file}: {name}.cpu_shares must be an integer of at least 2, not {shares!r}")
        out[name] = shares
    return out


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _move(pid: int, cgroup: Path) -> None:
    """One write per process, as the kernel wants it (ESRCH: it has exited)."""
    with (cgroup / "cgroup.procs").open("a") as procs:
        procs.write(f"{pid}\n")
