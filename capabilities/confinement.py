"""Confinement of every program a run can start: bubblewrap, a non-root user, no host view.

No Django imports at module level. CLI commands (:mod:`capabilities.cli.sandbox`) and stdio MCP
servers (:mod:`capabilities.mcp.transport`) both start their program through
:func:`confined_argv`, so there is one definition of the sandbox.

What a confined program gets (bubblewrap 0.8, Debian 12's ``bubblewrap``; flags from bwrap(1)):

- **A non-root user on the host.** When the worker runs as root, ``setpriv`` (util-linux) first
  drops to :attr:`SandboxProfile.uid`/``gid`` (65534, ``nobody``, by default) with no
  supplementary groups, no capabilities (inheritable and bounding sets cleared) and
  ``no_new_privs``; bubblewrap then runs unprivileged. Seen from the host, the program's
  processes belong to that uid, never to root. A worker that is not root already runs
  unprivileged and starts bubblewrap directly.
- ``--unshare-all``: new user, mount, PID, IPC, UTS, cgroup and **network** namespaces. The
  network namespace has only its own loopback: the host's 127.0.0.1 (PostgreSQL, Redis, the
  web process, the model server) and every other address are unreachable. There is no
  ``--share-net`` path any more.
- **Egress, where the profile allows it** (``network="egress"``), goes through the platform's
  egress proxy (:mod:`capabilities.egress`): its Unix socket is bound at ``/run/egress.sock``,
  and a small bridge inside the sandbox (:data:`BRIDGE_SOURCE`, run by the sandbox's own
  Python before the program) listens on ``127.0.0.1:3128`` of the sandbox's loopback and
  forwards to it; ``HTTP_PROXY``/``HTTPS_PROXY`` point there. The proxy applies web_fetch's
  address rules to every CONNECT and request: public addresses only, unless an operator
  allow-lists a network (``SANDBOX_EGRESS_ALLOWED_CIDRS``).
- ``--unshare-user --uid/--gid``, ``--disable-userns`` (no nested user namespaces),
  ``--die-with-parent``, ``--new-session`` (no TIOCSTI into a terminal, CVE-2017-5226).
- **Files:** read-only ``/usr`` and the merged-/usr links, a short list of ``/etc`` files
  (:data:`ETC_FILES`: loader cache, users/groups, name service, TLS roots, time zone), the
  operator's read-only binds (:attr:`SandboxProfile.ro_binds`, e.g. the sandbox's Python
  environment), its own ``/proc`` and ``/dev``, a size-limited ``/tmp`` tmpfs, and ``/home/sandbox``
  (cwd and ``$HOME``): a fresh host directory owned by the sandbox user, or a tmpfs. Then
  ``--remount-ro /``. Nothing of the platform's tree, ``var/`` (keys), sockets, ``/root``,
  ``/home`` or other processes is visible.
- **Environment:** exactly ``PATH``, ``HOME``, ``LANG`` (and the proxy variables with egress)
  plus the template's variables and the tenant's secrets. It is bubblewrap's process
  environment (passed on), not ``--setenv`` arguments, so secrets never appear in a process
  listing.
- **Resource limits** (:class:`SandboxLimits`): util-linux's ``prlimit`` sets them on itself
  before it starts ``setpriv``/bubblewrap, and every process of the sandbox inherits them:
  CPU time (``RLIMIT_CPU``, per process: SIGXCPU at the limit, SIGKILL a second later), memory
  (``RLIMIT_DATA``, per process: heap and private writable mappings; allocations beyond it fail
  with ENOMEM, Python's ``MemoryError``; not ``RLIMIT_AS``, which also counts the address space
  runtimes only reserve: Node's WebAssembly reserves ~10 GiB, and mcp-server-fetch's Node
  failed under a 2 GiB ``RLIMIT_AS``),
  processes (``RLIMIT_NPROC``), file size (``RLIMIT_FSIZE``) and open files (``RLIMIT_NOFILE``).
  ``RLIMIT_NPROC`` counts every task (threads too) of the program's host uid, across every
  sandbox of that uid on the host (the kernel charges a user namespace's tasks to its owner
  too): a program may start new processes while fewer than ``processes`` tasks of
  ``SANDBOX_UID`` run on the host. So one program can hold at most ``processes`` tasks, and
  while it holds them, programs whose own limit is not above that count cannot fork or start
  (until its call's timeout ends it). It is only set when the worker is root (the program then
  runs as ``SANDBOX_UID``); a non-root worker's programs run as the worker's own uid, whose
  count includes the worker's threads. cgroups are not used: see :data:`LIMITS_MECHANISM`.
  :func:`limit_exceeded` names the limit a program evidently hit.
"""

