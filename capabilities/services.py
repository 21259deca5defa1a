"""Writes for capability definitions."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.utils import timezone

from capabilities.mcp.client import McpConnection, McpServerConfig, McpToolInfo
from capabilities.mcp.tool import cap_description
from capabilities.models import McpServer
from tenants.scoping import tenant_scope
from capabilities.tools import ToolError
from tenants.crypto import secret_decrypt_json, secret_encrypt_json
from tenants.models import Tenant


@transaction.atomic
def mcp_server_save(
    *,
    tenant: Tenant,
    server: McpServer | None = None,
    env: dict[str, str] | None = None,
    headers: dict[str, str] | None = None,
    **fields: Any,
) -> McpServer:
    """Create or update an MCP server. ``env``/``headers`` None keep the stored secrets."""
    server = server or McpServer(tenant=tenant)
    for name, value in fields.items():
        setattr(server, name, value)
    if env is not None:
        server.env_encrypted = secret_encrypt_json(tenant=tenant, value=env)
    if headers is not None:
        server.headers_encrypted = secret_encrypt_json(tenant=tenant, value=headers)
    server.full_clean()
    server.save()
    return server


def mcp_tools_snapshot(tools: Sequence[McpToolInfo]) -> list[dict[str, Any]]:
    """The JSON stored in ``McpServer.tools_snapshot``: ``[{name, description, input_schema}]``.

    Descriptions are capped like the ones the model sees (1,024 characters).
    """
    return [
        {"name": t.name, "description": cap_description(t.description), "input_schema": t.input_schema}
        for t in tools
    ]


def mcp_server_tools_snapshot_save(
    *, tenant_id: int, server_id: int, tools: Sequence[McpToolInfo] | None, error: str = ""
) -> None:
    """Store what a server listed (or why it could not be listed), for the console.

    Args:
        tenant_id: The server's tenant (the write is scoped to it).
        server_id: ``McpServer`` primary key.
        tools: The full catalogue, or None to keep the previous snapshot (connection failed).
        error: The failure message ('' on success: clears ``last_error``).

    Updates ``tools_snapshot``/``tools_snapshot_at`` (when ``tools`` is given) and
    ``last_error``; a missing server (deleted meanwhile) is ignored.
    """
    fields: dict[str, Any] = {"last_error": error[:4000]}
    if tools is not None:
        fields["tools_snapshot"] = mcp_tools_snapshot(tools)
        fields["tools_snapshot_at"] = timezone.now()
    with tenant_scope(tenant_id):
        McpServer.objects.filter(pk=server_id).update(**fields)


@dataclass(frozen=True, slots=True)
class McpConnectionTest:
    """What "Test connection" found."""

    ok: bool
    tools: tuple[McpToolInfo, ...] = ()
    """Every tool the server listed (all pages), when ``ok``."""
    error: str = ""
    """Why it failed (connect, handshake or listing; with the server's stderr tail for stdio)."""
    seconds: float = 0.0
    """Wall time of connect + list, in seconds."""


def mcp_server_config(*, server: McpServer) -> McpServerConfig:
    """The client configuration of ``server``, secrets decrypted (never log it: env/headers)."""
    tenant = Tenant.objects.get(pk=server.tenant_id)
    return McpServerConfig(
        alias=server.alias,
        transport=server.transport,
        command=server.command,
        args=tuple(server.args),
        env=secret_decrypt_json(tenant=tenant, ciphertext=server.env_encrypted),
        url=server.url,
        headers=secret_decrypt_json(tenant=tenant, ciphertext=server.headers_encrypted),
        connect_timeout_seconds=server.connect_timeout_seconds,
        list_timeout_seconds=server.list_timeout_seconds,
        call_timeout_seconds=server.call_timeout_seconds,
    )


def mcp_server_test_connection(*, server: McpServer) -> McpConnectionTest:
    """Connect to ``server`` with its own timeouts, list every tool, store the snapshot.

    A fresh connection (not the worker's pool: this runs in the web process), closed before
    returning; a stdio server is spawned and terminated. Blocks for at most about
    ``connect_timeout_seconds + list_timeout_seconds`` (+ the bounded close). Call it from a
    synchronous view (it runs its own event loop).

    Side effects: ``tools_snapshot``/``tools_snapshot_at`` on success, ``last_error`` always.
    """
    started = time.monotonic()
    try:
        config = mcp_server_config(server=server)
    except ValueError as exc:
        result = McpConnectionTest(ok=False, error=f"Invalid configuration: {exc}")
    else:

        async def probe() -> list[McpToolInfo]:
            async with McpConnection(config) as connection:
                return await connection.list_tools()

        try:
            tools = asyncio.run(probe())
        except ToolError as exc:
            result = McpConnectionTest(ok=False, error=exc.message, seconds=time.monotonic() - started)
        else:
            result = McpConnectionTest(ok=True, tools=tuple(tools), seconds=time.monotonic() - started)
    mcp_server_tools_snapshot_save(
        tenant_id=server.tenant_id, server_id=server.pk, tools=result.tools if result.ok else None, error=result.error
    )
    return result
