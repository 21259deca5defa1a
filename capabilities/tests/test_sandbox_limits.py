"""Resource limits of confined programs (issue 34): a CPU loop, a memory hog, a fork loop, too
many open files and too large a file each end as a failed tool call that names the limit, and
the worker keeps serving other calls, during and after.

Real bubblewrap, setpriv and prlimit; no database. The programs are bounded on their own (a loop
of 8 CPU-seconds, 600 MB, 200 children), so that without the limits they finish, and the tests
fail, instead of taking the shared machine down.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest

from capabilities.catalogue import ProgramTemplate, operator_limits, template_limits
from capabilities.cli.tool import CliCommandConfig, CliTool
from capabilities.confinement import (
    SandboxLimits,
    SandboxProfile,
    bwrap_resolve,
    confined_argv,
    drops_privileges,
    limit_exceeded,
)
from capabilities.mcp.client import McpConnection
from capabilities.mcp.config import McpServerConfig
from capabilities.tools import ToolContext, ToolError

pytestmark = [
    pytest.mark.timeout(180),
    pytest.mark.skipif(bwrap_resolve("bwrap") is None, reason="bubblewrap is not installed (scripts/bootstrap.sh)"),
    pytest.mark.usefixtures("all_tenants_scope"),
]

CONTEXT = ToolContext(tenant_id=1, session_id=1, run_id=1, tool_call_id=1)

SMALL = SandboxLimits(cpu_seconds=2, memory_mb=200, processes=4096, file_size_mb=1, open_files=64)
"""Small enough for fast tests; ``processes`` is set per test (it counts host-wide, see below)."""

CPU_LOOP = (
    "import time\n"
    "start = time.process_time()\n"
    "while time.process_time() - start < 8:\n"
    "    pass\n"
    "print('finished 8 s of CPU')\n"
)
MEMORY_HOG = (
    "held = []\n"
    "for _ in range(12):\n"
    "    held.append(bytearray(50 * 1024 * 1024))\n"
    "print('allocated', 50 * len(held), 'MB')\n"
)
FORK_LOOP = (
    "import os, sys, time\n"
    "children = 0\n"
    "for _ in range(200):\n"
    "    pid = os.fork()\n"
    "    if pid == 0:\n"
    "        time.sleep(60)\n"
    "        os._exit(0)\n"
    "    children += 1\n"
    "print('forked', children, 'children')\n"
)
FORK_BOMB = (
    "import os, sys, time\n"
    "told = False\n"
    "while True:\n"
    "    try:\n"
    "        os.fork()\n"
    "    except OSError as exc:\n"
    "        if not told:\n"
    "            sys.stderr.write('fork failed: %s\\n' % exc)\n"
    "            sys.stderr.flush()\n"
    "            told = True\n"
    "        time.sleep(0.2)\n"
)
"""A fork bomb: every process forks for ever (a failed fork waits 0.2 s, so that the bomb at its
limit does not also spin two cores). Only ever run with the process limit in place."""
OPEN_FILES = (
    "files = [open('/dev/null') for _ in range(500)]\n"
    "print('opened', len(files), 'files')\n"
)
BIG_FILE = (
    "with open('big.bin', 'wb') as out:\n"
    "    for _ in range(20):\n"
    "        out.write(b'x' * 1024 * 1024)\n"
    "print('wrote 20 MB')\n"
)


def _tool(code: str, limits: SandboxLimits, *, timeout_seconds: float = 60) -> CliTool:
    return CliTool(CliCommandConfig(
        name="probe", description="", argv_template=("python3", "-c", code),
        parameters_schema={"type": "object", "properties": {}}, timeout_seconds=timeout_seconds,
        profile=SandboxProfile(limits=limits),
    ))


def _sandbox_user_tasks() -> int:
    """Tasks (threads included) on the host whose real uid is the sandbox user's: what
    ``RLIMIT_NPROC`` compares a confined program's limit with."""
    uid = 65534 if drops_privileges() else os.getuid()
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            status = Path(f"/proc/{entry}/status").read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        if int(fields.get("Uid", "-1 0").split()[0]) == uid:
            total += int(fields.get("Threads", "1"))
    return total


def _bomb_processes() -> int:
    """Processes on the host running :data:`FORK_BOMB`."""
    marker = FORK_BOMB.encode()
    count = 0
    for entry in os.listdir("/proc"):
        try:
            count += entry.isdigit() and marker in Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
    return count