from __future__ import annotations

import os
import re
import resource
import shutil
import signal
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

SANDBOX_WORKDIR = "/home/sandbox"
"""cwd and ``$HOME`` inside the sandbox (not ``/work``: the platform may live there, and its
sandbox Python is bound at its own path)."""

SANDBOX_PATH = "/usr/local/bin:/usr/bin:/bin"
SANDBOX_LANG = "C.UTF-8"

NOBODY_UID = 65534
"""``nobody`` / ``nogroup`` on Debian: the default host uid and gid of confined programs."""

EGRESS_SOCKET_IN_SANDBOX = "/run/egress.sock"
"""Where the egress proxy's Unix socket appears inside the sandbox."""

EGRESS_PROXY_PORT = 3128
"""The bridge's port on the sandbox's own loopback (``HTTP_PROXY=http://127.0.0.1:3128``)."""

ETC_FILES = (
    "/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/alternatives",
    "/etc/passwd", "/etc/group", "/etc/nsswitch.conf", "/etc/host.conf", "/etc/hosts",
    "/etc/gai.conf", "/etc/services", "/etc/protocols", "/etc/ssl", "/etc/ca-certificates",
    "/etc/localtime", "/etc/timezone", "/etc/mime.types", "/etc/magic", "/etc/python3", "/etc/python3.11",
)
"""``/etc`` entries visible (read-only) in the sandbox when the host has them. No
``resolv.conf``: a confined program has no DNS of its own (the egress proxy resolves)."""

ROOT_LINKS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
"""Top-level entries recreated as symlinks (merged /usr) or bound read-only."""

TMPFS_BYTES = 64 * 1024 * 1024
"""Size of the sandbox's ``/tmp`` (and of a tmpfs workdir): 64 MiB each."""

_FORBIDDEN_BIND_PREFIXES = ("/proc", "/sys", "/dev", "/run", "/var/run", "/tmp", "/root", "/home", "/etc")
"""Host paths an operator's read-only bind may not name (or lie below): kernel interfaces,
sockets, other users' files, host configuration."""

INHERITED_NAMES = ("LOGNAME", "SHELL", "TERM", "USER")
"""Variables a launcher may add on its own (the MCP SDK merges them from the worker's
environment); bubblewrap unsets them (names only: nothing secret goes on the command line)."""

_ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


LIMITS_MECHANISM = "prlimit"
"""How limits are applied: ``setrlimit`` through util-linux's ``prlimit``, per process. cgroups
v2 would bound a program's processes together (memory, pids, CPU share); the hosts this was
written on had no usable v2 hierarchy (``/sys/fs/cgroup/cgroup.controllers`` absent, a v1
hierarchy with only ``hugetlb`` in the unified one), so it is not used (README, "The sandbox")."""


