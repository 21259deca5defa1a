"""MCP tool call overhead through the platform vs a direct SDK call, and warm vs cold first calls.

Same stdio server for both (``mcp-server-time``, ``get_current_time`` in UTC), confined the same
way (the deployment's sandbox profile; the platform starts no stdio server unconfined):

- direct: one ``mcp.Client`` over stdio, ``await client.call_tool(...)``;
- platform: the tool as a run sees it: ``McpTool.execute`` through a pooled session
  (``capabilities.mcp.pool``): owner-task job queue, catalogue check, breaker, progress
  plumbing and result mapping to ``ToolResult``.

Calls alternate in blocks (direct, platform, direct, ...) so drift on a shared machine hits
both alike. Then the first call of a run on a server the pool already has (warm: catalogue
cached, process running) against a cold one (spawn + handshake + tools/list + call).

Prints figures; not a pass/fail test. Target: platform p50 ≤ direct p50 + 2 ms.
Run: ``.venv/bin/python bench/mcp_overhead.py [--calls 300] [--cold 5]``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "agent_platform.settings")

import django  # noqa: E402

django.setup()

from django.conf import settings  # noqa: E402
from mcp import Client, StdioServerParameters  # noqa: E402

from bench._stats import machine, percentile  # noqa: E402
from capabilities.confinement import SandboxProfile, confined_argv, confined_env  # noqa: E402
from capabilities.mcp.config import McpServerConfig  # noqa: E402
from capabilities.mcp.pool import McpPool  # noqa: E402
from capabilities.mcp.tool import McpTool  # noqa: E402
from capabilities.tools import ToolContext  # noqa: E402

ARGS = ("-m", "mcp_server_time", "--local-timezone", "UTC")
CALL = ("get_current_time", {"timezone": "UTC"})
PROFILE = SandboxProfile(ro_binds=tuple(settings.SANDBOX_RO_BINDS), uid=settings.SANDBOX_UID, gid=settings.SANDBOX_GID)
CONFIG = McpServerConfig(alias="time", transport="stdio", command=settings.SANDBOX_PYTHON, args=ARGS,
                         sandbox=PROFILE, connect_timeout_seconds=30)
CONFINED = confined_argv([settings.SANDBOX_PYTHON, *ARGS], PROFILE)
CONTEXT = ToolContext(tenant_id=1, session_id=1, run_id=1, tool_call_id=1)


def ms(values: list[float]) -> str:
    return f"p50 {percentile(values, 0.5) * 1000:6.2f} ms   p95 {percentile(values, 0.95) * 1000:6.2f} ms"


async def overhead(calls: int) -> None:
    pool = McpPool()
    session = pool.session(tenant_id=1, server_id=1, config=CONFIG)
    info = next(t for t in (await session.catalogue()).tools if t.name == CALL[0])
    tool = McpTool(connection=session, info=info, exposed_name="time__get_current_time", call_timeout_seconds=30)
    direct_times: list[float] = []
    platform_times: list[float] = []
    direct = StdioServerParameters(command=CONFINED[0], args=CONFINED[1:], env=confined_env(PROFILE))
    async with Client(direct, cache=None) as client:
        await client.list_tools()
        for _ in range(20):  # warm both paths
            await client.call_tool(*CALL)
            await tool.execute(CALL[1], CONTEXT)
        block = 25
        for _ in range(max(1, calls // block)):
            for _ in range(block):
                t0 = time.perf_counter()
                await client.call_tool(*CALL)
                direct_times.append(time.perf_counter() - t0)
            for _ in range(block):
                t0 = time.perf_counter()
                await tool.execute(CALL[1], CONTEXT)
                platform_times.append(time.perf_counter() - t0)
    await pool.aclose()
    delta = (percentile(platform_times, 0.5) - percentile(direct_times, 0.5)) * 1000
    print(f"tool call, {len(direct_times)} calls each (mcp-server-time over stdio)")
    print(f"  direct SDK call       {ms(direct_times)}")
    print(f"  platform (pool+tool)  {ms(platform_times)}")
    print(f"  overhead at p50       {delta:+.2f} ms   (target <= +2 ms)")


async def first_calls(cold_runs: int) -> None:
    cold: list[float] = []
    for _ in range(cold_runs):
        pool = McpPool()
        t0 = time.perf_counter()
        session = pool.session(tenant_id=1, server_id=1, config=CONFIG)
        info = next(t for t in (await session.catalogue()).tools if t.name == CALL[0])
        await McpTool(connection=session, info=info, exposed_name="t", call_timeout_seconds=30).execute(CALL[1], CONTEXT)
        cold.append(time.perf_counter() - t0)
        await pool.aclose()
    pool = McpPool()
    await pool.session(tenant_id=1, server_id=1, config=CONFIG).catalogue()
    warm: list[float] = []
    for _ in range(max(20, cold_runs)):
        t0 = time.perf_counter()  # what a new run does: look the session up, read the catalogue, call
        session = pool.session(tenant_id=1, server_id=1, config=CONFIG)
        info = next(t for t in (await session.catalogue()).tools if t.name == CALL[0])
        await McpTool(connection=session, info=info, exposed_name="t", call_timeout_seconds=30).execute(CALL[1], CONTEXT)
        warm.append(time.perf_counter() - t0)
    await pool.aclose()
    print(f"first call of a run: catalogue + call ({len(cold)} cold, {len(warm)} warm)")
    print(f"  cold (spawn, handshake, list, call)  {ms(cold)}")
    print(f"  warm (pooled session)                {ms(warm)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300, help="calls per path (>= 200 for the report)")
    parser.add_argument("--cold", type=int, default=5, help="cold starts to time")
    args = parser.parse_args()
    print(machine())
    asyncio.run(overhead(args.calls))
    asyncio.run(first_calls(args.cold))


if __name__ == "__main__":
    main()
