"""Running one argv in a bubblewrap sandbox: timeout, output cap, streamed output.

No Django imports. :func:`run_command` is the whole interface; :func:`bwrap_argv` is the
sandbox's definition, kept apart so it can be read (and tested) on its own.

The sandbox (bubblewrap 0.8, Debian 12's ``bubblewrap`` package; flags from bwrap(1)):

- ``--unshare-all``: new user, mount, PID, IPC, UTS, cgroup and network namespaces. The
  network namespace has only a down loopback, so nothing can be reached, not even
  127.0.0.1 of the host; ``--share-net`` (``allow_network``) keeps the host's network.
- ``--unshare-user --uid 65534 --gid 65534``: the command runs as ``nobody`` inside its
  user namespace, with no capabilities; ``--disable-userns``: it cannot create further user
  namespaces (less kernel attack surface).
- ``--die-with-parent``: the sandbox is killed when the worker dies; ``--new-session``: the
  command cannot inject keystrokes into a controlling terminal (TIOCSTI, CVE-2017-5226).
- Read-only binds of ``/usr`` and of the merged-/usr symlinks (``/bin``, ``/lib``, ...; real
  directories are read-only bound instead when the host is not merged-/usr), and of a
  minimal list of ``/etc`` files (:data:`ETC_FILES`: the dynamic loader cache, alternatives,
  users/groups, name service, TLS roots, time zone): no host secrets under ``/etc``.
- ``--proc /proc`` (the sandbox's own PIDs), ``--dev /dev`` (null, zero, random, tty...),
  ``--tmpfs /tmp`` of :data:`TMPFS_BYTES`, and a fresh empty host directory bound writable at ``/work`` (the cwd
  and ``$HOME``), deleted after the run. ``--remount-ro /`` then makes the sandbox's own
  root (a tmpfs holding the mount points, e.g. ``/etc``) read-only: only ``/work`` and
  ``/tmp`` can be written.
- The environment is exactly ``PATH``, ``HOME``, ``LANG`` plus the command's own variables.
  They are handed to ``bwrap`` as its process environment (which bwrap passes on), not as
  ``--setenv`` arguments, so secrets never appear in a process listing (``/proc/*/cmdline``).

Output: stdout and stderr are read concurrently; each keeps its first ``max_output_bytes``
bytes and counts the rest. When a stream passes ``KILL_FACTOR`` x the cap the process is
killed (no point reading gigabytes to throw them away). Complete lines within the cap are
handed to ``on_output`` in batches, at most every ``PROGRESS_INTERVAL_SECONDS``.

Timeout and cancellation: the whole process group of ``bwrap`` gets SIGKILL; inside the
sandbox, bwrap's PID 1 then dies (``--die-with-parent``) and the kernel kills every process
of the PID namespace, so children (even ``setsid`` ones) go too; the same happens when the
command exits normally. Unsandboxed commands run in a new session whose process group is
killed at the end of every call (also after a normal exit); a child that starts its own
session escapes that (one reason to keep the sandbox).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import signal
import tempfile
import time
from dataclasses import dataclass, field
from typing import Awaitable, Callable

SANDBOX_WORKDIR = "/work"
"""Where the fresh writable directory appears inside the sandbox (cwd and ``$HOME``)."""

SANDBOX_PATH = "/usr/local/bin:/usr/bin:/bin"
SANDBOX_LANG = "C.UTF-8"
SANDBOX_UID = 65534
"""``nobody`` on Debian."""

ETC_FILES = (
    "/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/alternatives",
    "/etc/passwd", "/etc/group", "/etc/nsswitch.conf", "/etc/host.conf", "/etc/hosts", "/etc/resolv.conf",
    "/etc/gai.conf", "/etc/services", "/etc/protocols", "/etc/ssl", "/etc/ca-certificates",
    "/etc/localtime", "/etc/timezone", "/etc/mime.types", "/etc/magic", "/etc/python3", "/etc/python3.11",
)
"""``/etc`` entries visible (read-only) in the sandbox when the host has them."""

ROOT_LINKS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
"""Top-level entries recreated as symlinks (merged /usr) or bound read-only."""

TMPFS_BYTES = 64 * 1024 * 1024
"""Size of the sandbox's ``/tmp`` (memory-backed): 64 MiB."""

KILL_FACTOR = 16
"""A stream more than this many times over ``max_output_bytes`` gets the process killed."""

PROGRESS_INTERVAL_SECONDS = 0.25
"""Shortest time between two ``on_output`` batches."""

READ_CHUNK_BYTES = 64 * 1024

DRAIN_SECONDS = 1.0
"""After the process ended or was killed, how long to wait for its pipes to close."""

OnOutput = Callable[[str, str], Awaitable[None]]
"""``await on_output(stream, text)``: ``stream`` is ``"stdout"`` or ``"stderr"``; ``text`` whole lines."""


class SandboxUnavailable(Exception):
    """``bwrap`` is not installed where configured (and the command is not unsandboxed)."""


