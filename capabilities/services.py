"""Writes for capability definitions."""

from __future__ import annotations

from typing import Any

from django.db import transaction

from capabilities.models import McpServer
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
