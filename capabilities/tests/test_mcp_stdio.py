"""McpConnection over stdio, against the real ``mcp-server-time`` (and the test server), confined.

Every stdio server runs in the sandbox the platform starts it in (bubblewrap, the sandbox user,
the sandbox's Python: :mod:`capabilities.tests.confined_servers`); there is no other way to start
one. Linux-only where it inspects ``/proc`` to find and check the server's processes. The
lifecycle against a server that does not cooperate is ``test_mcp_lifecycle.py``.
"""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest
from django.conf import settings

from capabilities.confinement import SANDBOX_PATH
from capabilities.mcp.client import McpConnection
from capabilities.mcp.config import McpServerConfig
from capabilities.mcp.errors import McpConnectError
from capabilities.mcp.tool import McpTool
from capabilities.tests.confined_servers import (
    kill_leftovers,
    needs_sandbox,
    new_tag,
    processes,
    profile,
    server_process,
    stdio_test_server,
    time_server,
    until,
)
from capabilities.tools import ToolContext, ToolError

pytestmark = [
    pytest.mark.timeout(90),
    pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="inspects processes through /proc"),
    needs_sandbox,
    pytest.mark.usefixtures("all_tenants_scope"),
]


@pytest.fixture
def tag():
    tag = new_tag()
    yield tag
    kill_leftovers(tag)


async def gone(tag: str) -> bool:
    """True when no process of the server tagged ``tag`` is alive (waits up to 10 s for the
    kernel to finish tearing the sandbox down)."""
    try:
        await until(lambda: not processes(tag), timeout_seconds=10)
    except TimeoutError:
        return False
    return True


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


async def test_call_timeout_when_the_server_hangs(tag: str) -> None:
    """SIGSTOP freezes the server (inside its sandbox), so the call cannot answer: a real hang."""
    async with McpConnection(time_server(tag)) as conn:
        await conn.list_tools()
        pid = server_process(tag).pid
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


async def test_server_process_is_gone_after_exit(tag: str) -> None:
    async with McpConnection(time_server(tag)) as conn:
        await conn.list_tools()
        assert server_process(tag).uid == (settings.SANDBOX_UID if os.geteuid() == 0 else os.getuid())
    assert await gone(tag)


async def test_server_process_is_gone_when_the_body_raises(tag: str) -> None:
    with pytest.raises(ZeroDivisionError):
        async with McpConnection(time_server(tag)):
            assert server_process(tag)
            1 / 0  # noqa: B018
    assert await gone(tag)


async def test_server_process_is_gone_when_the_body_is_cancelled(tag: str) -> None:
    entered = asyncio.Event()

    async def body() -> None:
        async with McpConnection(time_server(tag)):
            entered.set()
            await asyncio.Event().wait()  # until cancelled

    task = asyncio.create_task(body())
    await entered.wait()
    assert server_process(tag)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await gone(tag)


async def test_server_process_is_gone_after_a_hang_was_cancelled(tag: str) -> None:
    """Exit while the server is stopped mid-call: it cannot read its closed stdin; the launcher's
    process group is killed and the sandbox goes with it (``--die-with-parent``)."""
    async with McpConnection(time_server(tag)) as conn:
        await conn.list_tools()
        os.kill(server_process(tag).pid, signal.SIGSTOP)
        with pytest.raises(ToolError):
            await conn.call_tool("get_current_time", {"timezone": "UTC"}, timeout_seconds=0.2)
    assert await gone(tag)


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
    """The program is looked up inside the sandbox: bubblewrap cannot start it, and says so."""
    config = McpServerConfig(alias="ghost", transport="stdio", command="/nonexistent/mcp-server", sandbox=profile())
    with pytest.raises(McpConnectError) as info:
        async with McpConnection(config):
            pass
    assert "'ghost'" in info.value.message
    assert "/nonexistent/mcp-server: No such file or directory" in info.value.message


async def test_connect_timeout_kills_a_silent_server(tag: str) -> None:
    config = McpServerConfig(
        alias="silent",
        transport="stdio",
        command=settings.SANDBOX_PYTHON,
        args=("-c", f"import time  # {tag}\ntime.sleep(120)"),
        sandbox=profile(),
        connect_timeout_seconds=1.5,
    )
    with pytest.raises(McpConnectError) as info:
        async with McpConnection(config):
            pass
    assert "'silent'" in info.value.message
    assert "timed out after 1.5 s" in info.value.message
    assert await gone(tag)


async def test_environment_is_the_sandboxs_plus_the_profiles(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing of the worker's environment reaches the server: PATH/HOME/LANG and the profile's
    variables (the template's and the tenant's secrets)."""
    monkeypatch.setenv("CAPABILITIES_TEST_SECRET", "do-not-leak")
    config = stdio_test_server(alias="envtest", env={"MY_SETTING": "42"})
    async with McpConnection(config) as conn:
        secret = await conn.call_tool("getenv", {"name": "CAPABILITIES_TEST_SECRET"}, timeout_seconds=10)
        setting = await conn.call_tool("getenv", {"name": "MY_SETTING"}, timeout_seconds=10)
        path = await conn.call_tool("getenv", {"name": "PATH"}, timeout_seconds=10)
    assert secret.content == "<unset>"
    assert setting.content == "42"
    assert path.content == SANDBOX_PATH


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
