"""What the CLI capability adds to running a command: validation, the sandbox, output handling.

Runs ``factor 12`` (GNU coreutils; the demo command) ``--iterations`` times each way,
interleaved so that machine load hits every way alike:

1. **direct**: ``asyncio.create_subprocess_exec`` + ``communicate()``, nothing else;
2. **confined**: :func:`capabilities.cli.sandbox.run_command`: setpriv (a root worker drops to
   the sandbox user), bubblewrap (namespaces, binds, /proc, tmpfs), temp work dir, capped
   concurrent reading (there is no unconfined mode any more);
3. **tool**: ``CliTool.execute`` confined (schema validation, argv rendering,
   progress events to a no-op publisher, result rendering).

Prints p50/p95 wall time per call and the overhead of each way over ``direct``. No Django,
no database. Run: ``.venv/bin/python bench/cli_overhead.py [--iterations 200]``.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import argparse  # noqa: E402
import asyncio  # noqa: E402
import time  # noqa: E402
from typing import Any  # noqa: E402

from _stats import machine, percentile  # noqa: E402

from capabilities.cli.sandbox import SandboxPolicy, run_command  # noqa: E402
from capabilities.cli.tool import CliCommandConfig, CliTool  # noqa: E402
from capabilities.confinement import bwrap_resolve  # noqa: E402
from capabilities.tools import ToolContext  # noqa: E402

ARGV = ["factor", "--", "12"]
SCHEMA = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 1}}, "required": ["n"]}


async def _direct() -> None:
    proc = await asyncio.create_subprocess_exec(*ARGV, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, _ = await proc.communicate()
    assert out == b"12: 2 2 3\n"


async def _bwrap() -> None:
    result = await run_command(ARGV, SandboxPolicy())
    assert result.stdout == "12: 2 2 3\n", result


async def _noop_publish(type_: str, data: dict[str, Any]) -> None:
    return None


TOOL = CliTool(CliCommandConfig(name="factor", description="", argv_template=("factor", "--", "{n}"),
                                parameters_schema=SCHEMA))
CONTEXT = ToolContext(tenant_id=0, session_id=0, run_id=0, tool_call_id=0, publish=_noop_publish)


async def _tool() -> None:
    result = await TOOL.execute({"n": 12}, CONTEXT)
    assert result.data["stdout"] == "12: 2 2 3\n"


async def main(iterations: int) -> None:
    if bwrap_resolve("bwrap") is None:
        sys.exit("bwrap is not installed (scripts/bootstrap.sh installs it)")
    ways = {"direct": _direct, "confined": _bwrap, "tool (confined)": _tool}
    times: dict[str, list[float]] = {name: [] for name in ways}
    for fn in ways.values():  # warm up (page cache, imports)
        await fn()
    for _ in range(iterations):
        for name, fn in ways.items():
            started = time.perf_counter()
            await fn()
            times[name].append((time.perf_counter() - started) * 1000)
    print(f"CLI call overhead: `{' '.join(ARGV)}`, {iterations} calls each, interleaved")
    print(machine())
    base50, base95 = percentile(times["direct"], 0.5), percentile(times["direct"], 0.95)
    print(f"{'way':<14} {'p50 ms':>8} {'p95 ms':>8} {'+p50 ms':>8} {'+p95 ms':>8}")
    for name, values in times.items():
        p50, p95 = percentile(values, 0.5), percentile(values, 0.95)
        print(f"{name:<14} {p50:8.2f} {p95:8.2f} {p50 - base50:8.2f} {p95 - base95:8.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=200)
    asyncio.run(main(parser.parse_args().iterations))