async def _still_serves() -> None:
    result = await _tool("print('still serving')", SandboxLimits()).execute({}, CONTEXT)
    assert result.data["exit_code"] == 0 and result.data["stdout"] == "still serving\n", result.content


# --- CLI commands --------------------------------------------------------------------------


async def test_a_cpu_loop_ends_as_a_failed_call_naming_the_cpu_limit_while_others_are_served() -> None:
    hog = asyncio.ensure_future(_tool(CPU_LOOP, SMALL).execute({}, CONTEXT))
    await _still_serves()  # while the loop runs
    with pytest.raises(ToolError) as caught:
        await hog
    assert caught.value.code == "resource_limit"
    assert "CPU time limit (2 s per process) exceeded" in caught.value.message, caught.value.message
    assert "finished" not in caught.value.message
    await _still_serves()


async def test_a_memory_hog_ends_as_a_failed_call_naming_the_memory_limit() -> None:
    with pytest.raises(ToolError) as caught:
        await _tool(MEMORY_HOG, SMALL).execute({}, CONTEXT)
    assert caught.value.code == "resource_limit"
    message = caught.value.message
    assert "memory limit (200 MiB per process) reached" in message, message
    assert "MemoryError" in message, "the program's own error follows"
    await _still_serves()


@pytest.mark.skipif(not drops_privileges(), reason="RLIMIT_NPROC is only set for a root worker")
@pytest.mark.host_exclusive  # another xdist worker's confined programs would take its room (conftest.py)
async def test_a_fork_loop_ends_as_a_failed_call_naming_the_process_limit() -> None:
    # RLIMIT_NPROC counts every task of the sandbox user on the host (other sandboxes' too):
    # room for 20 more than run now, far below the loop's 200 children.
    limits = SandboxLimits(**{**_fields(SMALL), "processes": _sandbox_user_tasks() + 20})
    with pytest.raises(ToolError) as caught:
        await _tool(FORK_LOOP, limits).execute({}, CONTEXT)
    assert caught.value.code == "resource_limit"
    message = caught.value.message
    assert f"process limit ({limits.processes} tasks of the sandbox's user) reached" in message, message
    assert "forked 200" not in message
    await _still_serves()


@pytest.mark.skipif(not drops_privileges(), reason="RLIMIT_NPROC is only set for a root worker")
@pytest.mark.host_exclusive  # another xdist worker's confined programs would take its room (conftest.py)
async def test_a_fork_bomb_is_held_at_the_process_limit_and_ends_as_a_failed_call_while_others_are_served() -> None:
    limits = SandboxLimits(**{**_fields(SMALL), "processes": _sandbox_user_tasks() + 20})
    assert f"--nproc={limits.processes}" in confined_argv(["true"], SandboxProfile(limits=limits)), \
        "never start a fork bomb without its limit"
    with pytest.raises(ToolError):  # the bounded loop first: the limit holds here
        await _tool(FORK_LOOP, limits).execute({}, CONTEXT)
    bomb = asyncio.ensure_future(_tool(FORK_BOMB, limits, timeout_seconds=6).execute({}, CONTEXT))
    await asyncio.sleep(2)
    held = _bomb_processes()
    assert 5 <= held <= limits.processes, f"{held} processes: it forked, and is held at the limit"
    await _still_serves()  # while the bomb holds its processes
    with pytest.raises(ToolError) as caught:
        await bomb
    assert caught.value.code == "resource_limit"
    assert f"process limit ({limits.processes} tasks of the sandbox's user) reached" in caught.value.message
    assert "timed out after 6 s" in caught.value.message, caught.value.message
    # The sandbox's PID namespace ends with its launcher: the kernel kills every process in it
    # (reaping a few dozen can take a moment on a loaded machine).
    for _ in range(100):
        if _bomb_processes() == 0:
            break
        await asyncio.sleep(0.1)
    assert _bomb_processes() == 0, "the bomb's processes are gone"
    await _still_serves()


@pytest.mark.parametrize(("code", "reason"), [
    (OPEN_FILES, "open files limit (64 per process) reached"),
    (BIG_FILE, "file size limit (1 MiB) exceeded"),
], ids=["open_files", "file_size"])
async def test_open_files_and_file_size_are_limited_too(code: str, reason: str) -> None:
    with pytest.raises(ToolError) as caught:
        await _tool(code, SMALL).execute({}, CONTEXT)
    assert caught.value.code == "resource_limit" and reason in caught.value.message, caught.value.message


