"""The ``mcp_server`` capability kind: the tools of a tenant's MCP server.

Validation: the binding names an MCP server of its tenant. Spec: :class:`McpBindingSpec`
(the server's connection config; a disabled server is left out). Toolset: one per server,
qualified (``<alias>__<tool>``), from the process's MCP pool; ``allowed_tools`` (own names)
filters it. A server that cannot be reached is left out of the run with a
``capability_unavailable`` event.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from capabilities.mcp.attached import KIND_KEY, attached_resource_blocks, attached_resources_of, sessions_by_server
from capabilities.mcp.binding_config import binding_config_errors
from capabilities.mcp.config import McpServerConfig
from capabilities.mcp.pool import mcp_pool
from capabilities.mcp.tool import McpTool
from capabilities.registry import CapabilityKind, OpenContext, kind_register
from capabilities.tools import ToolError
from capabilities.toolsets import KindToolset, ToolOrigin, ToolSource

logger = logging.getLogger(__name__)

PERSON_AUTH_MODES = frozenset({"oauth_user", "oauth_tenant"})
"""``McpServer.auth_mode`` values whose connection a person makes (Connect), so a person can
make it again when the server refuses it."""


@dataclass(frozen=True, slots=True)
class McpBindingSpec:
    """An ``mcp_server`` binding, as a run needs it."""

    kind: ClassVar[str] = "mcp_server"
    server: McpServerConfig
    allowed_tools: frozenset[str]
    """Empty: every tool the server lists."""
    binding_id: int | None = None
    approval_policy: tuple[dict[str, str], ...] = ()
    """``[{pattern, action}]`` rules (capabilities.toolsets.approval_action)."""
    server_id: int = 0
    """``McpServer`` primary key: with the tenant and ``server.fingerprint``, the MCP pool key."""
    auth_mode: str = "none"
    """``McpServer.auth_mode``: ``oauth_user`` / ``oauth_tenant`` servers are reached with the
    run's user's (or the tenant's) OAuth connection (:mod:`capabilities.mcp_oauth.runs`)."""
    config: Any = None
    """The binding's ``config`` (:mod:`capabilities.mcp.binding_config`: ``log_level``,
    ``sampling``); a JSON object."""
    server_name: str = ""
    """``McpServer.name``: what a person reads (the Connect card)."""
    known_tools: tuple[str, ...] = ()
    """The names of the tools the server last listed (``McpServer.tools_snapshot``): what the
    model reads of a server not connected yet (its ``<alias>__connect`` stand-in)."""


class McpServerKind(CapabilityKind):
    """Bindings of kind ``mcp_server``."""

    key = "mcp_server"
    label = "MCP server"
    fields = ("mcp_server", "allowed_tools", "approval_policy", "config")
    position = 10

    def validate(self, binding: Any) -> dict[str, Any]:
        if not binding.mcp_server_id:
            return {"mcp_server": "Choose an MCP server."}
        if binding.tenant_id and binding.mcp_server.tenant_id != binding.tenant_id:
            return {"mcp_server": "MCP server not found."}
        errors = binding_config_errors(binding.config)
        return {"config": errors} if errors else {}

    def load_spec(self, binding: Any) -> McpBindingSpec | None:
        from capabilities.models import McpServer
        from capabilities.services import mcp_server_config

        server = McpServer.objects.get(pk=binding.mcp_server_id)
        if not server.enabled:
            return None
        return McpBindingSpec(
            server=mcp_server_config(server=server), server_id=server.pk, allowed_tools=frozenset(binding.allowed_tools),
            binding_id=binding.pk, approval_policy=tuple(binding.approval_policy), auth_mode=server.auth_mode,
            config=binding.config if isinstance(binding.config, dict) else {},
            server_name=server.name,
            known_tools=tuple(str(t.get("name", "")) for t in server.tools_snapshot or () if isinstance(t, dict))[:50],
        )

    async def open_toolset(self, specs: Sequence[McpBindingSpec], ctx: OpenContext) -> list[tuple[Any, KindToolset]]:
        """Every server's pooled session connected (if it is not already) and its catalogue
        fetched concurrently. The run holds a lease on each session until ``ctx.stack``
        closes (no idle eviction mid-run) but never closes one: sessions are shared with
        other runs. A changed catalogue is stored on the McpServer row (the console's snapshot).
        A server that could not be connected or listed (or whose breaker is open) is left
        out, announced as ``capability_unavailable`` ``{source: "mcp", alias, error}``."""
        if not specs:
            return []
        stand_ins: list[tuple[Any, KindToolset]] = []
        if any(spec.auth_mode != "none" for spec in specs):
            from capabilities.mcp_oauth.runs import connect_stand_ins, with_connections

            missing: list[tuple[McpBindingSpec, str]] = []
            specs = await with_connections(specs, ctx, missing=missing)
            stand_ins = connect_stand_ins(missing) if ctx.attended else []
        pool = mcp_pool()
        sessions = [pool.session(tenant_id=ctx.tenant_id, server_id=b.server_id, config=b.server) for b in specs]
        for session in sessions:
            ctx.stack.callback(session.lease())
        ctx.extra[KIND_KEY] = sessions_by_server(specs, sessions)  # attached resources are read through them
        catalogues = await asyncio.gather(*(_catalogue(ctx, s) for s in sessions), return_exceptions=True)
        opened = []
        for binding, session, catalogue in zip(specs, sessions, catalogues, strict=False):
            toolset = await _server_toolset(binding, session, catalogue, ctx)
            if toolset is not None:
                opened.append((binding, toolset))
        return opened + stand_ins


    def run_context_wanted(self, specs: Sequence[McpBindingSpec], run: Any) -> bool:
        """Only a run whose message carries resources (:mod:`capabilities.mcp.attached`)."""
        return bool(attached_resources_of(run))

    async def run_context(self, specs: Sequence[McpBindingSpec], ctx: OpenContext, query: str) -> list[Any]:
        """The resources attached to the run's message, read through the run's sessions
        (:func:`capabilities.mcp.attached.attached_resource_blocks`)."""
        return await attached_resource_blocks(ctx)


async def _server_toolset(binding: McpBindingSpec, session: Any, catalogue: Any, ctx: OpenContext) -> KindToolset | None:
    """The server's tools (``allowed_tools`` only, if set), or None when its catalogue is a
    ToolError (announced as ``capability_unavailable``). Other exceptions are raised."""
    if isinstance(catalogue, ToolError):
        alias = binding.server.alias
        logger.warning("run %s: MCP server %r left out: %s", ctx.run_id, alias, catalogue.message)
        if ctx.publish is not None:
            await ctx.publish("capability_unavailable", {
                "source": "mcp", "alias": alias,
                "error": f"MCP server {alias!r} is unavailable: {catalogue.message}"[:2000],
            })
        return None
    if isinstance(catalogue, BaseException):
        raise catalogue
    account = ({"server_id": binding.server_id, "server_name": binding.server_name, "auth_mode": binding.auth_mode}
               if ctx.attended and binding.auth_mode in PERSON_AUTH_MODES else None)
    return KindToolset(qualified=True, sources=[
        ToolSource(
            origin=ToolOrigin(source=binding.server.alias, name=info.name),
            factory=lambda exposed, c=session, i=info: McpTool(
                connection=c, info=i, exposed_name=exposed, call_timeout_seconds=ctx.tool_timeout_seconds,
                binding_config=binding.config, account=account),
        )
        for info in catalogue.tools
        if not binding.allowed_tools or info.name in binding.allowed_tools
    ])


async def _catalogue(ctx: OpenContext, session: Any) -> Any:
    """``session.catalogue()``, storing a new snapshot (or the failure) on the McpServer row."""
    from capabilities.services import mcp_server_tools_snapshot_save

    save = ctx.in_thread(mcp_server_tools_snapshot_save) if ctx.in_thread is not None else None
    server_id = session.key.server_id
    try:
        catalogue = await session.catalogue()
    except ToolError as exc:
        if server_id and save is not None:
            await save(tenant_id=ctx.tenant_id, server_id=server_id, tools=None, error=exc.message)
        raise
    if server_id and save is not None and catalogue.version != session.snapshot_version:
        # Malformed tools the server listed were left out: the console shows which, and why.
        await save(tenant_id=ctx.tenant_id, server_id=server_id, tools=catalogue.tools, error="\n".join(catalogue.skipped))
        session.snapshot_version = catalogue.version
    return catalogue


kind_register(McpServerKind())
