"""Running one argv confined: timeout, output cap, streamed output.

No Django imports. :func:`run_command` is the whole interface. The sandbox itself (bubblewrap,
a non-root host user, no network or the egress proxy, no view of the host) is defined once, in
:mod:`capabilities.confinement`, for CLI commands and stdio MCP servers alike. A CLI command
gets a fresh host directory as its ``/home/sandbox`` (cwd and ``$HOME``, owned by the sandbox
user, deleted after the call). There is no unconfined mode.

Output: stdout and stderr are read concurrently; each keeps its first ``max_output_bytes``
bytes and counts the rest. When a stream passes ``KILL_FACTOR`` x the cap the process is
killed (no point reading gigabytes to throw them away). Complete lines within the cap are
handed to ``on_output`` in batches, at most every ``PROGRESS_INTERVAL_SECONDS``.

Resource limits: the profile's :class:`~capabilities.confinement.SandboxLimits` (CPU time,
address space, processes, file size, open files) hold for every process of the command; when
its end shows that it hit one (:func:`~capabilities.confinement.limit_exceeded`), the result
names it in ``limit_exceeded``.

Timeout and cancellation: the whole process group of the launcher gets SIGKILL; inside the
sandbox, bwrap's PID 1 then dies (``--die-with-parent``) and the kernel kills every process
of the PID namespace, so children (even ``setsid`` ones) go too; the same happens when the
command exits normally.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from agent_platform import metrics
from capabilities.confinement import (
    SANDBOX_WORKDIR,
    SandboxProfile,
    SandboxUnavailable,
    confined_argv,
    confined_env,
    limit_exceeded,
    workdir_prepare,
)

__all__ = ["CommandResult", "SandboxPolicy", "SandboxUnavailable", "SANDBOX_WORKDIR", "run_command"]

KILL_FACTOR = 16
"""A stream more than this many times over ``max_output_bytes`` gets the process killed."""

PROGRESS_INTERVAL_SECONDS = 0.25
"""Shortest time between two ``on_output`` batches."""

READ_CHUNK_BYTES = 64 * 1024

DRAIN_SECONDS = 1.0
"""After the process ended or was killed, how long to wait for its pipes to close."""

OnOutput = Callable[[str, str], Awaitable[None]]
"""``await on_output(stream, text)``: ``stream`` is ``"stdout"`` or ``"stderr"``; ``text`` whole lines."""


@dataclass(frozen=True, slots=True)
class SandboxPolicy:
    """How one command may run."""

    timeout_seconds: float = 30.0
    """Wall clock from start to kill; positive."""
    max_output_bytes: int = 64 * 1024
    """Kept per stream (stdout and stderr each); the rest is counted and dropped."""
    profile: SandboxProfile = field(default_factory=SandboxProfile)
    """The sandbox: network, read-only binds, environment (decrypted secrets allowed), user."""


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
    """Always True (kept in the result for the API's readers)."""
    limit_exceeded: str | None = None
    """The resource limit the command evidently hit (e.g. ``"CPU time limit (10 s per process)
    exceeded"``), else None."""

    @property
    def truncated(self) -> bool:
        return bool(self.stdout_dropped_bytes or self.stderr_dropped_bytes)


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
    """Run ``argv`` confined by ``policy.profile`` and collect its output.

    Args:
        argv: Program and arguments (already validated; never passed through a shell).
        policy: Limits and the sandbox profile.
        on_output: Receives batches of complete output lines while the command runs.

    Returns:
        The result; a non-zero exit, a timeout, an over-limit kill or a resource limit hit
        (``limit_exceeded``) are results, not errors (a program missing inside the sandbox is
        bwrap's exit 1 with its message on stderr).

    Raises:
        SandboxUnavailable: bubblewrap (or setpriv, for a root worker) is not installed.
        asyncio.CancelledError: propagated after the process group has been killed.
    """
    workdir = tempfile.mkdtemp(prefix="ap-cli-")
    try:
        workdir_prepare(workdir, policy.profile)
        full = confined_argv(argv, policy.profile, workdir=workdir)
        metrics.sandbox_spawned("cli")
        result = await _run(full, env=confined_env(policy.profile), cwd="/", policy=policy, on_output=on_output)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    reason = limit_exceeded(limits=policy.profile.limits, exit_code=result.exit_code, stderr=result.stderr)
    return dataclasses.replace(result, limit_exceeded=reason) if reason else result


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
        sandboxed=True,
    )


def _kill_group(proc: asyncio.subprocess.Process) -> None:
    """SIGKILL the process group led by ``proc`` (it was started in a new session).

    Also after ``proc`` itself exited: nothing left in its group may outlive the call. The group id stays reserved by the
    kernel while any member lives, so this cannot hit an unrelated group then; once the
    group is empty the call fails with ESRCH (ignored).
    """
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