@dataclass(frozen=True, slots=True)
class SandboxLimits:
    """Resource limits of one confined program (each process of it), applied by ``prlimit``.

    The operator's maximum is ``settings.SANDBOX_LIMITS``; a template may ask for less
    (:meth:`clamped`). All values are positive integers.
    """

    cpu_seconds: int = 300
    """CPU time of each process, seconds (``RLIMIT_CPU``): SIGXCPU at the limit, SIGKILL 1 s later."""
    memory_mb: int = 2048
    """Writable memory of each process, MiB (``RLIMIT_DATA``: heap and private writable mappings,
    thread stacks included): allocations beyond it fail (ENOMEM)."""
    processes: int = 256
    """Tasks (processes and threads) of the program's host uid (``RLIMIT_NPROC``; see the module
    docstring: the count is host-wide for that uid, and it is only set for a root worker)."""
    file_size_mb: int = 256
    """Largest file a process may write, MiB (``RLIMIT_FSIZE``): beyond it EFBIG / SIGXFSZ."""
    open_files: int = 1024
    """Open file descriptors per process (``RLIMIT_NOFILE``)."""

    def __post_init__(self) -> None:
        for name in LIMIT_FIELDS:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")

    def clamped(self, maximum: SandboxLimits) -> SandboxLimits:
        """These limits, each no higher than ``maximum``'s."""
        return SandboxLimits(**{name: min(getattr(self, name), getattr(maximum, name)) for name in LIMIT_FIELDS})

    @classmethod
    def from_mapping(cls, values: Mapping[str, int], *, maximum: SandboxLimits) -> SandboxLimits:
        """``maximum`` with the fields ``values`` names lowered to them (never raised above it).

        Raises:
            ValueError: an unknown name or a value that is not a positive integer.
        """
        unknown = set(values) - set(LIMIT_FIELDS)
        if unknown:
            raise ValueError(f"unknown limits {sorted(unknown)}; known: {', '.join(LIMIT_FIELDS)}")
        return cls(**{name: values.get(name, getattr(maximum, name)) for name in LIMIT_FIELDS}).clamped(maximum)


LIMIT_FIELDS = ("cpu_seconds", "memory_mb", "processes", "file_size_mb", "open_files")
"""The fields of :class:`SandboxLimits`, in the order of settings, templates and messages."""

_MIB = 1024 * 1024


class SandboxUnavailable(Exception):
    """``bwrap`` (or ``setpriv``, when the worker is root) is not installed where configured."""


@dataclass(frozen=True, slots=True)
class SandboxProfile:
    """How a confined program may run. The operator's template decides it, never a tenant."""

    network: Literal["none", "egress"] = "none"
    """``none``: no network at all; ``egress``: public addresses through the egress proxy."""
    ro_binds: tuple[str, ...] = ()
    """Absolute host paths made visible read-only at the same path (e.g. a Python environment)."""
    env: Mapping[str, str] = field(default_factory=dict, repr=False)
    """Variables on top of PATH/HOME/LANG: the template's and the tenant's secrets (never logged)."""
    uid: int = NOBODY_UID
    """Host uid the program runs as when the worker is root (ignored otherwise)."""
    gid: int = NOBODY_UID
    bwrap_path: str = "bwrap"
    """The ``bwrap`` executable: a name looked up on the worker's ``PATH``, or a path."""
    bridge_python: str = "/usr/bin/python3"
    """A Python 3 inside the sandbox (under ``/usr`` or a read-only bind) that runs the egress
    bridge; only used with ``network="egress"``."""
    egress_socket: str = ""
    """Host path of the egress proxy's Unix socket; empty: this process's own proxy
    (:func:`capabilities.egress.egress_socket_path`, started on first use)."""
    limits: SandboxLimits = field(default_factory=SandboxLimits)
    """CPU, memory, processes, file size and open files of each process of the program."""
    data_binds: tuple[tuple[str, str], ...] = ()
    """``(host directory, path inside)`` pairs bound writable: the template's persistent data
    directory (:mod:`capabilities.data_dirs`), made and owned for the sandbox user beforehand."""

    def __post_init__(self) -> None:
        if self.network not in ("none", "egress"):
            raise ValueError(f"network must be 'none' or 'egress', got {self.network!r}")
        for path in self.ro_binds:
            if not isinstance(path, str) or not path.startswith("/"):
                raise ValueError(f"a read-only bind must be an absolute path: {path!r}")
        for pair in self.data_binds:
            if len(pair) != 2 or not all(isinstance(p, str) and p.startswith("/") for p in pair):
                raise ValueError(f"a data bind is (absolute host path, absolute path inside): {pair!r}")
        for name, value in self.env.items():
            if not _ENV_NAME_RE.fullmatch(str(name)) or "\0" in str(value):
                raise ValueError(f"invalid environment variable {name!r}")


