"""CLI commands: template rules, argument injection, and the confinement, for real.

Every test here runs real processes (``bwrap`` from Debian's ``bubblewrap`` package, installed
by ``scripts/bootstrap.sh``; ``python3``, ``sh``, ``factor`` from the host's /usr). No
database: the tool is built from a :class:`CliCommandConfig` directly. The runner, the model
and the console are in ``test_cli_runner.py`` and ``test_cli_models.py``.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from capabilities.cli.template import ArgumentsInvalid, render_argv, render_value, template_errors
from capabilities.cli.tool import CliCommandConfig, CliTool
from capabilities.confinement import ROOT_LINKS, SandboxProfile, bwrap_resolve
from capabilities.tools import ToolContext, ToolError

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(bwrap_resolve("bwrap") is None, reason="bubblewrap is not installed (scripts/bootstrap.sh)"),
    pytest.mark.usefixtures("all_tenants_scope"),
]

REPO_ROOT = Path(__file__).resolve().parents[2]

PRINT_ARGV = "import sys, json; print(json.dumps(sys.argv[1:]))"
"""A program that prints the argv it received: what reached it, element by element."""

ALL_TYPES_SCHEMA = {
    "type": "object",
    "properties": {
        "s": {"type": "string"},
        "i": {"type": "integer"},
        "n": {"type": "number"},
        "b": {"type": "boolean"},
        "e": {"enum": ["alpha", "beta"]},
    },
    "required": ["s", "i", "n", "b", "e"],
}
VALID = {"s": "text", "i": 7, "n": 2.5, "b": True, "e": "alpha"}

INJECTIONS = [
    "; rm -rf /",
    "; touch {marker}",
    "$(touch {marker})",
    "`touch {marker}`",
    "x\ntouch {marker}",
    "x && touch {marker}",
    "x || touch {marker}",
    "x | tee {marker}",
    "> {marker}",
    "'; touch {marker}; '",
    '"; touch {marker}; "',
    "*",
    "/usr/*",
    "~",
    "${{HOME}}",
    "a b c",
    "",
]


class Events:
    """Collects what a tool publishes (``context.publish``)."""

    def __init__(self) -> None:
        self.items: list[tuple[str, dict[str, Any], float]] = []

    async def __call__(self, type_: str, data: dict[str, Any]) -> None:
        self.items.append((type_, data, time.monotonic()))

    def of(self, type_: str) -> list[dict[str, Any]]:
        return [d for t, d, _ in self.items if t == type_]


def context(events: Events | None = None) -> ToolContext:
    return ToolContext(tenant_id=1, session_id=1, run_id=1, tool_call_id=42, publish=events or Events())


def tool(argv_template: list[str], schema: dict[str, Any] | None = None, **fields: Any) -> CliTool:
    profile = SandboxProfile(
        bwrap_path=fields.pop("bwrap_path", "bwrap"), env=fields.pop("env", {}), network=fields.pop("network", "none"),
    )
    config = CliCommandConfig(
        name=fields.pop("name", "cmd"), description="test command", argv_template=tuple(argv_template),
        parameters_schema=schema or {"type": "object", "properties": {}}, profile=profile, **fields,
    )
    errors = template_errors(list(config.argv_template), config.parameters_schema)
    assert not errors, errors
    return CliTool(config)


def printer(**fields: Any) -> CliTool:
    return tool(
        ["python3", "-c", PRINT_ARGV, "{s}", "{i}", "{n}", "{b}", "{e}", "--flag={s}"], ALL_TYPES_SCHEMA, **fields,
    )


def _processes_with(marker: str) -> list[int]:
    """Live (non-zombie) processes anywhere on the host whose command line contains ``marker``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker in cmdline and state != "Z":
            found.append(int(entry))
    return found


async def _gone(marker: str, *, within_seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + within_seconds
    while _processes_with(marker):
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.05)
    return True


# --- template and schema rules ------------------------------------------------------------


def test_template_rules_are_checked() -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer"}, "opt": {"type": "string"}}, "required": ["n"]}
    assert template_errors(["factor", "--", "{n}"], schema) == {}
    assert template_errors(["date", "-u", "+{n}x{{literal}}"], schema) == {}, "embedded placeholders and escapes"
    assert "argv_template" in template_errors([], schema)
    assert "argv_template" in template_errors("factor {n}", schema)
    assert template_errors(["{n}"], schema)["argv_template"] == [
        "Element 0 (the program) may not contain a placeholder."]
    assert template_errors(["echo", "{missing}"], schema)["argv_template"] == [
        "Placeholder {missing} is not a property of the parameter schema."]
    assert template_errors(["echo", "{opt}"], schema)["argv_template"] == [
        "Placeholder {opt} must be required or have a default in the schema."]
    with_default = {**schema, "properties": {**schema["properties"], "opt": {"type": "string", "default": "x"}}}
    assert template_errors(["echo", "{opt}"], with_default) == {}


