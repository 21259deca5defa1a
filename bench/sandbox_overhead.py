"""What confinement costs a stdio MCP server: spawn (connect + handshake + tools/list) and
per-call latency of ``mcp-server-time``, confined against started as it is.

Both ways run the same interpreter (``SANDBOX_PYTHON``, the sandbox's virtualenv) and the
same client (the SDK's ``mcp.Client`` over stdio: the platform's own client has no unconfined
way any more); the confined way starts the command line of
:func:`capabilities.confinement.confined_argv`, which adds setpriv
(a root worker drops to the sandbox user), bubblewrap (user, mount, PID, network, IPC and UTS
namespaces, read-only binds, tmpfs) and, with ``--egress``, the egress bridge in front of the
program. Spawns alternate (plain, confined, plain, …) so machine load hits both alike; calls
alternate in blocks of 25 on one open connection each.

Prints p50/p95 per way; not a pass/fail test. Needs bubblewrap and the sandbox's Python
(``scripts/bootstrap.sh``). Run: ``.venv/bin/python bench/sandbox_overhead.py [--spawns 20]
[--calls 300] [--egress]``.
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
from capabilities.confinement import SandboxProfile, bwrap_resolve, confined_argv, confined_env  # noqa: E402

ARGS = ("-m", "mcp_server_time", "--local-timezone", "UTC")
CALL = ("get_current_time", {"timezone": "UTC"})


def ms(values: list[float]) -> str:
    return f"p50 {percentile(values, 0.5) * 1000:7.2f} ms   p95 {percentile(values, 0.95) * 1000:7.2f} ms"


def configs(egress: bool) -> dict[str, StdioServerParameters]:
    profile = SandboxProfile(network="egress" if egress else "none", ro_binds=tuple(settings.SANDBOX_RO_BINDS),
                             uid=settings.SANDBOX_UID, gid=settings.SANDBOX_GID)
    confined = confined_argv([settings.SANDBOX_PYTHON, *ARGS], profile)
    return {
        "as it is": StdioServerParameters(command=settings.SANDBOX_PYTHON, args=list(ARGS)),
        "confined": StdioServerParameters(command=confined[0], args=confined[1:], env=confined_env(profile)),
    }


def connect(params: StdioServerParameters) -> Client:
    return Client(params, cache=None)


async def spawn_once(params: StdioServerParameters) -> float:
    started = time.perf_counter()
    async with connect(params) as client:
        await client.list_tools()
        elapsed = time.perf_counter() - started
    return elapsed


async def main(spawns: int, calls: int, egress: bool) -> None:
    if bwrap_resolve("bwrap") is None or not os.path.exists(settings.SANDBOX_PYTHON):
        sys.exit("needs bubblewrap and the sandbox's Python (scripts/bootstrap.sh)")
    ways = configs(egress)
    print(f"stdio MCP server mcp-server-time, {'egress' if egress else 'no network'} profile; {machine()}")
    spawn_times: dict[str, list[float]] = {name: [] for name in ways}
    for config in ways.values():  # warm the page cache
        await spawn_once(config)
    for _ in range(spawns):
        for name, config in ways.items():
            spawn_times[name].append(await spawn_once(config))
    print(f"spawn + handshake + tools/list, {spawns} each, alternating:")
    for name, values in spawn_times.items():
        print(f"  {name:9s} {ms(values)}")

    call_times: dict[str, list[float]] = {name: [] for name in ways}
    async with connect(ways["as it is"]) as plain, connect(ways["confined"]) as confined:
        connections = {"as it is": plain, "confined": confined}
        for connection in connections.values():
            await connection.list_tools()
            for _ in range(20):
                await connection.call_tool(*CALL)
        block = 25
        for _ in range(max(1, calls // block)):
            for name, connection in connections.items():
                for _ in range(block):
                    started = time.perf_counter()
                    await connection.call_tool(*CALL)
                    call_times[name].append(time.perf_counter() - started)
    print(f"one tools/call on an open connection, {len(call_times['confined'])} each, in blocks of 25:")
    for name, values in call_times.items():
        print(f"  {name:9s} {ms(values)}")
    extra = percentile(spawn_times["confined"], 0.5) - percentile(spawn_times["as it is"], 0.5)
    per_call = percentile(call_times["confined"], 0.5) - percentile(call_times["as it is"], 0.5)
    print(f"confinement adds {extra * 1000:.1f} ms to a spawn (p50) and {per_call * 1000:+.3f} ms to a call (p50)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--spawns", type=int, default=20)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--egress", action="store_true", help="the egress profile (bridge in front of the program)")
    args = parser.parse_args()
    asyncio.run(main(args.spawns, args.calls, args.egress))