def bind_path_check(path: str) -> None:
    """Raise ValueError unless ``path`` may be bound read-only into a sandbox.

    An absolute, normalised path, not ``/`` and not at or below a forbidden prefix
    (:data:`_FORBIDDEN_BIND_PREFIXES`).
    """
    if not isinstance(path, str) or not path.startswith("/") or os.path.normpath(path) != path or path == "/":
        raise ValueError(f"a read-only bind must be an absolute, normalised path other than '/': {path!r}")
    for prefix in _FORBIDDEN_BIND_PREFIXES:
        if path == prefix or path.startswith(prefix + "/"):
            raise ValueError(f"{path!r} may not be bound into a sandbox (it is under {prefix})")


def bwrap_resolve(bwrap_path: str) -> str | None:
    """The absolute path of ``bwrap_path`` if it is an executable (or a name on PATH), else None."""
    if os.sep in bwrap_path:
        return bwrap_path if os.path.isfile(bwrap_path) and os.access(bwrap_path, os.X_OK) else None
    return shutil.which(bwrap_path)


def drops_privileges() -> bool:
    """True when confined programs are started through ``setpriv`` (the worker is root)."""
    return os.geteuid() == 0


def confined_argv(argv: list[str] | tuple[str, ...], profile: SandboxProfile, *, workdir: str | None = None) -> list[str]:
    """The full command line that runs ``argv`` confined by ``profile``.

    Args:
        argv: The program and its arguments, as the template rendered them (no shell).
        profile: The sandbox profile.
        workdir: A host directory bound writable at ``/home/sandbox`` (owned by the sandbox user, see
            :func:`workdir_prepare`), or None for a tmpfs.

    Returns:
        ``[prlimit …, setpriv …, bwrap …, --, (bridge …,) *argv]``; run it with :func:`confined_env`.

    Raises:
        SandboxUnavailable: bwrap, prlimit, or setpriv for a root worker, is not installed.
        ValueError: ``argv`` is empty.
    """
    if not argv:
        raise ValueError("a confined command needs a program")
    bwrap = bwrap_resolve(profile.bwrap_path)
    if bwrap is None:
        raise SandboxUnavailable(f"bubblewrap ({profile.bwrap_path!r}) is not installed")
    prefix = limits_argv(profile.limits)
    if drops_privileges():
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            raise SandboxUnavailable("setpriv (util-linux) is not installed: cannot drop root for the sandbox")
        prefix += [
            setpriv, f"--reuid={profile.uid}", f"--regid={profile.gid}", "--clear-groups",
            "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--",
        ]
    full = prefix + [
        bwrap, "--unshare-all", "--unshare-user", "--uid", str(profile.uid), "--gid", str(profile.gid),
        "--disable-userns", "--die-with-parent", "--new-session", "--hostname", "sandbox",
        "--ro-bind", "/usr", "/usr",
    ]
    for path in ROOT_LINKS:
        if os.path.islink(path):
            full += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            full += ["--ro-bind", path, path]
    for path in ETC_FILES:
        full += ["--ro-bind-try", path, path]
    # /proc, /dev and the /tmp tmpfs first: a read-only bind below /tmp (a checkout under /tmp,
    # say) must land on top of the tmpfs, not be hidden by it.
    full += ["--proc", "/proc", "--dev", "/dev", "--size", str(TMPFS_BYTES), "--tmpfs", "/tmp"]
    full += _bind_args(profile, workdir)
    if profile.network == "egress":
        from capabilities.egress import egress_socket_path

        socket_path = profile.egress_socket or egress_socket_path()
        full += ["--dir", "/run", "--bind", socket_path, EGRESS_SOCKET_IN_SANDBOX]
    for name in INHERITED_NAMES:
        if name not in profile.env:
            full += ["--unsetenv", name]
    full += ["--remount-ro", "/", "--chdir", SANDBOX_WORKDIR, "--"]
    if profile.network == "egress":
        full += [profile.bridge_python, "-I", "-S", "-c", BRIDGE_SOURCE]
    return full + list(argv)