@dataclass(frozen=True, slots=True)
class SandboxPolicy:
    """How one command may run."""

    timeout_seconds: float = 30.0
    """Wall clock from start to kill; positive."""
    max_output_bytes: int = 64 * 1024
    """Kept per stream (stdout and stderr each); the rest is counted and dropped."""
    allow_network: bool = False
    """True: the host's network namespace (``--share-net``); False: no network at all."""
    env: dict[str, str] = field(default_factory=dict)
    """Extra environment variables (decrypted secrets allowed: never put on a command line)."""
    unsandboxed: bool = False
    """True: run directly on the host (only a new session, a temp cwd and a clean environment)."""
    bwrap_path: str = "bwrap"
    """The ``bwrap`` executable: a name looked up on the worker's ``PATH``, or a path."""


@dataclass(frozen=True, slots=True)
class CommandResult:
    """What a command did."""

    exit_code: int | None
    """The exit status; negative: killed by that signal; None: did not start or still unknown."""
    stdout: str
    """The first ``max_output_bytes`` of stdout, decoded as UTF-8 (invalid bytes replaced)."""
    stderr: str
    stdout_dropped_bytes: int = 0
    """Bytes of stdout beyond the cap (counted until the process ended or was killed)."""
    stderr_dropped_bytes: int = 0
    timed_out: bool = False
    output_limit_exceeded: bool = False
    """Killed because a stream passed ``KILL_FACTOR`` x the cap."""
    duration_ms: int = 0
    sandboxed: bool = True

    @property
    def truncated(self) -> bool:
        return bool(self.stdout_dropped_bytes or self.stderr_dropped_bytes)


def bwrap_resolve(bwrap_path: str) -> str | None:
    """The absolute path of ``bwrap_path`` if it is an executable (or a name on PATH), else None."""
    if os.sep in bwrap_path:
        return bwrap_path if os.path.isfile(bwrap_path) and os.access(bwrap_path, os.X_OK) else None
    return shutil.which(bwrap_path)


def bwrap_argv(*, bwrap: str, workdir: str, allow_network: bool) -> list[str]:
    """The ``bwrap`` arguments (up to and including ``--``) for one sandboxed command.

    Args:
        bwrap: The bwrap executable. workdir: Host directory bound writable at ``/work``.
        allow_network: Keep the host network (``--share-net``).
    """
    argv = [bwrap, "--unshare-all"]
    if allow_network:
        argv.append("--share-net")
    argv += [
        "--unshare-user", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID), "--disable-userns",
        "--die-with-parent", "--new-session", "--hostname", "sandbox",
        "--ro-bind", "/usr", "/usr",
    ]
    for path in ROOT_LINKS:
        if os.path.islink(path):
            argv += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            argv += ["--ro-bind", path, path]
    for path in ETC_FILES:
        argv += ["--ro-bind-try", path, path]
    argv += [
        "--proc", "/proc", "--dev", "/dev", "--size", str(TMPFS_BYTES), "--tmpfs", "/tmp",
        "--bind", workdir, SANDBOX_WORKDIR, "--remount-ro", "/", "--chdir", SANDBOX_WORKDIR,
        "--",
    ]
    return argv


_ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _environment(policy: SandboxPolicy, home: str) -> dict[str, str]:
    env = {"PATH": SANDBOX_PATH, "HOME": home, "LANG": SANDBOX_LANG}
    for name, value in policy.env.items():
        if not _ENV_NAME_RE.fullmatch(str(name)) or "\0" in str(value):
            raise ValueError(f"invalid environment variable {name!r}")
        env[str(name)] = str(value)
    return env


class _Stream:
    """One output stream: kept bytes, dropped count, and the not-yet-published lines."""

    def __init__(self, name: str, cap: int) -> None:
        self.name = name
        self.cap = cap
        self.kept = bytearray()
        self.dropped = 0
        self.pending = bytearray()  # kept bytes not yet handed to on_output

    def feed(self, chunk: bytes) -> None:
        room = self.cap - len(self.kept)
        if room > 0:
            self.kept += chunk[:room]
            self.pending += chunk[:room]
        self.dropped += max(0, len(chunk) - max(room, 0))

    def take_lines(self, *, final: bool) -> str:
        """Complete lines waiting to be published (everything when ``final``)."""
        end = len(self.pending) if final else self.pending.rfind(b"\n") + 1
        if end <= 0:
            return ""
        text = bytes(self.pending[:end]).decode("utf-8", "replace")
        del self.pending[:end]
        return text


