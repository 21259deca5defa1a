"""Persistent data directories of stdio MCP servers (issue 37: server-memory's graph, a sqlite
database or a filesystem server's files were lost at every idle close or restart, because a
confined program's only writable places vanish with its process)."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from pathlib import Path

import pytest
from django.core.exceptions import ValidationError

from capabilities.data_dirs import DataDirFull, data_dir_errors, data_dir_path
from capabilities.mcp.client import McpConnection
from capabilities.models import McpServer
from capabilities.services import mcp_server_config
from capabilities.tests.catalogue import template
from capabilities.tests.confined_servers import needs_sandbox

pytestmark = pytest.mark.usefixtures("all_tenants_scope")

# A small notes server (the sandbox's Python has the mcp SDK, mcp-server-time depends on it):
# `add` appends a line to /data/notes.txt and answers the whole file.
NOTES_SERVER = "\n".join([
    "import pathlib",
    "from mcp.server.mcpserver import MCPServer",
    "server = MCPServer('notes')",
    "@server.tool()",
    "def add(text: str) -> str:",
    "    notes = pathlib.Path('/data/notes.txt')",
    "    with notes.open('a') as handle:",
    "        handle.write(text + chr(10))",
    "    return notes.read_text()",
    "server.run()",
])


@pytest.fixture
def data_root(settings):
    """A data root the sandbox user can reach (pytest's tmp_path is under a 0700 directory)."""
    root = Path(tempfile.mkdtemp(prefix="ap-data-test-", dir="/var/tmp"))
    root.chmod(0o755)
    settings.SANDBOX_DATA_ROOT = str(root)
    yield root
    shutil.rmtree(root, ignore_errors=True)


def _server(tenant, notes_template, alias="notes") -> McpServer:
    return McpServer.all_tenants.create(tenant=tenant, name=alias, alias=alias, transport="stdio",
                                        template=notes_template)


def _add(server: McpServer, text: str) -> str:
    config = mcp_server_config(server=server)  # the database read, before the event loop

    async def call() -> str:
        async with McpConnection(config) as connection:
            result = await connection.call_tool("add", {"text": text}, timeout_seconds=30)
            return result.content

    return asyncio.run(call())


def test_a_data_dir_is_declared_on_a_stdio_server_template_only():
    assert data_dir_errors({}) == []
    assert data_dir_errors({"mount": "/data", "per": "server", "quota_mb": 10}) == []
    assert data_dir_errors({"mount": "/usr/data"})[0].startswith("mount: /usr/data is (or holds)")
    assert data_dir_errors({"mount": "/"})[0].startswith("mount: an absolute")
    assert data_dir_errors({"mount": "/data", "quota_mb": 0}) == ["quota_mb: an integer from 1 to 102400."]
    assert data_dir_errors({"mount": "/data", "size": 3})[0].startswith("A JSON object")


@pytest.mark.django_db
def test_a_cli_template_may_not_declare_one():
    with pytest.raises(ValidationError, match="Only a stdio MCP server keeps data"):
        template("cli-with-data", kind="cli", argv=["factor", "--", "{n}"], data_dir={"mount": "/data"},
                 parameters_schema={"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]})


@needs_sandbox
@pytest.mark.django_db
@pytest.mark.timeout(120)
def test_the_servers_data_outlives_its_process_stays_in_its_tenant_and_goes_with_it(world, other_world, data_root):
    notes = template("notes-test", kind="mcp_stdio", argv=["${PYTHON}", "-c", NOTES_SERVER],
                     data_dir={"mount": "/data", "per": "tenant", "quota_mb": 1})
    ours, theirs = _server(world.tenant, notes), _server(other_world.tenant, notes)
    assert _add(ours, "first") == "first\n"
    assert _add(ours, "second") == "first\nsecond\n"  # a new process: the file was kept
    assert _add(theirs, "other") == "other\n"  # another tenant: a directory of its own
    host = data_dir_path(template_slug="notes-test", tenant_id=world.tenant.pk, owner=None)
    assert host.parent.parent == data_root and (host / "notes.txt").read_text() == "first\nsecond\n"
    assert host.stat().st_mode & 0o777 == 0o700

    (host / "big.bin").write_bytes(b"x" * (1024 * 1024 + 1))  # over the 1 MiB quota: not started
    with pytest.raises(DataDirFull, match="over its quota of 1 MiB"):
        mcp_server_config(server=ours)

    world.tenant.delete()  # the tenant's programs' data goes with it; the other tenant's stays
    assert not host.exists()
    assert data_dir_path(template_slug="notes-test", tenant_id=other_world.tenant.pk, owner=None).is_dir()