def _bind_args(profile: SandboxProfile, workdir: str | None) -> list[str]:
    """bubblewrap's arguments for the profile's read-only binds, the work directory (a host
    directory, or a tmpfs) and the writable data directories, in that order."""
    args: list[str] = []
    for path in profile.ro_binds:
        args += ["--ro-bind", path, path]
    if workdir is not None:
        args += ["--bind", workdir, SANDBOX_WORKDIR]
    else:
        args += ["--size", str(TMPFS_BYTES), "--tmpfs", SANDBOX_WORKDIR]
    for host_path, inside in profile.data_binds:
        args += ["--bind", host_path, inside]
    return args


def limits_argv(limits: SandboxLimits) -> list[str]:
    """``[prlimit, --cpu=…, --data=…, (--nproc=…,) --fsize=…, --nofile=…, --]``: the start of a
    confined command line.

    Soft and hard limits are equal, except CPU time (hard one second above the soft limit, so
    the program gets SIGXCPU, not a bare SIGKILL). A worker that is not root cannot raise a hard
    limit: each value is capped at the worker's own hard limit then, and ``RLIMIT_NPROC`` is left
    alone (it would count the worker's own threads).

    Raises:
        SandboxUnavailable: ``prlimit`` (util-linux) is not installed.
    """
    prlimit = shutil.which("prlimit")
    if prlimit is None:
        raise SandboxUnavailable("prlimit (util-linux) is not installed: cannot limit the sandbox's resources")
    root = drops_privileges()

    def capped(kind: int, value: int) -> int:
        if root:
            return value
        hard = resource.getrlimit(kind)[1]
        return value if hard == resource.RLIM_INFINITY else min(value, hard)

    cpu = capped(resource.RLIMIT_CPU, limits.cpu_seconds + 1)
    argv = [
        prlimit, f"--cpu={min(limits.cpu_seconds, cpu)}:{cpu}",
        f"--data={capped(resource.RLIMIT_DATA, limits.memory_mb * _MIB)}",
    ]
    if root:
        argv.append(f"--nproc={limits.processes}")
    argv += [
        f"--fsize={capped(resource.RLIMIT_FSIZE, limits.file_size_mb * _MIB)}",
        f"--nofile={capped(resource.RLIMIT_NOFILE, limits.open_files)}",
        "--",
    ]
    return argv


_PROCESS_ERRORS = re.compile(
    r"Cannot fork|\bfork(?:\(\))?: |can't start new thread|Resource temporarily unavailable|\bEAGAIN\b", re.IGNORECASE)
_MEMORY_ERRORS = re.compile(
    r"MemoryError|Cannot allocate memory|\bENOMEM\b|out of memory|bad_alloc|memory exhausted", re.IGNORECASE)
_FILES_ERRORS = re.compile(r"Too many open files|\bEMFILE\b", re.IGNORECASE)
_FILE_SIZE_ERRORS = re.compile(r"File too large|\bEFBIG\b", re.IGNORECASE)


