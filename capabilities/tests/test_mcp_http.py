"""McpConnection over Streamable HTTP, against an in-test low-level MCP server (uvicorn thread).

No Django, no database: run with ``pytest capabilities/tests -p no:django``.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator

import pytest

from capabilities.confinement import SandboxProfile
from capabilities.mcp.client import McpConnection
from capabilities.mcp.config import McpServerConfig
from capabilities.mcp.errors import McpConnectError
from capabilities.mcp.operations import McpToolInfo
from capabilities.mcp.tool import MAX_DESCRIPTION_CHARS, McpTool, cap_description, normalize_input_schema
from capabilities.tests.mcp_test_server import (
    TOOLS,
    RunningServer,
    free_closed_port,
    serve_mcp_http,
    silent_listener,
)
from capabilities.tools import ToolContext, ToolError

pytestmark = [pytest.mark.timeout(60), pytest.mark.usefixtures("all_tenants_scope")]

CONTEXT = ToolContext(tenant_id=1, session_id=1, run_id=1, tool_call_id=1)


@pytest.fixture
def mcp_server() -> Iterator[RunningServer]:
    with serve_mcp_http() as server:
        yield server


def http_config(server: RunningServer, **overrides: object) -> McpServerConfig:
    fields: dict[str, object] = {
        "alias": "testsrv",
        "transport": "streamable_http",
        "url": server.url,
        "connect_timeout_seconds": 10.0,
    }
    fields.update(overrides)
    return McpServerConfig(**fields)  # type: ignore[arg-type]


async def test_lists_every_page(mcp_server: RunningServer) -> None:
    async with McpConnection(http_config(mcp_server)) as conn:
        tools = await conn.list_tools()
    assert [tool.name for tool in tools] == [tool.name for tool in TOOLS]
    assert len(tools) == len(TOOLS) > 30  # 4 pages of 10
    assert mcp_server.state.list_cursors == [None, "10", "20", "30"]
    echo = tools[0]
    assert echo == McpToolInfo(
        name="echo",
        description="Echo the text back.",
        input_schema={"type": "object", "properties": {"text": {"type": "string"}}},
    )


async def test_first_call_lists_all_pages_once(mcp_server: RunningServer) -> None:
    """Without a full listing the SDK re-fetches page 1 on every call to a page-3 tool."""
    async with McpConnection(http_config(mcp_server)) as conn:
        results = [await conn.call_tool("filler_20", {}, timeout_seconds=10) for _ in range(3)]
        results += await asyncio.gather(*(conn.call_tool("filler_21", {}, timeout_seconds=10) for _ in range(5)))
    assert [result.content for result in results] == ["ok"] * 8
    assert mcp_server.state.list_cursors == [None, "10", "20", "30"]


async def test_text_result(mcp_server: RunningServer) -> None:
    async with McpConnection(http_config(mcp_server)) as conn:
        result = await conn.call_tool("echo", {"text": "hello"}, timeout_seconds=10)
    assert result.content == "hello"
    assert result.data is None


async def test_structured_content(mcp_server: RunningServer) -> None:
    async with McpConnection(http_config(mcp_server)) as conn:
        result = await conn.call_tool("structured", {"a": 2, "b": 3}, timeout_seconds=10)
    assert result.data == {"sum": 5, "inputs": [2, 3]}
    assert json.loads(result.content) == {"sum": 5, "inputs": [2, 3]}  # no text block: JSON text


async def test_is_error_raises_tool_error(mcp_server: RunningServer) -> None:
    async with McpConnection(http_config(mcp_server)) as conn:
        with pytest.raises(ToolError) as info:
            await conn.call_tool("fail", {"reason": "disk on fire"}, timeout_seconds=10)
    assert info.value.code == "mcp_tool_error"
    assert info.value.message == "failed: disk on fire"


async def test_unknown_tool_is_an_mcp_error(mcp_server: RunningServer) -> None:
    async with McpConnection(http_config(mcp_server)) as conn:
        with pytest.raises(ToolError) as info:
            await conn.call_tool("nope", {}, timeout_seconds=10)
    assert info.value.code == "mcp_error"
    assert "Unknown tool: nope" in info.value.message


async def test_media_blocks_are_summarised(mcp_server: RunningServer) -> None:
    async with McpConnection(http_config(mcp_server)) as conn:
        result = await conn.call_tool("media", {}, timeout_seconds=10)
    assert result.content.splitlines() == [
        "[image image/png, 100 bytes]",
        "[audio audio/wav, 50 bytes]",
        "[resource file:///notes.txt text/plain]",
        "hello notes",
    ]


async def test_headers_are_sent(mcp_server: RunningServer) -> None:
    config = http_config(mcp_server, headers={"X-Test-Token": "s3cret"})
    assert "s3cret" not in repr(config)
    async with McpConnection(config) as conn:
        result = await conn.call_tool("whoami", {}, timeout_seconds=10)
    assert result.content == "s3cret"


async def test_hanging_tool_times_out_and_is_cancelled_on_the_server(mcp_server: RunningServer) -> None:
    async with McpConnection(http_config(mcp_server)) as conn:
        with pytest.raises(ToolError) as info:
            await conn.call_tool("hang", {}, timeout_seconds=0.5)
        # The connection is still usable after the timeout.
        after = await conn.call_tool("echo", {"text": "still here"}, timeout_seconds=10)
        # The client told the server to stop the abandoned call.
        assert await asyncio.to_thread(mcp_server.state.hang_cancelled.wait, 10)
    assert info.value.code == "timeout"
    assert info.value.message == "MCP tool 'hang' timed out after 0.5 s"
    assert after.content == "still here"


async def test_twenty_concurrent_calls_on_one_connection(mcp_server: RunningServer) -> None:
    """Each ``barrier`` call returns only once all 20 are in flight on the server at once."""
    async with McpConnection(http_config(mcp_server)) as conn:
        results = await asyncio.gather(
            *(conn.call_tool("barrier", {"n": 20, "index": i}, timeout_seconds=15) for i in range(20))
        )
    assert [result.content for result in results] == [str(i) for i in range(20)]


async def test_connect_to_closed_port_fails_fast() -> None:
    port = free_closed_port()
    config = McpServerConfig(
        alias="gone", transport="streamable_http", url=f"http://127.0.0.1:{port}/mcp", connect_timeout_seconds=5.0
    )
    started = time.monotonic()
    with pytest.raises(McpConnectError) as info:
        async with McpConnection(config):
            pass
    assert time.monotonic() - started < config.connect_timeout_seconds
    assert info.value.alias == "gone"
    assert "'gone'" in info.value.message
    assert "ConnectError" in info.value.message


async def test_connect_error_does_not_show_url_credentials() -> None:
    port = free_closed_port()
    config = McpServerConfig(
        alias="gone", transport="streamable_http", url=f"http://user:pw@127.0.0.1:{port}/mcp?api_key=k3y"
    )
    with pytest.raises(McpConnectError) as info:
        async with McpConnection(config):
            pass
    assert f"http://127.0.0.1:{port}/mcp" in info.value.message
    assert "k3y" not in info.value.message and "pw" not in info.value.message


async def test_connect_to_silent_server_times_out() -> None:
    with silent_listener() as port:
        config = McpServerConfig(
            alias="mute", transport="streamable_http", url=f"http://127.0.0.1:{port}/mcp", connect_timeout_seconds=0.5
        )
        started = time.monotonic()
        with pytest.raises(McpConnectError) as info:
            async with McpConnection(config):
                pass
        elapsed = time.monotonic() - started
    assert "'mute'" in info.value.message
    assert "timed out after 0.5 s" in info.value.message
    assert elapsed < 5


async def test_server_going_away_fails_calls_without_cancelling_the_caller(mcp_server: RunningServer) -> None:
    async with McpConnection(http_config(mcp_server)) as conn:
        assert (await conn.call_tool("echo", {"text": "1"}, timeout_seconds=10)).content == "1"
        await asyncio.to_thread(mcp_server.stop)
        with pytest.raises(ToolError) as info:
            await conn.call_tool("echo", {"text": "2"}, timeout_seconds=10)
        # This task was not cancelled by the transport failure: it keeps running normally.
        await asyncio.sleep(0)
    assert info.value.code == "mcp_error"


async def test_exit_in_another_task_is_refused(mcp_server: RunningServer) -> None:
    conn = McpConnection(http_config(mcp_server))
    await asyncio.create_task(conn.__aenter__())
    with pytest.raises(RuntimeError, match="different task"):
        await conn.__aexit__(None, None, None)
    # It was closed all the same.
    with pytest.raises(ToolError):
        await conn.call_tool("echo", {"text": "x"}, timeout_seconds=5)


async def test_list_timeout(mcp_server: RunningServer) -> None:
    # A deadline no round trip can meet: the whole listing is bounded.
    async with McpConnection(http_config(mcp_server, list_timeout_seconds=1e-6)) as conn:
        with pytest.raises(ToolError) as info:
            await conn.list_tools()
    assert info.value.code == "timeout"
    assert "'testsrv'" in info.value.message


async def test_mcp_tool_over_http(mcp_server: RunningServer) -> None:
    async with McpConnection(http_config(mcp_server)) as conn:
        infos = {info.name: info for info in await conn.list_tools()}
        tool = McpTool(connection=conn, info=infos["structured"], exposed_name="structured", call_timeout_seconds=5)
        result = await tool.execute({"a": 1, "b": 1}, CONTEXT)
        hang = McpTool(connection=conn, info=infos["hang"], exposed_name="hang", call_timeout_seconds=0.3)
        with pytest.raises(ToolError) as info:
            await hang.execute({}, CONTEXT)
    assert result.data == {"sum": 2, "inputs": [1, 1]}
    assert info.value.code == "timeout"
    assert tool.spec.to_openai()["function"]["parameters"]["properties"] == {
        "a": {"type": "number"},
        "b": {"type": "number"},
    }


# --- pure helpers: config validation, schema normalisation, description cap ----------------


@pytest.mark.parametrize(
    "fields",
    [
        {"alias": "Bad Alias", "transport": "stdio", "command": "x", "sandbox": SandboxProfile()},
        {"alias": "", "transport": "stdio", "command": "x", "sandbox": SandboxProfile()},
        {"alias": "ok", "transport": "stdio", "sandbox": SandboxProfile()},
        {"alias": "ok", "transport": "streamable_http", "url": "ftp://x"},
        {"alias": "ok", "transport": "carrier_pigeon", "command": "x"},
        {"alias": "ok", "transport": "stdio", "command": "x", "sandbox": SandboxProfile(), "connect_timeout_seconds": 0},
        {"alias": "ok", "transport": "stdio", "command": "x", "sandbox": SandboxProfile(),
         "list_timeout_seconds": float("inf")},
    ],
)
def test_invalid_configs_are_rejected(fields: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        McpServerConfig(**fields)  # type: ignore[arg-type]


def test_a_stdio_server_cannot_be_configured_unconfined() -> None:
    """Issue 34: the client had a branch that started a stdio command as it is (sandbox None),
    used only by tests and benchmarks. A stdio configuration without a sandbox profile is refused."""
    with pytest.raises(ValueError, match="runs confined"):
        McpServerConfig(alias="bare", transport="stdio", command="/usr/bin/python3", args=("-m", "x"))


def test_config_is_hashable_and_read_only() -> None:
    headers = {"Authorization": "Bearer 1"}
    config = McpServerConfig(alias="s", transport="streamable_http", url="https://mcp.example.com/", headers=headers)
    headers["Authorization"] = "Bearer 2"
    assert config.headers["Authorization"] == "Bearer 1"
    assert hash(config) == hash(McpServerConfig(
        alias="s", transport="streamable_http", url="https://mcp.example.com/", headers={"Authorization": "Bearer 1"}))
    with pytest.raises(TypeError):
        config.headers["B"] = "3"  # type: ignore[index]


@pytest.mark.parametrize(
    ("schema", "expected"),
    [
        (None, {"type": "object", "properties": {}}),
        ({}, {"type": "object", "properties": {}}),
        ("not a schema", {"type": "object", "properties": {}}),
        ({"type": "string"}, {"type": "object", "properties": {}}),
        ({"type": "object"}, {"type": "object", "properties": {}}),
        ({"properties": {"x": {"type": "integer"}}}, {"type": "object", "properties": {"x": {"type": "integer"}}}),
        (
            {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]},
            {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]},
        ),
    ],
)
def test_normalize_input_schema(schema: object, expected: dict[str, object]) -> None:
    assert normalize_input_schema(schema) == expected


def test_normalize_input_schema_copies() -> None:
    schema = {"type": "object", "properties": {"x": {"type": "integer"}}}
    out = normalize_input_schema(schema)
    out["properties"]["x"]["type"] = "string"
    assert schema["properties"]["x"]["type"] == "integer"


def test_description_is_capped() -> None:
    assert cap_description("  short  ") == "short"
    capped = cap_description("word " * 1000)
    assert len(capped) <= MAX_DESCRIPTION_CHARS
    assert capped.endswith("...")


def test_mcp_tool_rejects_bad_exposed_names() -> None:
    config = McpServerConfig(alias="s", transport="stdio", command="x", sandbox=SandboxProfile())
    info = McpToolInfo(name="t", description="", input_schema={})
    with pytest.raises(ValueError):
        McpTool(connection=McpConnection(config), info=info, exposed_name="has space", call_timeout_seconds=1)
    with pytest.raises(ValueError):
        McpTool(connection=McpConnection(config), info=info, exposed_name="ok", call_timeout_seconds=0)
    tool = McpTool(connection=McpConnection(config), info=info, exposed_name="ok", call_timeout_seconds=1)
    assert tool.spec.description == "Tool 't' of the MCP server 's'."
    assert tool.spec.parameters == {"type": "object", "properties": {}}
