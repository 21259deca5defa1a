"""The MCP client pool against real servers: the in-test server (Streamable HTTP, legacy SSE,
stdio), ``mcp-server-time`` and ``mcp-server-fetch`` (stdio, confined like every stdio server:
:mod:`capabilities.tests.confined_servers`).

No database. Each test closes its pool (the ``pool`` fixture), so no server process outlives it.
"""

from __future__ import annotations

import asyncio
import http.server
import json
import os
import random
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from capabilities.mcp.config import McpServerConfig
from capabilities.mcp.errors import McpConnectError, McpConnectionLost
from capabilities.mcp.pool import CircuitBreaker, McpPool, McpServerUnavailable
from capabilities.mcp.tool import McpTool
from capabilities.tests.confined_servers import (
    kill_leftovers,
    needs_sandbox,
    new_tag,
    processes,
    profile,
    server_process,
    server_processes,
    stdio_test_server,
    time_server,
    until,
)
from capabilities.tests.mcp_test_server import (
    PNG_BYTES,
    TOOLS,
    RunningServer,
    free_closed_port,
    serve_mcp_http,
)
from capabilities.tools import ToolContext, ToolError

pytestmark = [
    pytest.mark.timeout(90),
    pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="inspects processes through /proc"),
    pytest.mark.usefixtures("all_tenants_scope"),
]