async def run_command(argv: list[str], policy: SandboxPolicy, *, on_output: OnOutput | None = None) -> CommandResult:
    """Run ``argv`` under ``policy`` and collect its output.

    Args:
        argv: Program and arguments (already validated; never passed through a shell).
        policy: Sandbox, limits and environment.
        on_output: Receives batches of complete output lines while the command runs.

    Returns:
        The result; a non-zero exit, a timeout or an over-limit kill are results, not errors.

    Raises:
        SandboxUnavailable: ``policy.bwrap_path`` is not an executable and not unsandboxed.
        FileNotFoundError / PermissionError: unsandboxed and the program cannot be executed.
        asyncio.CancelledError: propagated after the process group has been killed.
    """
    workdir = tempfile.mkdtemp(prefix="ap-cli-")
    try:
        if policy.unsandboxed:
            full = list(argv)
            env = _environment(policy, home=workdir)
            cwd = workdir
        else:
            bwrap = bwrap_resolve(policy.bwrap_path)
            if bwrap is None:
                raise SandboxUnavailable(f"bubblewrap ({policy.bwrap_path!r}) is not installed")
            full = bwrap_argv(bwrap=bwrap, workdir=workdir, allow_network=policy.allow_network) + list(argv)
            env = _environment(policy, home=SANDBOX_WORKDIR)
            cwd = "/"
        return await _run(full, env=env, cwd=cwd, policy=policy, on_output=on_output)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


async def _run(
    full: list[str], *, env: dict[str, str], cwd: str, policy: SandboxPolicy, on_output: OnOutput | None
) -> CommandResult:
    started = time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        *full, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env=env, cwd=cwd, start_new_session=True,
    )
    streams = {"stdout": _Stream("stdout", policy.max_output_bytes), "stderr": _Stream("stderr", policy.max_output_bytes)}
    kill_at = policy.max_output_bytes * KILL_FACTOR
    over_limit = asyncio.Event()
    new_output = asyncio.Event()

    async def pump(name: str, reader: asyncio.StreamReader) -> None:
        stream = streams[name]
        # Reads to EOF even past the kill limit (counting, not keeping): a transport that stops
        # being read never sees its pipe close, and the process would never be reaped.
        while chunk := await reader.read(READ_CHUNK_BYTES):
            stream.feed(chunk)
            new_output.set()
            if len(stream.kept) + stream.dropped > kill_at:
                over_limit.set()

    async def publish(final: bool) -> None:
        if on_output is None:
            return
        for stream in streams.values():
            text = stream.take_lines(final=final)
            if text:
                await on_output(stream.name, text)

    async def publisher() -> None:
        while True:
            await new_output.wait()
            new_output.clear()
            await publish(final=False)
            await asyncio.sleep(PROGRESS_INTERVAL_SECONDS)

    pumps = asyncio.gather(pump("stdout", proc.stdout), pump("stderr", proc.stderr))  # type: ignore[arg-type]
    limit_task = asyncio.ensure_future(over_limit.wait())
    publisher_task = asyncio.ensure_future(publisher())
    timed_out = False
    try:
        done, _ = await asyncio.wait({pumps, limit_task}, timeout=policy.timeout_seconds,
                                     return_when=asyncio.FIRST_COMPLETED)
        if not done:
            timed_out = True
        if over_limit.is_set() or timed_out:
            _kill_group(proc)
        else:
            await pumps  # both streams closed: the process (and any child holding them) is done
        try:
            await asyncio.wait_for(proc.wait(), timeout=max(1.0, policy.timeout_seconds - (time.monotonic() - started)))
        except TimeoutError:  # output closed but the process lingers: give it no more time
            timed_out = True
            _kill_group(proc)
            await proc.wait()
        # What was written before the kill is still in the pipes: take it (they close with the sandbox).
        await asyncio.wait({pumps}, timeout=DRAIN_SECONDS)
        publisher_task.cancel()  # the final batch is published below, after the pumps are done
    finally:
        # Also on cancellation (the run was cancelled, or the agent's tool timeout hit): the
        # whole group goes, the process is reaped and its pipes read to EOF, so that nothing
        # outlives the call (not even an asyncio transport).
        _kill_group(proc)  # whatever is left of the group
        limit_task.cancel()
        publisher_task.cancel()
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await asyncio.shield(proc.wait())
        if not pumps.done():
            await asyncio.wait({pumps}, timeout=DRAIN_SECONDS)
        pumps.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await asyncio.gather(limit_task, publisher_task, pumps, return_exceptions=True)
    await publish(final=True)
    return CommandResult(
        exit_code=proc.returncode,
        stdout=bytes(streams["stdout"].kept).decode("utf-8", "replace"),
        stderr=bytes(streams["stderr"].kept).decode("utf-8", "replace"),
        stdout_dropped_bytes=streams["stdout"].dropped,
        stderr_dropped_bytes=streams["stderr"].dropped,
        timed_out=timed_out,
        output_limit_exceeded=over_limit.is_set(),
        duration_ms=int((time.monotonic() - started) * 1000),
        sandboxed=not policy.unsandboxed,
    )


def _kill_group(proc: asyncio.subprocess.Process) -> None:
    """SIGKILL the process group led by ``proc`` (it was started in a new session).

    Also after ``proc`` itself exited: a background child left in its group (unsandboxed
    ``sh -c "daemon &"``) must not outlive the call. The group id stays reserved by the
    kernel while any member lives, so this cannot hit an unrelated group then; once the
    group is empty the call fails with ESRCH (ignored).
    """
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