def limit_exceeded(*, limits: SandboxLimits, exit_code: int | None, stderr: str) -> str | None:
    """The resource limit a confined program evidently hit, as a sentence, or None.

    Evidence, in this order: the signal that ended it (bubblewrap exits with 128 + the signal
    number; the launcher itself killed shows as the negative signal number): SIGXCPU is the CPU
    limit, SIGXFSZ the file size limit. Otherwise, for a program that failed (non-zero exit, or
    still running when it was killed: ``exit_code`` None or negative), the errors the program
    itself printed on ``stderr``: a failed fork or thread (EAGAIN), a failed allocation
    (ENOMEM, ``MemoryError``), too many open files (EMFILE), a file too large (EFBIG). A
    program that prints such a message for another reason is attributed to the limit too.

    Args:
        limits: The program's limits (their values go into the sentence).
        exit_code: Its exit status (None: unknown or killed by the caller).
        stderr: What it wrote to stderr (as kept).

    Returns:
        E.g. ``"CPU time limit (10 s per process) exceeded"``, or None.
    """
    signum = None
    if exit_code is not None:
        signum = -exit_code if exit_code < 0 else (exit_code - 128 if 128 < exit_code < 160 else None)
    if signum == signal.SIGXCPU:
        return f"CPU time limit ({limits.cpu_seconds} s per process) exceeded"
    if signum == signal.SIGXFSZ:
        return f"file size limit ({limits.file_size_mb} MiB) exceeded"
    if exit_code == 0:
        return None
    if _PROCESS_ERRORS.search(stderr):
        return f"process limit ({limits.processes} tasks of the sandbox's user) reached: a fork or thread failed"
    if _MEMORY_ERRORS.search(stderr):
        return f"memory limit ({limits.memory_mb} MiB per process) reached: an allocation failed"
    if _FILES_ERRORS.search(stderr):
        return f"open files limit ({limits.open_files} per process) reached"
    if _FILE_SIZE_ERRORS.search(stderr):
        return f"file size limit ({limits.file_size_mb} MiB) exceeded"
    return None


def confined_env(profile: SandboxProfile) -> dict[str, str]:
    """The environment to start :func:`confined_argv` with: nothing of the worker's own."""
    env = {"PATH": SANDBOX_PATH, "HOME": SANDBOX_WORKDIR, "LANG": SANDBOX_LANG}
    if profile.network == "egress":
        proxy = f"http://127.0.0.1:{EGRESS_PROXY_PORT}"
        for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
            env[name] = proxy
        env["NO_PROXY"] = env["no_proxy"] = ""
    env.update({str(k): str(v) for k, v in profile.env.items()})
    return env


def workdir_prepare(path: str, profile: SandboxProfile) -> None:
    """Make the host directory ``path`` (bound at ``/home/sandbox``) writable by the sandbox user only."""
    if drops_privileges():
        os.chown(path, profile.uid, profile.gid)
    os.chmod(path, 0o700)


BRIDGE_SOURCE = r"""
import os, signal, socket, subprocess, sys, threading
SOCK = "/run/egress.sock"
srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("127.0.0.1", 3128))
srv.listen(64)
def pipe(a, b):
    try:
        while True:
            data = a.recv(65536)
            if not data:
                break
            b.sendall(data)
    except OSError:
        pass
    finally:
        try:
            b.shutdown(socket.SHUT_WR)
        except OSError:
            pass
def serve(c):
    u = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        u.connect(SOCK)
    except OSError:
        c.close()
        return
    t = threading.Thread(target=pipe, args=(u, c), daemon=True)
    t.start()
    pipe(c, u)
    t.join()
    c.close()
    u.close()
def accept():
    while True:
        c, _ = srv.accept()
        threading.Thread(target=serve, args=(c,), daemon=True).start()
threading.Thread(target=accept, daemon=True).start()
try:
    p = subprocess.Popen(sys.argv[1:])
except OSError as exc:
    sys.stderr.write("cannot start %r: %s\n" % (sys.argv[1] if len(sys.argv) > 1 else "", exc))
    sys.exit(127)
for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
    signal.signal(s, lambda n, f: p.send_signal(n))
code = p.wait()
sys.exit(code if code >= 0 else 128 - code)
"""
"""The egress bridge: forwards TCP connections to ``127.0.0.1:3128`` on the sandbox's own
loopback to the egress proxy's Unix socket, runs the program as its child (stdin, stdout and
stderr inherited), passes on SIGTERM/SIGINT/SIGHUP and exits with the program's status. Only the
standard library (run with ``-I -S``)."""
