"""Stdio MCP servers for the client's tests, confined the way the platform starts them, and a
look at the host's processes.

A stdio server always runs confined (``McpServerConfig`` requires a sandbox profile): bubblewrap,
the sandbox user (``SANDBOX_UID`` when the tests run as root, through setpriv), the sandbox's own
Python (``SANDBOX_PYTHON``) and the deployment's read-only binds (``SANDBOX_RO_BINDS``), as
:func:`capabilities.catalogue.template_profile` builds them. The checkout is bound read-only on
top, so the in-test server (``capabilities.tests.mcp_test_server``, on ``PYTHONPATH``) is
importable inside; the sandbox user can read it (the tree is world-readable, like
``test_runner_mcp.test_three_servers_are_connected_in_parallel`` needs).

Every server gets a unique *tag* on its command line (``-X tag=…`` for ``mcp-server-time``, an
ignored argument for the test server). The tag appears in the argv of every process of that
server: setpriv/bubblewrap outside, bubblewrap's PID 1 inside, the server and its children; so
:func:`processes` finds all of them on the host, whoever their parent is now (an orphan is
re-parented to the host's init and is no longer a child of the test).
"""

from __future__ import annotations

import asyncio
import os
import signal
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

from capabilities.confinement import SandboxProfile, bwrap_resolve
from capabilities.mcp.config import McpServerConfig

REPO_ROOT = Path(__file__).resolve().parents[2]

needs_sandbox = pytest.mark.skipif(
    bwrap_resolve("bwrap") is None or not os.path.exists(settings.SANDBOX_PYTHON),
    reason="bubblewrap and the sandbox's Python environment (scripts/bootstrap.sh)",
)
"""Skip marker: stdio servers cannot start without bubblewrap and the sandbox's Python."""


def profile(**fields: Any) -> SandboxProfile:
    """The deployment's sandbox profile (settings), with the checkout bound read-only."""
    fields.setdefault("ro_binds", tuple(dict.fromkeys([*settings.SANDBOX_RO_BINDS, str(REPO_ROOT)])))
    fields.setdefault("uid", settings.SANDBOX_UID)
    fields.setdefault("gid", settings.SANDBOX_GID)
    fields.setdefault("bwrap_path", settings.CLI_BWRAP_PATH)
    fields.setdefault("bridge_python", settings.SANDBOX_BRIDGE_PYTHON)
    return SandboxProfile(**fields)


def new_tag() -> str:
    """A unique tag for one server's command line."""
    return f"mcptag-{uuid.uuid4().hex[:12]}"


def time_server(tag: str | None = None, **overrides: Any) -> McpServerConfig:
    """``mcp-server-time --local-timezone UTC``, confined, tagged ``tag`` (``-X tag=…``, which
    CPython keeps in ``sys._xoptions`` and otherwise ignores)."""
    fields: dict[str, Any] = {
        "alias": "time", "transport": "stdio", "command": settings.SANDBOX_PYTHON,
        "args": ("-X", f"tag={tag or new_tag()}", "-m", "mcp_server_time", "--local-timezone", "UTC"),
        "sandbox": profile(), "connect_timeout_seconds": 30.0,
    }
    fields.update(overrides)
    return McpServerConfig(**fields)


def stdio_test_server(tag: str | None = None, *, env: dict[str, str] | None = None, **overrides: Any) -> McpServerConfig:
    """The in-test server over stdio (``mcp_test_server.main_stdio``), confined, tagged ``tag``;
    ``env``: its variables besides ``PYTHONPATH`` (e.g. ``MCP_TEST_STUBBORN``)."""
    fields: dict[str, Any] = {
        "alias": "stdiotest", "transport": "stdio", "command": settings.SANDBOX_PYTHON,
        "args": ("-m", "capabilities.tests.mcp_test_server", tag or new_tag()),
        "sandbox": profile(env={"PYTHONPATH": str(REPO_ROOT), **(env or {})}), "connect_timeout_seconds": 30.0,
    }
    fields.update(overrides)
    return McpServerConfig(**fields)


@dataclass(frozen=True, slots=True)
class HostProcess:
    """A live process as the host sees it (``/proc``)."""

    pid: int
    ppid: int
    uid: int
    """Real uid on the host."""
    argv: tuple[str, ...]


def processes(tag: str) -> dict[int, HostProcess]:
    """Every live (non-zombie) process of the host whose command line contains ``tag``."""
    found: dict[int, HostProcess] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            raw = Path(f"/proc/{entry}/cmdline").read_bytes()
            stat = Path(f"/proc/{entry}/stat").read_text()
            status = Path(f"/proc/{entry}/status").read_text()
        except OSError:
            continue  # exited while we looked
        if tag.encode() not in raw:
            continue
        state, ppid = stat.rsplit(")", 1)[1].split()[:2]
        if state in ("Z", "X"):
            continue
        uid = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("Uid:"))
        argv = tuple(part.decode(errors="replace") for part in raw.split(b"\0")[:-1])
        found[int(entry)] = HostProcess(pid=int(entry), ppid=int(ppid), uid=uid, argv=argv)
    return found


def server_processes(tag: str) -> list[HostProcess]:
    """The servers themselves (the sandbox's Python running a module), not their launchers
    (setpriv/bubblewrap, bubblewrap's PID 1) nor their children."""
    return [p for p in processes(tag).values()
            if p.argv and p.argv[0] == settings.SANDBOX_PYTHON and "-m" in p.argv and "-c" not in p.argv]


def server_process(tag: str) -> HostProcess:
    """The one server tagged ``tag`` (AssertionError unless exactly one runs)."""
    servers = server_processes(tag)
    assert len(servers) == 1, f"expected one server process tagged {tag}, found {servers}"
    return servers[0]


def kill_leftovers(tag: str) -> None:
    """SIGKILL whatever of ``tag`` is still alive (so a failing test leaks nothing)."""
    for pid in processes(tag):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


async def until(predicate: Any, *, timeout_seconds: float = 15.0) -> None:
    """Wait for an observable state (polled every 20 ms); ``TimeoutError`` after ``timeout_seconds``."""
    async with asyncio.timeout(timeout_seconds):
        while not predicate():
            await asyncio.sleep(0.02)
