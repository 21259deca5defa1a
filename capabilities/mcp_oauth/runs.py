"""OAuth MCP servers in a run: each ``oauth_user`` / ``oauth_tenant`` binding's connection
config gets the run's user's (or the tenant's) connection as its ``httpx2.Auth``
(:func:`with_connections`). A server nobody has connected yet is left out of the run, announced
as ``capability_unavailable`` with where to connect."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from typing import Any

from capabilities.registry import OpenContext

logger = logging.getLogger(__name__)

CONNECT_HINT = "Connect it in Settings → Connections (or ask a tenant admin, for the tenant's account)."


def connection_id_for_run(*, tenant_id: int, server_id: int, user_id: int | None) -> tuple[int | None, str]:
    """``(connection id, "")`` when the run's user (or the tenant) has a usable connection to the
    server (a client-credentials server: always, its row made if missing), else ``(None, why)``.
    Runs under the run's tenant scope."""
    from capabilities.mcp_oauth.models import ConnectionStatus
    from capabilities.mcp_oauth.services import client_credentials_connection_get_or_create, connection_get
    from capabilities.models import McpAuthMode, McpServer

    server = McpServer.objects.filter(pk=server_id).first()
    if server is None:
        return None, "the server was removed."
    if server.auth_mode == McpAuthMode.OAUTH_CLIENT_CREDENTIALS:  # no person: the token is got on first use
        return client_credentials_connection_get_or_create(server=server).pk, ""
    connection = connection_get(server=server, user_id=user_id)
    who = "You have" if server.auth_mode == "oauth_user" else "The tenant has"
    if connection is None or (connection.status == ConnectionStatus.PENDING and not connection.access_token_encrypted):
        return None, f"{who} not connected {server.name!r} yet. {CONNECT_HINT}"
    if connection.status == ConnectionStatus.RECONNECT:
        return None, f"The connection to {server.name!r} has to be made again ({connection.last_error}). {CONNECT_HINT}"
    return connection.pk, ""


async def with_connections(specs: Sequence[Any], ctx: OpenContext) -> list[Any]:
    """``specs`` with each OAuth server's config carrying its connection's auth; servers without
    a usable connection are left out (``capability_unavailable``)."""
    from capabilities.mcp_oauth.services import connection_auth

    if ctx.in_thread is None:
        raise RuntimeError("OAuth MCP servers need the run's database thread (OpenContext.in_thread)")
    lookup = ctx.in_thread(connection_id_for_run)
    kept = []
    for spec in specs:
        if spec.auth_mode == "none":
            kept.append(spec)
            continue
        connection_id, why = await lookup(tenant_id=ctx.tenant_id, server_id=spec.server_id, user_id=ctx.user_id)
        if connection_id is None:
            alias = spec.server.alias
            logger.info("run %s: OAuth MCP server %r left out: %s", ctx.run_id, alias, why)
            if ctx.publish is not None:
                await ctx.publish("capability_unavailable", {
                    "source": "mcp", "alias": alias, "error": f"MCP server {alias!r} is unavailable: {why}"[:2000]})
            continue
        auth = connection_auth(tenant_id=ctx.tenant_id, server_id=spec.server_id, connection_id=connection_id)
        server = dataclasses.replace(spec.server, auth=auth, auth_key=f"oauth:{connection_id}")
        kept.append(dataclasses.replace(spec, server=server))
    return kept
