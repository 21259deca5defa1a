"""Writes for capability definitions."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db import transaction
from django.utils import timezone

from capabilities.mcp.client import McpToolInfo
from capabilities.mcp.tool import cap_description
from capabilities.models import McpServer
from tenants.scoping import tenant_scope
from tenants.crypto import secret_encrypt_json
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
