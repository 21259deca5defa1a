"""McpConnection over stdio, against the real ``mcp-server-time`` (and the test server).

No Django, no database: run with ``pytest capabilities/tests -p no:django``. Linux-only where
it inspects ``/proc`` to find and check the spawned server process.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import pytest

from capabilities.mcp.client import McpConnectError, McpConnection, McpServerConfig
from capabilities.mcp.tool import McpTool
from capabilities.tools import ToolContext, ToolError

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="inspects processes through /proc"),
]

REPO_ROOT = Path(__file__).resolve().parents[2]


def time_server(**overrides: object) -> McpServerConfig:
    """mcp-server-time, started as ``python -m mcp_server_time --local-timezone UTC``.

    ``--local-timezone`` is optional (the server falls back to tzlocal, then UTC); we pass it
    so the tool descriptions do not depend on the host's timezone.
    """
    fields: dict[str, object] = {
        "alias": "time",
        "transport": "stdio",
        "command": sys.executable,
        "args": ("-m", "mcp_server_time", "--local-timezone", "UTC"),
        "connect_timeout_seconds": 20.0,
    }
    fields.update(overrides)
    return McpServerConfig(**fields)  # type: ignore[arg-type]


def _children(marker: str) -> set[int]:
    """Live (non-zombie) child processes of this process whose command line contains ``marker``."""
    found: set[int] = set()
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue  # exited while we looked
        state, ppid = stat.rsplit(")", 1)[1].split()[:2]
        if int(ppid) == me and state != "Z" and marker in cmdline:
            found.add(int(entry))
    return found


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _one_new_server(before: set[int], marker: str = "mcp_server_time") -> int:
    new = _children(marker) - before
    assert len(new) == 1, f"expected one spawned server, found {new}"
    return new.pop()


async def test_lists_time_tools() -> None:
    async with McpConnection(time_server()) as conn:
        tools = {tool.name: tool for tool in await conn.list_tools()}
    assert {"get_current_time", "convert_time"} <= set(tools)
    schema = tools["get_current_time"].input_schema
    assert schema["type"] == "object"
    assert "timezone" in schema["properties"]
    assert tools["get_current_time"].description


async def test_get_current_time_in_tokyo() -> None:
    async with McpConnection(time_server()) as conn:
        result = await conn.call_tool("get_current_time", {"timezone": "Asia/Tokyo"}, timeout_seconds=10)
    assert "Asia/Tokyo" in result.content
    assert isinstance(result.data, dict)
    assert result.data["timezone"] == "Asia/Tokyo"
    assert result.data["datetime"].endswith("+09:00")


async def test_invalid_timezone_is_a_tool_error() -> None:
    async with McpConnection(time_server()) as conn:
        with pytest.raises(ToolError) as info:
            await conn.call_tool("get_current_time", {"timezone": "Mars/Olympus_Mons"}, timeout_seconds=10)
        # The connection stays usable after a tool error.
        ok = await conn.call_tool("get_current_time", {"timezone": "UTC"}, timeout_seconds=10)
    assert info.value.code == "mcp_tool_error"
    assert "Invalid timezone" in info.value.message
    assert "Mars/Olympus_Mons" in info.value.message
    assert ok.data["timezone"] == "UTC"


async def test_unknown_tool_is_an_mcp_error() -> None:
    async with McpConnection(time_server()) as conn:
        with pytest.raises(ToolError) as info:
            await conn.call_tool("no_such_tool", {}, timeout_seconds=10)
    assert info.value.code == "mcp_error"
    assert "'time'" in info.value.message and "no_such_tool" in info.value.message


async def test_call_timeout_when_the_server_hangs() -> None:
    """SIGSTOP freezes the server, so the call cannot answer: a real hang, no racing."""
    before = _children("mcp_server_time")
    async with McpConnection(time_server()) as conn:
        await conn.list_tools()
        pid = _one_new_server(before)
        os.kill(pid, signal.SIGSTOP)
        try:
            with pytest.raises(ToolError) as info:
                await conn.call_tool("get_current_time", {"timezone": "UTC"}, timeout_seconds=0.5)
        finally:
            os.kill(pid, signal.SIGCONT)
        # After the hang the connection still works.
        ok = await conn.call_tool("get_current_time", {"timezone": "Europe/Paris"}, timeout_seconds=10)
    assert info.value.code == "timeout"
    assert info.value.message == "MCP tool 'get_current_time' timed out after 0.5 s"
    assert ok.data["timezone"] == "Europe/Paris"


async def test_concurrent_calls_from_several_tasks() -> None:
    zones = ["Asia/Tokyo", "Europe/Paris", "America/New_York", "UTC", "Australia/Sydney"] * 2
    async with McpConnection(time_server()) as conn:
        results = await asyncio.gather(
            *(conn.call_tool("get_current_time", {"timezone": zone}, timeout_seconds=10) for zone in zones)
        )
    assert [result.data["timezone"] for result in results] == zones


async def test_server_process_is_gone_after_exit() -> None:
    before = _children("mcp_server_time")
    async with McpConnection(time_server()) as conn:
        pid = _one_new_server(before)
        assert _alive(pid)
        await conn.list_tools()
    assert not _alive(pid)


async def test_server_process_is_gone_when_the_body_raises() -> None:
    before = _children("mcp_server_time")
    with pytest.raises(ZeroDivisionError):
        async with McpConnection(time_server()):
            pid = _one_new_server(before)
            1 / 0  # noqa: B018
    assert not _alive(pid)


async def test_server_process_is_gone_when_the_body_is_cancelled() -> None:
    before = _children("mcp_server_time")
    entered = asyncio.Event()
    pids: list[int] = []

    async def body() -> None:
        async with McpConnection(time_server()):
            pids.append(_one_new_server(before))
            entered.set()
            await asyncio.Event().wait()  # until cancelled

    task = asyncio.create_task(body())
    await entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not _alive(pids[0])


async def test_server_process_is_gone_after_a_hang_was_cancelled() -> None:
    """Exit while the server is stopped mid-call: the shutdown escalates to SIGKILL."""
    before = _children("mcp_server_time")
    async with McpConnection(time_server()) as conn:
        await conn.list_tools()
        pid = _one_new_server(before)
        os.kill(pid, signal.SIGSTOP)
        with pytest.raises(ToolError):
            await conn.call_tool("get_current_time", {"timezone": "UTC"}, timeout_seconds=0.2)
    assert not _alive(pid)


async def test_connect_failure_names_the_alias_and_shows_stderr() -> None:
    config = time_server(alias="badtime", args=("-m", "mcp_server_time", "--local-timezone", "Not/AZone"))
    with pytest.raises(McpConnectError) as info:
        async with McpConnection(config):
            pass
    assert info.value.alias == "badtime"
    assert info.value.code == "mcp_connect_error"
    assert "'badtime'" in info.value.message
    assert "invalid --local-timezone" in info.value.message  # the server's own stderr line


async def test_missing_command_is_a_connect_error() -> None:
    config = McpServerConfig(alias="ghost", transport="stdio", command="/nonexistent/mcp-server")
    with pytest.raises(McpConnectError) as info:
        async with McpConnection(config):
            pass
    assert "'ghost'" in info.value.message
    assert "FileNotFoundError" in info.value.message


async def test_connect_timeout_kills_a_silent_server() -> None:
    marker = "silent_mcp_server_marker"
    config = McpServerConfig(
        alias="silent",
        transport="stdio",
        command=sys.executable,
        args=("-c", f"import time  # {marker}\ntime.sleep(120)"),
        connect_timeout_seconds=0.5,
    )
    with pytest.raises(McpConnectError) as info:
        async with McpConnection(config):
            pass
    assert "'silent'" in info.value.message
    assert "timed out after 0.5 s" in info.value.message
    assert _children(marker) == set()


async def test_environment_is_minimal_plus_config_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CAPABILITIES_TEST_SECRET", "do-not-leak")
    config = McpServerConfig(
        alias="envtest",
        transport="stdio",
        command=sys.executable,
        args=("-m", "capabilities.tests.mcp_test_server"),
        env={"PYTHONPATH": str(REPO_ROOT), "MY_SETTING": "42"},
        connect_timeout_seconds=20.0,
    )
    async with McpConnection(config) as conn:
        secret = await conn.call_tool("getenv", {"name": "CAPABILITIES_TEST_SECRET"}, timeout_seconds=10)
        setting = await conn.call_tool("getenv", {"name": "MY_SETTING"}, timeout_seconds=10)
        path = await conn.call_tool("getenv", {"name": "PATH"}, timeout_seconds=10)
    assert secret.content == "<unset>"
    assert setting.content == "42"
    assert path.content == os.environ["PATH"]


async def test_mcp_tool_wraps_a_listed_tool() -> None:
    async with McpConnection(time_server()) as conn:
        info = next(tool for tool in await conn.list_tools() if tool.name == "get_current_time")
        tool = McpTool(connection=conn, info=info, exposed_name="time__get_current_time", call_timeout_seconds=10)
        context = ToolContext(tenant_id=1, session_id=1, run_id=1, tool_call_id=1)
        result = await tool.execute({"timezone": "Asia/Tokyo"}, context)
    assert tool.spec.name == "time__get_current_time"
    assert tool.spec.description == "Get current time in a specific timezone"
    assert tool.spec.parameters["type"] == "object"
    assert "timezone" in tool.spec.parameters["properties"]
    assert result.data["timezone"] == "Asia/Tokyo"


async def test_use_after_exit_is_a_tool_error() -> None:
    conn = McpConnection(time_server())
    async with conn:
        pass
    with pytest.raises(ToolError) as info:
        await conn.call_tool("get_current_time", {"timezone": "UTC"}, timeout_seconds=5)
    assert info.value.code == "mcp_error"
    assert "closed" in info.value.message