def test_schema_rules_are_checked() -> None:
    assert "parameters_schema" in template_errors(["echo"], {"type": "array"})
    nested = {"type": "object", "properties": {"x": {"type": "object"}}}
    assert template_errors(["echo"], nested)["parameters_schema"] == [
        "Property 'x': type must be one of string, integer, number, boolean (or an enum)."]
    broken = {"type": "object", "properties": {"x": {"type": "integer", "minimum": "zero"}}}
    assert template_errors(["echo"], broken)["parameters_schema"][0].startswith("Not a valid JSON Schema:")
    bad_default = {"type": "object", "properties": {"x": {"type": "integer", "default": "seven"}}}
    assert "the default is invalid" in template_errors(["echo"], bad_default)["parameters_schema"][0]


def test_values_are_rendered_canonically() -> None:
    assert [render_value(v) for v in (True, False, 0, -12, 10**20, 0.1, 1e-7, "x y")] == [
        "true", "false", "0", "-12", "100000000000000000000", "0.1", "1e-07", "x y"]
    assert render_value(3.0, {"type": "integer"}) == "3" and render_value(3.0, {"type": "number"}) == "3.0"
    schema = {"type": "object", "properties": {"n": {"type": "integer", "default": 5}}}
    assert render_argv(["head", "-n", "{n}"], schema, {}) == ["head", "-n", "5"], "schema defaults fill in"


# --- injection ------------------------------------------------------------------------------


async def test_injection_in_a_string_reaches_the_program_as_one_literal_argument() -> None:
    """Shell metacharacters, newlines, quotes and globs are data: one argv element, unchanged."""
    marker = Path(tempfile.gettempdir()) / f"ap-cli-pwned-{os.getpid()}"
    marker.unlink(missing_ok=True)
    cli = printer()
    for payload in INJECTIONS:
        value = payload.format(marker=marker)
        result = await cli.execute({**VALID, "s": value}, context())
        assert result.data["exit_code"] == 0, result.content
        assert json.loads(result.data["stdout"]) == [value, "7", "2.5", "true", "alpha", f"--flag={value}"]
    assert not marker.exists(), "an injected command ran"


@pytest.mark.parametrize("param", ["i", "n", "b", "e"])
@pytest.mark.parametrize("payload", ["; rm -rf /", "$(touch /tmp/pwned)", "`id`", "1\n2", "1 && id", "-1; id", "*"])
async def test_injection_into_typed_parameters_is_refused_before_anything_runs(param: str, payload: str) -> None:
    events = Events()
    with pytest.raises(ToolError) as caught:
        await printer().execute({**VALID, param: payload}, context(events))
    assert caught.value.code == "invalid_arguments"
    assert caught.value.message.startswith(f"Invalid arguments: {param}: ")
    assert events.items == [], "nothing ran, nothing streamed"


async def test_leading_dash_option_injection_is_refused_unless_after_double_dash_or_allowed() -> None:
    refused = ["--output=/etc/x", "-rf", "--", "-"]
    for value in refused:
        with pytest.raises(ToolError) as caught:
            await printer().execute({**VALID, "s": value}, context())
        assert caught.value.code == "invalid_arguments" and "may not start with '-'" in caught.value.message

    after_dd = tool(["python3", "-c", PRINT_ARGV, "--", "{s}"], ALL_TYPES_SCHEMA)
    result = await after_dd.execute({**VALID, "s": "--output=/etc/x"}, context())
    assert json.loads(result.data["stdout"]) == ["--", "--output=/etc/x"], "after '--' it is a positional value"

    allowed_schema = {**ALL_TYPES_SCHEMA, "properties": {
        **ALL_TYPES_SCHEMA["properties"], "s": {"type": "string", "x-allow-leading-dash": True}}}
    allowed = tool(["python3", "-c", PRINT_ARGV, "{s}"], allowed_schema)
    assert json.loads((await allowed.execute({**VALID, "s": "-v"}, context())).data["stdout"]) == ["-v"]

    embedded = tool(["python3", "-c", PRINT_ARGV, "--name={s}", "{i}"], ALL_TYPES_SCHEMA)
    result = await embedded.execute({**VALID, "s": "-x", "i": -5}, context())
    assert json.loads(result.data["stdout"]) == ["--name=-x", "-5"], "a dash inside an element or a number is data"


