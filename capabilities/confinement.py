"""Confinement of every program a run can start: bubblewrap, a non-root user, no host view.

No Django imports at module level. CLI commands (:mod:`capabilities.cli.sandbox`) and stdio MCP
servers (:mod:`capabilities.mcp.client`) both start their program through
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
"""

from __future__ import annotations

import os
import re
import shutil
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

    def __post_init__(self) -> None:
        if self.network not in ("none", "egress"):
            raise ValueError(f"network must be 'none' or 'egress', got {self.network!r}")
        for path in self.ro_binds:
            if not isinstance(path, str) or not path.startswith("/"):
                raise ValueError(f"a read-only bind must be an absolute path: {path!r}")
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
        ``[setpriv …, bwrap …, --, (bridge …,) *argv]``; run it with :func:`confined_env`.

    Raises:
        SandboxUnavailable: bwrap, or setpriv for a root worker, is not installed.
        ValueError: ``argv`` is empty.
    """
    if not argv:
        raise ValueError("a confined command needs a program")
    bwrap = bwrap_resolve(profile.bwrap_path)
    if bwrap is None:
        raise SandboxUnavailable(f"bubblewrap ({profile.bwrap_path!r}) is not installed")
    prefix: list[str] = []
    if drops_privileges():
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            raise SandboxUnavailable("setpriv (util-linux) is not installed: cannot drop root for the sandbox")
        prefix = [
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
    for path in profile.ro_binds:
        full += ["--ro-bind", path, path]
    if workdir is not None:
        full += ["--bind", workdir, SANDBOX_WORKDIR]
    else:
        full += ["--size", str(TMPFS_BYTES), "--tmpfs", SANDBOX_WORKDIR]
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