async def test_a_program_within_its_limits_is_an_ordinary_result() -> None:
    result = await _tool("print(sum(range(10**6)))", SMALL).execute({}, CONTEXT)
    assert result.data["exit_code"] == 0 and result.data["stdout"] == "499999500000\n"


# --- a stdio MCP server --------------------------------------------------------------------


MCP_SERVER = r'''
import json, sys, time

def send(message):
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()

TOOLS = [{"name": name, "description": name, "inputSchema": {"type": "object", "properties": {}}}
         for name in ("hog", "echo")]
for line in sys.stdin:
    request = json.loads(line)
    method, rid = request.get("method"), request.get("id")
    if rid is None:
        continue
    if method == "initialize":
        send({"jsonrpc": "2.0", "id": rid, "result": {
            "protocolVersion": request["params"]["protocolVersion"], "capabilities": {"tools": {}},
            "serverInfo": {"name": "limits", "version": "1"}}})
    elif method == "tools/list":
        send({"jsonrpc": "2.0", "id": rid, "result": {"tools": TOOLS}})
    elif method == "tools/call" and request["params"]["name"] == "hog":
        held = []
        try:
            for _ in range(12):
                held.append(bytearray(50 * 1024 * 1024))
            text, failed = "allocated %d MB" % (50 * len(held)), False
        except MemoryError:
            text, failed = "MemoryError after %d MB" % (50 * len(held)), True
        del held
        send({"jsonrpc": "2.0", "id": rid, "result": {"content": [{"type": "text", "text": text}], "isError": failed}})
    elif method == "tools/call":
        send({"jsonrpc": "2.0", "id": rid, "result": {"content": [{"type": "text", "text": "echo"}]}})
    else:
        send({"jsonrpc": "2.0", "id": rid, "error": {"code": -32601, "message": "Method not found"}})
'''
"""A stdio MCP server of the standard library only (it runs on the sandbox's /usr/bin/python3):
``hog`` allocates 600 MB and answers with the MemoryError it met, ``echo`` answers."""


async def test_a_memory_hog_in_a_stdio_mcp_server_fails_its_call_and_the_server_keeps_serving() -> None:
    config = McpServerConfig(
        alias="limits", transport="stdio", command="/usr/bin/python3", args=("-c", MCP_SERVER),
        sandbox=SandboxProfile(limits=SMALL), protocol_mode="legacy", connect_timeout_seconds=60,
    )
    async with McpConnection(config) as connection:
        with pytest.raises(ToolError) as caught:
            await connection.call_tool("hog", {}, timeout_seconds=60)
        assert "MemoryError after" in caught.value.message, caught.value.message
        assert (await connection.call_tool("echo", {}, timeout_seconds=30)).content == "echo"


# --- the operator's maximum and the template's values ---------------------------------------


def _fields(limits: SandboxLimits) -> dict[str, int]:
    return {name: getattr(limits, name) for name in ("cpu_seconds", "memory_mb", "processes", "file_size_mb",
                                                     "open_files")}


def test_a_templates_limits_are_clamped_to_the_operators_maximum(settings: Any) -> None:
    settings.SANDBOX_LIMITS = {"cpu_seconds": 30, "memory_mb": 512, "processes": 100, "file_size_mb": 8,
                               "open_files": 128}
    template = ProgramTemplate(slug="t", name="t", kind="cli", argv=["true"],
                               limits={"cpu_seconds": 5, "memory_mb": 4096})
    assert _fields(template_limits(template)) == {
        "cpu_seconds": 5, "memory_mb": 512, "processes": 100, "file_size_mb": 8, "open_files": 128}
    assert template_limits(ProgramTemplate(slug="u", name="u", kind="cli", argv=["true"])) == operator_limits()


@pytest.mark.parametrize(("value", "expected"), [
    ("", {"cpu_seconds": 300, "memory_mb": 2048, "processes": 256, "file_size_mb": 256, "open_files": 1024}),
    ("cpu_seconds=120, memory_mb=1024", {"cpu_seconds": 120, "memory_mb": 1024, "processes": 256,
                                         "file_size_mb": 256, "open_files": 1024}),
    ("wall_seconds=5", "SANDBOX_LIMITS: 'wall_seconds=5' is not name=positive integer"),
    ("memory_mb=0", "SANDBOX_LIMITS: 'memory_mb=0' is not name=positive integer"),
])
def test_the_operators_maximum_comes_from_the_environment(value: str, expected: Any) -> None:
    import base64
    import json
    import subprocess
    import sys

    env = {"PATH": os.environ["PATH"], "SANDBOX_LIMITS": value, "SECRETS_FILE": "", "SECRET_KEY": "k" * 60,
           "ENCRYPTION_KEY": base64.urlsafe_b64encode(os.urandom(32)).decode()}
    result = subprocess.run(
        [sys.executable, "-c", "import json; from agent_platform import settings; print(json.dumps(settings.SANDBOX_LIMITS))"],
        env=env, cwd=str(Path(__file__).resolve().parents[2]), capture_output=True, text=True, timeout=60)
    if isinstance(expected, dict):
        assert json.loads(result.stdout) == expected, result.stderr
    else:
        assert result.returncode != 0 and expected in result.stderr, result.stderr