async def test_a_schema_pattern_can_restrict_values_further() -> None:
    schema = {"type": "object", "properties": {"ref": {"type": "string", "pattern": "^[a-z0-9._/-]{1,40}$"}},
              "required": ["ref"]}
    cli = tool(["python3", "-c", PRINT_ARGV, "{ref}"], schema)
    assert json.loads((await cli.execute({"ref": "main"}, context())).data["stdout"]) == ["main"]
    with pytest.raises(ToolError) as caught:
        await cli.execute({"ref": "main; id"}, context())
    assert caught.value.code == "invalid_arguments" and "does not match" in caught.value.message
    with pytest.raises(ToolError) as caught:
        await cli.execute({}, context())
    assert caught.value.message == "Invalid arguments: 'ref' is a required property"


async def test_nul_bytes_and_unencodable_text_are_refused() -> None:
    for value in ("a\0b", "\ud800"):
        with pytest.raises(ToolError) as caught:
            await printer().execute({**VALID, "s": value}, context())
        assert caught.value.code == "invalid_arguments"
    with pytest.raises(ArgumentsInvalid):
        render_argv(["echo", "{s}"], ALL_TYPES_SCHEMA, {**VALID, "s": "x" * (200 * 1024)})
    with pytest.raises(ToolError) as caught:
        await printer().execute({**VALID, "i": 10**5000}, context())
    assert caught.value.code == "invalid_arguments" and "too large" in caught.value.message


# --- the sandbox ----------------------------------------------------------------------------


