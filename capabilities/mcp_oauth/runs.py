"""OAuth MCP servers in a run: each ``oauth_user`` / ``oauth_tenant`` binding's connection
config gets the run's user's (or the tenant's) connection as its ``httpx2.Auth``
(:func:`with_connections`). A server nobody has connected yet is left out of the run, announced
as ``capability_unavailable`` with where to connect; in a run a person watches it is offered
instead as one stand-in tool, ``<alias>__connect`` (:func:`connect_stand_ins`): the model calls
it when the user's request needs the server, the run pauses with a Connect card (an Approval of
kind ``connection``, :class:`~capabilities.tools.ConnectionForUser`) and resumes once the
account is connected, with the server's real tools."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from typing import Any

from capabilities.registry import OpenContext
from capabilities.tools import ConnectionForUser, Tool, ToolContext, ToolResult
from capabilities.toolsets import KindToolset, ToolOrigin, ToolSource
from llm.types import ToolSpec

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


async def with_connections(specs: Sequence[Any], ctx: OpenContext,
                           missing: list[tuple[Any, str]] | None = None) -> list[Any]:
    """``specs`` with each OAuth server's config carrying its connection's auth; servers without
    a usable connection are left out (``capability_unavailable``), and appended to ``missing``
    (when given) as ``(spec, why)``."""
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
            if missing is not None:
                missing.append((spec, why))
            continue
        auth = connection_auth(tenant_id=ctx.tenant_id, server_id=spec.server_id, connection_id=connection_id)
        server = dataclasses.replace(spec.server, auth=auth, auth_key=f"oauth:{connection_id}")
        kept.append(dataclasses.replace(spec, server=server))
    return kept


CONNECT_TOOL = "connect"
"""The stand-in tool's own name: exposed as ``<alias>__connect``."""


class ConnectTool(Tool):
    """The stand-in of an OAuth MCP server nobody has connected yet, in a run a person watches:
    calling it asks the person to connect (:class:`~capabilities.tools.ConnectionForUser`; the
    run pauses with a Connect card). Once connected, the run resumes with the server's tools and
    this call's result says so (``sessions.runner.tool_execution``); declined, the call fails."""

    def __init__(self, *, exposed_name: str, spec: Any, why: str) -> None:
        """``spec``: the server's ``McpBindingSpec``; ``why``: why it has no usable connection."""
        self.request = {
            "type": "connection", "server": spec.server.alias, "server_id": spec.server_id,
            "server_name": spec.server_name or spec.server.alias, "auth_mode": spec.auth_mode,
            "tool": CONNECT_TOOL, "retry": False, "message": why,
        }
        whose = "the user's" if spec.auth_mode == "oauth_user" else "the organisation's"
        known = f" Its tools: {', '.join(spec.known_tools)}." if spec.known_tools else ""
        self.spec = ToolSpec(
            name=exposed_name,
            description=(f"The MCP server {self.request['server_name']!r} needs {whose} account connected before its "
                         f"tools can be used.{known} Call this when the request needs that server: the user is asked "
                         "to connect, and once they have, the server's tools are available."),
            parameters={"type": "object", "properties": {}},
        )

    async def execute(self, arguments: dict[str, Any], context: ToolContext) -> ToolResult:
        """Raises :class:`~capabilities.tools.ConnectionForUser` (always)."""
        raise ConnectionForUser(dict(self.request))


def connect_stand_ins(missing: Sequence[tuple[Any, str]]) -> list[tuple[Any, KindToolset]]:
    """One ``<alias>__connect`` tool (:class:`ConnectTool`) for each ``(spec, why)`` of an
    ``oauth_user`` / ``oauth_tenant`` server left out, as ``(spec, toolset)`` pairs the
    capability kind returns. The spec's approval rules are dropped: asking to connect needs no
    approval of its own."""
    opened = []
    for spec, why in missing:
        if spec.auth_mode not in ("oauth_user", "oauth_tenant"):
            continue
        toolset = KindToolset(qualified=True, sources=[ToolSource(
            origin=ToolOrigin(source=spec.server.alias, name=CONNECT_TOOL),
            factory=lambda exposed, s=spec, w=why: ConnectTool(exposed_name=exposed, spec=s, why=w),
        )])
        opened.append((dataclasses.replace(spec, approval_policy=()), toolset))
    return opened