class FakeClock:
    """A monotonic clock the test moves by hand (breaker cool-downs, catalogue TTL)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class RecordingContext(ToolContext):
    """A ToolContext that records events and keeps artifacts in memory (no database)."""

    def __init__(self) -> None:
        super().__init__(tenant_id=1, session_id=1, run_id=1, tool_call_id=7)
        self.events: list[tuple[str, dict[str, Any]]] = []
        self.artifacts: dict[int, tuple[str, str, bytes]] = {}

        async def publish(event_type: str, data: dict[str, Any]) -> None:
            self.events.append((event_type, data))

        self.publish = publish

    async def artifact_save(self, *, name: str, mime_type: str, data: bytes) -> int:
        artifact_id = 100 + len(self.artifacts)
        self.artifacts[artifact_id] = (name, mime_type, data)
        return artifact_id


@pytest.fixture
def mcp_server() -> Iterator[RunningServer]:
    with serve_mcp_http() as server:
        yield server


def http_config(url: str, **overrides: Any) -> McpServerConfig:
    fields: dict[str, Any] = {"alias": "testsrv", "transport": "streamable_http", "url": url,
                              "connect_timeout_seconds": 10.0}
    fields.update(overrides)
    return McpServerConfig(**fields)


@pytest.fixture
def tag() -> Iterator[str]:
    tag = new_tag()
    yield tag
    kill_leftovers(tag)


def server_pids(tag: str) -> set[int]:
    """Host pids of the servers tagged ``tag`` (inside their sandboxes)."""
    return {p.pid for p in server_processes(tag)}


def text(result: Any) -> str:
    return "\n".join(block.text for block in result.content)


# --- catalogue ------------------------------------------------------------------------------


async def test_catalogue_lists_every_page_once_and_is_cached(pool: McpPool, mcp_server: RunningServer) -> None:
    session = pool.session(tenant_id=1, server_id=1, config=http_config(mcp_server.url))
    assert session.state == "idle", "connected lazily: nothing happens before first use"
    first, second = await asyncio.gather(session.catalogue(), session.catalogue())
    again = await session.catalogue()
    assert first is second is again
    assert [t.name for t in first.tools] == [t.name for t in TOOLS]
    assert mcp_server.state.list_cursors == [None, "10", "20", "30"], "one listing, every page"
    assert session.state == "ready" and session.connects == 1


async def test_list_changed_notification_refreshes_the_catalogue(pool: McpPool, mcp_server: RunningServer) -> None:
    session = pool.session(tenant_id=1, server_id=1, config=http_config(mcp_server.url))
    before = await session.catalogue()
    changed = session.list_changed
    await session.call_tool_raw("add_tool", {"name": "brand_new"}, timeout_seconds=10)
    await asyncio.wait_for(changed.wait(), 10)
    after = await session.catalogue()
    assert session.protocol_version == "2026-07-28", "Streamable HTTP: a subscriptions/listen stream"
    assert after.version == before.version + 1
    assert [t.name for t in after.tools] == [t.name for t in TOOLS] + ["brand_new"]
    assert text(await session.call_tool_raw("brand_new", {}, timeout_seconds=10)) == "brand_new ok"


async def test_list_changed_on_a_legacy_sse_connection(pool: McpPool) -> None:
    with serve_mcp_http(transport="sse") as server:
        config = http_config(server.url, transport="sse", protocol_mode="legacy")
        session = pool.session(tenant_id=1, server_id=1, config=config)
        before = await session.catalogue()
        assert session.protocol_version == "2025-11-25", "handshake era: a plain notification"
        changed = session.list_changed
        await session.call_tool_raw("add_tool", {"name": "late_tool"}, timeout_seconds=10)
        await asyncio.wait_for(changed.wait(), 10)
        after = await session.catalogue()
        await pool.aclose()
    assert len(after.tools) == len(before.tools) + 1 and after.tools[-1].name == "late_tool"


async def test_catalogue_is_refreshed_after_its_ttl(mcp_server: RunningServer) -> None:
    clock = FakeClock()
    pool = McpPool(catalogue_ttl_seconds=60, clock=clock)
    try:
        session = pool.session(tenant_id=1, server_id=1, config=http_config(mcp_server.url))
        first = await session.catalogue()
        clock.now += 59
        assert await session.catalogue() is first
        clock.now += 2
        refreshed = await session.catalogue()
    finally:
        await pool.aclose()
    assert refreshed is not first and refreshed.version == first.version, "same tools: same version"
    assert mcp_server.state.list_cursors.count(None) == 2


# --- results ---------------------------------------------------------------------------------


async def test_results_structured_image_error_and_progress(pool: McpPool, mcp_server: RunningServer) -> None:
    session = pool.session(tenant_id=1, server_id=1, config=http_config(mcp_server.url))
    infos = {t.name: t for t in (await session.catalogue()).tools}

    def tool(name: str) -> McpTool:
        return McpTool(connection=session, info=infos[name], exposed_name=f"testsrv__{name}", call_timeout_seconds=10)

    context = RecordingContext()
    structured = await tool("structured").execute({"a": 2, "b": 3}, context)
    media = await tool("media").execute({}, context)
    progress = await tool("progress").execute({"steps": 3}, context)
    with pytest.raises(ToolError) as failed:
        await tool("fail").execute({"reason": "disk on fire"}, context)

    assert structured.data == {"sum": 5, "inputs": [2, 3]}
    assert json.loads(structured.content) == {"sum": 5, "inputs": [2, 3]}
    [(image_id, image), (audio_id, audio)] = context.artifacts.items()
    assert image == ("testsrv-media-1.png", "image/png", PNG_BYTES)
    assert audio[1] == "audio/wav"
    assert media.content.splitlines()[:2] == [
        f"[image: artifact:{image_id}, image/png, 100 bytes]",
        f"[audio: artifact:{audio_id}, audio/wav, 50 bytes]",
    ]
    assert progress.content == "done"
    assert [data for kind, data in context.events if kind == "tool_call_progress"] == [  # step 2: throttled
        {"tool_call_id": 7, "message": f"step {i} of 3", "progress": float(i), "total": 3.0} for i in (1, 3)
    ]
    assert (failed.value.code, failed.value.message) == ("mcp_tool_error", "failed: disk on fire")


async def test_a_hanging_call_times_out_and_the_session_stays(pool: McpPool, mcp_server: RunningServer) -> None:
    session = pool.session(tenant_id=1, server_id=1, config=http_config(mcp_server.url, call_timeout_seconds=0.5))
    with pytest.raises(ToolError) as info:
        await session.call_tool_raw("hang", {}, timeout_seconds=30)  # the server's 0.5 s wins
    assert (info.value.code, info.value.message) == ("timeout", "MCP tool 'hang' timed out after 0.5 s")
    assert await asyncio.to_thread(mcp_server.state.hang_cancelled.wait, 10), "the server was told to stop"
    assert text(await session.call_tool_raw("echo", {"text": "still here"}, timeout_seconds=10)) == "still here"
    assert session.connects == 1 and session.breaker.state == "closed"


# --- concurrency and cancellation --------------------------------------------------------------


async def test_fifty_concurrent_calls_with_random_cancellations(pool: McpPool, mcp_server: RunningServer) -> None:
    session = pool.session(tenant_id=1, server_id=1, config=http_config(mcp_server.url))
    await session.connect()
    rng = random.Random(5)
    tasks = [
        asyncio.create_task(
            session.call_tool_raw("sleep_echo", {"text": f"call-{i}", "seconds": rng.uniform(0.0, 0.3)},
                                  timeout_seconds=20)
        )
        for i in range(50)
    ]
    doomed = set(rng.sample(range(50), 15))
    for i in sorted(doomed, key=lambda _: rng.random()):
        await asyncio.sleep(rng.uniform(0, 0.02))
        tasks[i].cancel()
    outcomes = await asyncio.gather(*tasks, return_exceptions=True)

    for i, outcome in enumerate(outcomes):
        if isinstance(outcome, asyncio.CancelledError):
            assert i in doomed
            continue
        assert not isinstance(outcome, BaseException), f"call {i} failed: {outcome!r}"
        assert text(outcome) == f"call-{i}", "every call gets its own result"
    assert sum(isinstance(o, asyncio.CancelledError) for o in outcomes) >= 1
    # The session survived every cancellation: same connection, still answering.
    after = await asyncio.gather(*(session.call_tool_raw("echo", {"text": str(i)}, timeout_seconds=10) for i in range(5)))
    assert [text(r) for r in after] == ["0", "1", "2", "3", "4"]
    assert session.connects == 1 and session._in_flight == 0


async def test_a_cancelled_caller_cancels_only_its_own_call(pool: McpPool, mcp_server: RunningServer) -> None:
    session = pool.session(tenant_id=1, server_id=1, config=http_config(mcp_server.url))
    hanging = asyncio.create_task(session.call_tool_raw("hang", {}, timeout_seconds=30))
    slow = asyncio.create_task(session.call_tool_raw("sleep_echo", {"text": "mine", "seconds": 0.3}, timeout_seconds=30))
    await until(lambda: mcp_server.state.hang_started == 1)
    hanging.cancel()
    with pytest.raises(asyncio.CancelledError):
        await hanging
    assert text(await slow) == "mine"
    assert await asyncio.to_thread(mcp_server.state.hang_cancelled.wait, 10), "the server saw the cancel"
    assert session.state == "ready" and session.connects == 1


# --- crashes and reconnects ----------------------------------------------------------------------


async def test_http_server_crash_fails_the_call_then_reconnects(pool: McpPool) -> None:
    with serve_mcp_http() as server:
        port = int(server.url.rsplit(":", 1)[1].split("/")[0])
        session = pool.session(tenant_id=1, server_id=1, config=http_config(server.url, call_timeout_seconds=60))
        await session.catalogue()
        hanging = asyncio.create_task(session.call_tool_raw("hang", {}, timeout_seconds=60))
        await until(lambda: server.state.hang_started == 1)
        await asyncio.to_thread(server.crash)
        with pytest.raises(ToolError) as info:
            await asyncio.wait_for(hanging, 20)  # a clear failure, long before the 60 s timeout
    assert info.value.code == "mcp_error" and "'testsrv'" in info.value.message
    with serve_mcp_http(port) as restarted:
        result = await session.call_tool_raw("echo", {"text": "back"}, timeout_seconds=10)
        assert text(result) == "back"
        assert restarted.state.calls == 1


@needs_sandbox
async def test_stdio_server_crash_fails_the_call_then_respawns(pool: McpPool, tag: str) -> None:
    session = pool.session(tenant_id=1, server_id=1, config=stdio_test_server(tag))
    await session.call_tool_raw("pid", {}, timeout_seconds=10)
    first_pid = server_process(tag).pid  # on the host (inside, a sandbox's pids start at 1)
    with pytest.raises(McpConnectionLost) as info:
        await session.call_tool_raw("crash", {}, timeout_seconds=10)
    assert "'stdiotest'" in info.value.message and info.value.code == "mcp_error"
    await session.call_tool_raw("pid", {}, timeout_seconds=10)
    assert server_pids(tag) - {first_pid} and session.connects == 2


@needs_sandbox
@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_a_stdio_server_that_exited_between_calls_is_respawned_by_the_next_call(
    pool: McpPool, tag: str, mode: str,
) -> None:
    """The server ends while no call is in flight (nothing fails then): the next call notices
    that the transport ended and reconnects, instead of failing on the dead pipe (issue 35:
    the pool tracks the end of the transport itself, not through the SDK's internals). On a
    handshake-era (legacy) connection no tool-change subscription is there to notice it first."""
    session = pool.session(tenant_id=1, server_id=1, config=stdio_test_server(tag, protocol_mode=mode))
    await session.call_tool_raw("pid", {}, timeout_seconds=10)
    first_pid = server_process(tag).pid
    os.kill(first_pid, signal.SIGKILL)
    await until(lambda: session.transport_ended)  # the pipe's end is seen, no call in flight
    result = await session.call_tool_raw("pid", {}, timeout_seconds=10)
    assert not result.is_error and session.connects == 2
    assert server_pids(tag) - {first_pid}


# --- reuse, eviction, edits ------------------------------------------------------------------------


@needs_sandbox
async def test_sessions_are_reused_per_tenant_and_server(pool: McpPool, tag: str) -> None:
    config = time_server(tag)
    a = pool.session(tenant_id=1, server_id=1, config=config)
    await a.call_tool_raw("get_current_time", {"timezone": "UTC"}, timeout_seconds=10)
    again = pool.session(tenant_id=1, server_id=1, config=time_server(tag))
    await again.call_tool_raw("get_current_time", {"timezone": "Asia/Tokyo"}, timeout_seconds=10)
    other_tenant = pool.session(tenant_id=2, server_id=1, config=config)
    await other_tenant.catalogue()
    assert again is a and other_tenant is not a
    assert len(server_pids(tag)) == 2, "one process per (tenant, server)"
    assert pool.connects == 2


@needs_sandbox
async def test_an_edited_server_gets_a_new_session_and_the_old_one_closes(pool: McpPool, tag: str) -> None:
    old = pool.session(tenant_id=1, server_id=1, config=time_server(tag))
    await old.catalogue()
    old_sandbox = set(processes(tag))
    new = pool.session(tenant_id=1, server_id=1, config=time_server(tag, call_timeout_seconds=5))
    assert new is not old and new.key.fingerprint != old.key.fingerprint
    await new.catalogue()
    await until(lambda: not old_sandbox & set(processes(tag)))
    assert old.state == "closed" and pool.sessions == [new]


@needs_sandbox
async def test_idle_session_is_evicted_and_its_process_exits(tag: str) -> None:
    pool = McpPool(idle_timeout_seconds=0.3)
    try:
        session = pool.session(tenant_id=1, server_id=1, config=time_server(tag))
        release = session.lease()
        await session.call_tool_raw("get_current_time", {"timezone": "UTC"}, timeout_seconds=10)
        sandbox = set(processes(tag))
        await asyncio.sleep(0.6)
        assert sandbox <= set(processes(tag)), "a leased session is not evicted"
        release()
        await until(lambda: not processes(tag))
        assert session.state == "idle"
        await session.call_tool_raw("get_current_time", {"timezone": "UTC"}, timeout_seconds=10)
        assert session.connects == 2, "the next use reconnects"
    finally:
        await pool.aclose()


# --- circuit breaker -------------------------------------------------------------------------------


def test_circuit_breaker_states() -> None:
    clock = FakeClock()
    breaker = CircuitBreaker(failure_threshold=2, cooldown_seconds=30, clock=clock)
    breaker.before_attempt("x")
    breaker.record_failure()
    assert breaker.state == "closed"
    breaker.record_failure()
    assert breaker.state == "open"
    with pytest.raises(McpServerUnavailable) as info:
        breaker.before_attempt("x")
    assert info.value.code == "mcp_unavailable" and "in 30 s" in info.value.message
    clock.now += 30
    assert breaker.state == "half_open"
    breaker.before_attempt("x")  # the one probe
    with pytest.raises(McpServerUnavailable):
        breaker.before_attempt("x")  # a second caller while the probe runs
    breaker.record_failure()
    assert breaker.state == "open", "a failed probe opens it again"
    clock.now += 30
    breaker.before_attempt("x")
    breaker.record_success()
    assert breaker.state == "closed" and breaker.failures == 0


async def test_breaker_opens_on_a_dead_server_and_half_opens_when_it_is_back() -> None:
    clock = FakeClock()
    pool = McpPool(breaker_failure_threshold=2, breaker_cooldown_seconds=30, clock=clock)
    port = free_closed_port()
    config = http_config(f"http://127.0.0.1:{port}/mcp", connect_timeout_seconds=5)
    try:
        session = pool.session(tenant_id=1, server_id=1, config=config)
        for _ in range(2):
            with pytest.raises(McpConnectError):
                await session.catalogue()
        assert session.breaker.state == "open"
        with pytest.raises(McpServerUnavailable):
            await session.call_tool_raw("echo", {"text": "x"}, timeout_seconds=5)
        with serve_mcp_http(port) as server:
            with pytest.raises(McpServerUnavailable):
                await session.catalogue()  # still cooling down: the server is not even tried
            assert server.state.list_cursors == []
            clock.now += 31
            assert session.breaker.state == "half_open"
            result = await session.call_tool_raw("echo", {"text": "probe"}, timeout_seconds=10)
            assert text(result) == "probe" and session.breaker.state == "closed"
            await pool.aclose()
    finally:
        await pool.aclose()


# --- mcp-server-fetch (stdio, offline against a local HTTP server) ------------------------------------


class _Page(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        body = b"<html><head><title>Local</title></head><body><article><h1>Hello offline</h1>" \
               b"<p>The fetch server read this page from 127.0.0.1.</p></article></body></html>"
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def local_site() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Page)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/page"
    finally:
        server.shutdown()
        server.server_close()


@needs_sandbox
async def test_mcp_server_fetch_reads_a_local_page(pool: McpPool, local_site: str, settings: Any) -> None:
    """Confined with egress: the page is on the host's 127.0.0.1, which the egress proxy lets
    through only because this test allow-lists it (``--allow-private-ips`` switches off the
    server's own check)."""
    settings.SANDBOX_EGRESS_ALLOWED_CIDRS = ["127.0.0.1/32"]
    config = McpServerConfig(
        alias="fetch", transport="stdio", command=settings.SANDBOX_PYTHON,
        args=("-m", "mcp_server_fetch", "--ignore-robots-txt", "--allow-private-ips"),
        sandbox=profile(network="egress"), connect_timeout_seconds=60,
    )
    session = pool.session(tenant_id=1, server_id=1, config=config)
    catalogue = await session.catalogue()
    assert "fetch" in [t.name for t in catalogue.tools]
    result = await session.call_tool_raw("fetch", {"url": local_site}, timeout_seconds=30)
    assert "Hello offline" in text(result)


def test_new_sandbox_limits_make_a_new_fingerprint() -> None:
    """An operator who lowers a template's limits gets new server processes, not the pooled
    one started under the old limits."""
    import dataclasses

    from capabilities.confinement import SandboxLimits

    config = time_server("limits")
    lowered = dataclasses.replace(config.sandbox, limits=SandboxLimits(cpu_seconds=5))
    assert time_server("limits").fingerprint == config.fingerprint
    assert time_server("limits", sandbox=lowered).fingerprint != config.fingerprint