class _Listener:
    """A TCP server on 127.0.0.1 of the host that records connections."""

    def __init__(self) -> None:
        self.connections = 0

    async def __aenter__(self) -> _Listener:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.connections += 1
            writer.write(b"hello\n")
            await writer.drain()
            writer.close()

        self.server = await asyncio.start_server(handle, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.server.close()
        await self.server.wait_closed()


CONNECT = (
    "import socket, sys\n"
    "try:\n"
    "    s = socket.create_connection(('127.0.0.1', int(sys.argv[1])), timeout=5)\n"
    "    print('connected', s.recv(10).decode().strip())\n"
    "except OSError as exc:\n"
    "    print('refused', type(exc).__name__)\n"
    "    sys.exit(3)\n"
)
PORT_SCHEMA = {"type": "object", "properties": {"port": {"type": "integer", "minimum": 1, "maximum": 65535}},
               "required": ["port"]}


@pytest.mark.parametrize("network", ["none", "egress"])
async def test_the_sandbox_never_reaches_the_hosts_loopback(network: str) -> None:
    """Attack C2: a command with network reached 127.0.0.1 of the host (psql -h 127.0.0.1 printed
    every tenant's providers). Now the sandbox has a network namespace of its own in every
    profile: the host's services (here a listener standing for PostgreSQL) are unreachable;
    egress goes only through the proxy (capabilities/tests/test_confinement.py)."""
    async with _Listener() as listener:
        closed = await tool(["python3", "-c", CONNECT, "{port}"], PORT_SCHEMA, network=network).execute(
            {"port": listener.port}, context())
        assert closed.data["exit_code"] == 3 and closed.data["stdout"].startswith("refused"), closed.content
        assert listener.connections == 0


WRITES = (
    "import json, os\n"
    "out = {}\n"
    "for path in ['/usr/pwned', '/etc/pwned', '/pwned', '/proc/pwned', '/home/sandbox/ok', '/tmp/ok']:\n"
    "    try:\n"
    "        open(path, 'w').write('x'); out[path] = 'written'\n"
    "    except OSError as exc:\n"
    "        out[path] = exc.strerror\n"
    "out['work_before'] = sorted(set(os.listdir('/home/sandbox')) - {'ok'})\n"
    "out['cwd'] = os.getcwd(); out['uid'] = os.getuid()\n"
    "out['etc'] = sorted(os.listdir('/etc'))\n"
    "out['root'] = sorted(os.listdir('/'))\n"
    "print(json.dumps(out))\n"
)


async def test_the_sandbox_is_read_only_outside_a_fresh_work_directory() -> None:
    before = set(Path(tempfile.gettempdir()).glob("ap-cli-*"))
    result = await tool(["python3", "-c", WRITES]).execute({}, context())
    out = json.loads(result.data["stdout"])
    assert out["/home/sandbox/ok"] == "written" and out["/tmp/ok"] == "written"
    for path in ("/usr/pwned", "/etc/pwned", "/pwned", "/proc/pwned"):
        assert out[path] != "written", path
    assert out["/usr/pwned"] == "Read-only file system"
    assert out["work_before"] == [] and out["cwd"] == "/home/sandbox" and out["uid"] == 65534
    assert "shadow" not in out["etc"] and "postgresql" not in out["etc"], "only a minimal /etc"
    host_links = {p.lstrip("/") for p in ROOT_LINKS if os.path.lexists(p)}
    assert set(out["root"]) == {"dev", "etc", "home", "proc", "tmp", "usr"} | host_links
    assert not (REPO_ROOT / "pwned").exists()
    assert set(Path(tempfile.gettempdir()).glob("ap-cli-*")) == before, "the work directory is removed afterwards"

    again = await tool(["python3", "-c", WRITES]).execute({}, context())
    assert json.loads(again.data["stdout"])["work_before"] == [], "every run gets a fresh work directory"


async def test_tmp_is_bounded_and_no_nested_user_namespaces() -> None:
    script = (
        "import os, subprocess\n"
        "try:\n"
        "    with open('/tmp/big', 'wb') as f:\n"
        "        for _ in range(100): f.write(b'x' * (1 << 20))\n"
        "    print('wrote 100 MiB')\n"
        "except OSError as exc:\n"
        "    print('tmp full after', os.path.getsize('/tmp/big') >> 20, 'MiB:', exc.strerror)\n"
        "print('unshare', subprocess.run(['unshare', '--user', 'true'], capture_output=True).returncode)\n"
    )
    result = await tool(["python3", "-c", script]).execute({}, context())
    lines = result.data["stdout"].splitlines()
    assert lines[0] == "tmp full after 64 MiB: No space left on device", result.content
    assert lines[1] != "unshare 0", "a user namespace inside the sandbox was refused"


async def test_the_host_file_system_is_not_visible() -> None:
    script = "import os, sys; print([os.path.exists(p) for p in sys.argv[1:]])"
    probe = [str(REPO_ROOT / "manage.py"), "/root", "/var/lib/postgresql", "/etc/shadow", "/usr/bin/python3"]
    result = await tool(["python3", "-c", script, *probe]).execute({}, context())
    assert result.data["stdout"].strip() == "[False, False, False, False, True]"


async def test_the_environment_is_clean_plus_the_commands_own_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOST_SECRET", "must-not-leak")
    script = "import os, json; print(json.dumps({k: v for k, v in os.environ.items() if k != 'PWD'}))"
    env = {"API_TOKEN": "tok-123", "GREETING": "hello world"}
    result = await tool(["python3", "-c", script], env=env).execute({}, context())
    assert json.loads(result.data["stdout"]) == {
        "PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/home/sandbox", "LANG": "C.UTF-8", **env}


async def test_env_values_never_appear_on_a_command_line() -> None:
    """Secrets go to bwrap as its environment: another host user reading /proc/*/cmdline sees none."""
    secret = f"s3cr3t-{os.getpid()}"
    task = asyncio.ensure_future(
        tool(["sh", "-c", "echo started; sleep 2.71"], env={"TOKEN": secret}, timeout_seconds=10).execute({}, context())
    )
    try:
        deadline = time.monotonic() + 10
        while not _processes_with("2.71") and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        assert _processes_with("2.71"), "the command started"
        assert _processes_with(secret) == []
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_the_timeout_kills_the_command_and_its_children() -> None:
    marker = f"31.0{os.getpid() % 1000:03d}"
    cli = tool(["sh", "-c", f"sleep {marker} & sleep {marker} & echo started; wait"], timeout_seconds=1)
    started = time.monotonic()
    result = await cli.execute({}, context())
    assert time.monotonic() - started < 10
    assert result.data["timed_out"] is True and result.data["exit_code"] == -9
    assert result.content.startswith("timed out after 1 s; the command and its children were killed")
    assert result.data["stdout"] == "started\n", "output so far is kept"
    assert await _gone(marker), "the background children were killed too"


async def test_background_children_do_not_outlive_a_command_that_exited() -> None:
    marker = f"33.0{os.getpid() % 1000:03d}"
    cli = tool(["sh", "-c", f"sleep {marker} >/dev/null 2>&1 & echo detached"])
    started = time.monotonic()
    result = await cli.execute({}, context())
    assert result.data["stdout"] == "detached\n" and result.data["exit_code"] == 0
    assert result.data["timed_out"] is False and time.monotonic() - started < 10
    assert await _gone(marker)


async def test_cancelling_the_call_kills_the_sandbox() -> None:
    marker = f"32.{os.getpid() % 1000:03d}"
    events = Events()
    cli = tool(["sh", "-c", f"echo started; sleep {marker} & wait"], timeout_seconds=30)
    task = asyncio.ensure_future(cli.execute({}, context(events)))
    deadline = time.monotonic() + 10
    while not events.of("tool_call_progress") and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    assert _processes_with(marker)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await _gone(marker)


async def test_output_is_capped_per_stream_with_a_marker() -> None:
    script = "import sys; sys.stdout.write('a' * 10000 + 'END'); sys.stderr.write('e' * 10 + '\\n')"
    result = await tool(["python3", "-c", script], max_output_bytes=1000).execute({}, context())
    data = result.data
    assert data["stdout"] == "a" * 1000 and data["stdout_dropped_bytes"] == 10003 - 1000
    assert data["stderr"] == "e" * 10 + "\n" and data["stderr_dropped_bytes"] == 0
    assert data["truncated"] is True and data["timed_out"] is False and data["exit_code"] == 0
    assert f"[… truncated {10003 - 1000} bytes]" in result.content and "END" not in result.content


async def test_a_flood_of_output_is_killed_long_before_the_timeout() -> None:
    started = time.monotonic()
    result = await tool(["yes"], max_output_bytes=1000, timeout_seconds=30).execute({}, context())
    assert time.monotonic() - started < 10
    assert result.data["output_limit_exceeded"] is True and result.data["timed_out"] is False
    assert result.data["exit_code"] == -9 and len(result.data["stdout"]) == 1000
    assert result.content.startswith("killed: output far over the limit")


async def test_output_is_streamed_as_line_batched_progress_events() -> None:
    script = "import time\nfor i in range(5):\n    print(i, flush=True); time.sleep(0.1)\nprint('tail', end='')"
    events = Events()
    result = await tool(["python3", "-c", script]).execute({}, context(events))
    progress = [(d, ts) for t, d, ts in events.items if t == "tool_call_progress"]
    assert "".join(d["message"] for d, _ in progress) == "0\n1\n2\n3\n4\ntail" == result.data["stdout"]
    assert all(d["tool_call_id"] == 42 and d["stream"] == "stdout" for d, _ in progress)
    assert all(d["message"].endswith("\n") for d, _ in progress[:-1]), "whole lines until the end"
    # 5 lines over ~0.5 s at most every 0.25 s: batched (not one event per line), yet streamed.
    assert 2 <= len(progress) <= 4, [d["message"] for d, _ in progress]
    gaps = [b - a for (_, a), (_, b) in zip(progress, progress[1:-1], strict=False)]
    assert all(gap >= 0.2 for gap in gaps), gaps


async def test_a_non_zero_exit_is_a_result_the_model_reads() -> None:
    result = await tool(["sh", "-c", "echo partial; echo 'no such thing' >&2; exit 3"]).execute({}, context())
    assert result.data["exit_code"] == 3
    assert result.content == "exit code 3\n--- stdout ---\npartial\n--- stderr ---\nno such thing"


async def test_a_missing_program_is_reported_by_exit_code_in_the_sandbox() -> None:
    result = await tool(["no-such-program-xyz"]).execute({}, context())
    assert result.data["exit_code"] == 1 and "no-such-program-xyz" in result.data["stderr"]


async def test_without_bwrap_commands_refuse_to_run(tmp_path: Path) -> None:
    """There is no unconfined mode: without bubblewrap a command fails with a reason."""
    missing = str(tmp_path / "no" / "bwrap")
    with pytest.raises(ToolError) as caught:
        await tool(["factor", "--", "12"], bwrap_path=missing).execute({}, context())
    assert caught.value.code == "sandbox_unavailable"
    assert "not installed" in caught.value.message and "only run in the sandbox" in caught.value.message
    assert shutil.which("bwrap"), "the real one is installed (bootstrap)"