@pytest.mark.django_db
def test_the_shipped_catalogue_limits_factor(settings: Any) -> None:
    from django.core.management import call_command

    settings.SANDBOX_LIMITS = {}
    call_command("catalogue_import", str(Path(__file__).resolve().parents[2] / "deploy" / "catalogue.yaml"))
    factor = template_limits(ProgramTemplate.objects.get(slug="factor"))
    assert (factor.cpu_seconds, factor.memory_mb) == (10, 256)
    assert template_limits(ProgramTemplate.objects.get(slug="mcp-server-fetch")) == SandboxLimits()


def test_the_limits_are_on_the_command_line_of_every_confined_program() -> None:
    argv = confined_argv(["true"], SandboxProfile(limits=SMALL))
    assert argv[0].endswith("prlimit") and argv.index("--") < argv.index("--unshare-all")
    options = argv[1:argv.index("--")]
    assert {"--cpu=2:3", f"--data={200 * 1024 * 1024}", f"--fsize={1024 * 1024}", "--nofile=64"} <= set(options)
    assert ("--nproc=4096" in options) == drops_privileges()


def test_a_non_root_worker_caps_the_limits_at_its_own_and_leaves_the_process_count(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A non-root worker cannot raise a hard limit (prlimit would fail), and its programs share
    its uid: RLIMIT_NPROC would count the worker's own threads."""
    import resource

    from capabilities import confinement

    hard = {resource.RLIMIT_CPU: resource.RLIM_INFINITY, resource.RLIMIT_DATA: 100 * 1024 * 1024,
            resource.RLIMIT_FSIZE: resource.RLIM_INFINITY, resource.RLIMIT_NOFILE: 32}
    monkeypatch.setattr(confinement, "drops_privileges", lambda: False)
    monkeypatch.setattr(confinement.resource, "getrlimit", lambda kind: (0, hard[kind]))
    options = confinement.limits_argv(SMALL)[1:-1]
    assert options == ["--cpu=2:3", f"--data={100 * 1024 * 1024}", f"--fsize={1024 * 1024}", "--nofile=32"]


def test_a_template_with_malformed_limits_is_refused() -> None:
    template = ProgramTemplate(slug="t", name="t", kind="mcp_stdio", argv=["${PYTHON}"],
                               limits={"cpu_seconds": 0, "wall_seconds": 5, "memory_mb": True})
    from django.core.exceptions import ValidationError

    with pytest.raises(ValidationError) as caught:
        template.clean()
    messages = caught.value.message_dict["limits"]
    assert messages == ["cpu_seconds: a positive integer.",
                        "'wall_seconds' is not a limit (cpu_seconds, memory_mb, processes, file_size_mb, open_files).",
                        "memory_mb: a positive integer."], messages


@pytest.mark.parametrize(("exit_code", "stderr", "expected"), [
    (152, "", "CPU time limit (2 s per process) exceeded"),
    (-24, "", "CPU time limit (2 s per process) exceeded"),
    (153, "", "file size limit (1 MiB) exceeded"),
    (1, "BlockingIOError: [Errno 11] Resource temporarily unavailable", "process limit"),
    (2, "sh: 1: Cannot fork", "process limit"),
    (-9, "bash: fork: retry: Resource temporarily unavailable", "process limit"),
    (1, "MemoryError", "memory limit (200 MiB"),
    (1, "OSError: [Errno 24] Too many open files", "open files limit (64 per process)"),
    (0, "MemoryError (handled)", None),
    (1, "grep: nothing", None),
    (137, "", None),
])
def test_limit_exceeded_reads_the_signal_and_the_programs_own_error(
    exit_code: int, stderr: str, expected: str | None
) -> None:
    reason = limit_exceeded(limits=SMALL, exit_code=exit_code, stderr=stderr)
    assert (reason is None) if expected is None else (reason is not None and expected in reason), reason
