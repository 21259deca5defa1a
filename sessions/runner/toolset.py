"""The tools of one run: every bound capability opened and its tools named for the model.

Each capability kind contributes :class:`ToolSource` entries; :func:`toolset_open` names them
(:func:`capabilities.naming.assign_exposed_names`) and builds the :class:`Toolset` the loop
offers to the model. Connections a kind opens (MCP sessions...) are entered on the run's
AsyncExitStack so they close with the run; MCP sessions come from the process's pool and
are only leased by the run (they outlive it).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

from capabilities.builtin.registry import builtin_create
from capabilities.cli.tool import CliTool
from capabilities.mcp.pool import Catalogue, PooledSession, mcp_pool
from capabilities.mcp.tool import McpTool
from capabilities.naming import assign_exposed_names
from capabilities.tools import Tool, ToolError
from llm.types import ToolSpec
from sessions.runner._db import db
from sessions.runner.spec import RunSpec

logger = logging.getLogger(__name__)

Publish = Callable[[str, dict[str, Any]], Awaitable[Any]]


class CapabilityUnavailable(Exception):
    """A bound capability could not be reached when the run started (kept for callers that
    still catch it; :func:`toolset_open` now leaves such a capability out instead, with a
    ``capability_unavailable`` event)."""


@dataclass(frozen=True, slots=True)
class ToolOrigin:
    """Where an exposed tool comes from: what approval policies and the UI need."""

    source: str
    """The capability's alias (an MCP server alias, ``builtin``, ...)."""
    name: str
    """The tool's name inside its source."""
    binding_id: int | None = None
    approval_policy: tuple[dict[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class ToolSource:
    origin: ToolOrigin
    factory: Callable[[str], Tool]
    """``factory(exposed_name)`` → the Tool, its spec carrying the exposed name."""


@dataclass(slots=True)
class Toolset:
    tools: dict[str, Tool] = field(default_factory=dict)
    """``{exposed name: Tool}``."""
    origins: dict[str, ToolOrigin] = field(default_factory=dict)
    """``{exposed name: ToolOrigin}``."""
    hidden: set[str] = field(default_factory=set)
    """Exposed names callable but not offered (skill tools past the depth limit: a call
    gets a clear error instead of "unknown tool")."""

    @property
    def specs(self) -> list[ToolSpec]:
        """The ToolSpecs offered to the model (exposed names)."""
        return [t.spec for name, t in self.tools.items() if name not in self.hidden]

    def add_builtin(self, name: str) -> None:
        """Offer the built-in tool ``name`` from now on (no-op if it is already offered)."""
        if name not in self.tools:
            self.tools[name] = builtin_create(name)
            self.origins[name] = ToolOrigin(source="builtin", name=name)


async def toolset_open(spec: RunSpec, stack: contextlib.AsyncExitStack, *, publish: Publish | None = None) -> Toolset:
    """Connect the run's bound capabilities (in this task: it also closes them) and build its tools.

    A capability that cannot be reached (an MCP server that does not answer, refuses the
    handshake, cannot list its tools, or whose breaker is open) is left out of the run: the
    run goes on with the others, and ``publish`` announces it as ``capability_unavailable``
    ``{source: "mcp", alias, error}`` (``error``: why, as the connection reported it).

    Args:
        spec: The run.
        stack: The run's exit stack (leases on pooled MCP sessions are released on it).
        publish: The run's event publisher, for ``capability_unavailable`` (None: logged only).
    """
    toolset = Toolset()
    sources: list[ToolSource] = []
    sources += await _mcp_sources(spec, stack, publish=publish)
    sources += _builtin_sources(spec)
    sources += _cli_sources(spec)
    sources += _browser_sources(spec)
    sources += _skill_sources(spec, toolset)

    names = assign_exposed_names(
        [(s.origin.source, s.origin.name) for s in sources],
        qualified_sources={b.server.alias for b in spec.mcp_bindings},
    )
    for source in sources:
        exposed = names[(source.origin.source, source.origin.name)]
        toolset.tools[exposed] = source.factory(exposed)
        toolset.origins[exposed] = source.origin
    return toolset


async def _mcp_sources(
    spec: RunSpec, stack: contextlib.AsyncExitStack, *, publish: Publish | None = None
) -> list[ToolSource]:
    """The tools of the run's MCP servers, from the process's MCP pool.

    Every server's pooled session is connected (if it is not already) and its catalogue
    fetched concurrently. The run holds a lease on each session until its exit stack closes
    (no idle eviction mid-run) but never closes one: sessions are shared with other runs.
    A changed catalogue is stored on the McpServer row (the console's snapshot).

    A server that could not be connected or listed (or whose breaker is open) is left out,
    announced with ``capability_unavailable`` (see :func:`toolset_open`).
    """
    if not spec.mcp_bindings:
        return []
    pool = mcp_pool()
    sessions = [
        pool.session(tenant_id=spec.tenant_id, server_id=b.server_id, config=b.server) for b in spec.mcp_bindings
    ]
    for session in sessions:
        stack.callback(session.lease())
    catalogues = await asyncio.gather(
        *(_mcp_catalogue(spec.tenant_id, session) for session in sessions), return_exceptions=True
    )
    sources = []
    for binding, session, catalogue in zip(spec.mcp_bindings, sessions, catalogues):
        if isinstance(catalogue, ToolError):
            alias = binding.server.alias
            logger.warning("run %s: MCP server %r left out: %s", spec.run_id, alias, catalogue.message)
            if publish is not None:
                await publish("capability_unavailable", {
                    "source": "mcp", "alias": alias,
                    "error": f"MCP server {alias!r} is unavailable: {catalogue.message}"[:2000],
                })
            continue
        if isinstance(catalogue, BaseException):
            raise catalogue
        for info in catalogue.tools:
            if binding.allowed_tools and info.name not in binding.allowed_tools:
                continue
            sources.append(ToolSource(
                origin=ToolOrigin(source=binding.server.alias, name=info.name, binding_id=binding.binding_id,
                                  approval_policy=binding.approval_policy),
                factory=lambda exposed, c=session, i=info: McpTool(
                    connection=c, info=i, exposed_name=exposed, call_timeout_seconds=spec.tool_timeout_seconds),
            ))
    return sources


async def _mcp_catalogue(tenant_id: int, session: PooledSession) -> Catalogue:
    """``session.catalogue()``, storing a new snapshot (or the failure) on the McpServer row."""
    from capabilities.services import mcp_server_tools_snapshot_save

    save = db(mcp_server_tools_snapshot_save)
    server_id = session.key.server_id
    try:
        catalogue = await session.catalogue()
    except ToolError as exc:
        if server_id:
            await save(tenant_id=tenant_id, server_id=server_id, tools=None, error=exc.message)
        raise
    if server_id and catalogue.version != session.snapshot_version:
        # Malformed tools the server listed were left out: the console shows which, and why.
        await save(tenant_id=tenant_id, server_id=server_id, tools=catalogue.tools, error="\n".join(catalogue.skipped))
        session.snapshot_version = catalogue.version
    return catalogue


def _builtin_sources(spec: RunSpec) -> list[ToolSource]:
    return [
        ToolSource(
            origin=ToolOrigin(source="builtin", name=b.name, binding_id=b.binding_id, approval_policy=b.approval_policy),
            factory=lambda exposed, n=b.name: renamed(builtin_create(n), exposed),
        )
        for b in spec.builtin_bindings
    ]


def _cli_sources(spec: RunSpec) -> list[ToolSource]:
    """One tool per bound CLI command: source ``cli``, named as the command (no process starts here)."""
    return [
        ToolSource(
            origin=ToolOrigin(source="cli", name=b.command.name, binding_id=b.binding_id,
                              approval_policy=b.approval_policy),
            factory=lambda exposed, c=b.command: CliTool(c, exposed_name=exposed),
        )
        for b in spec.cli_bindings
    ]


def _skill_sources(spec: RunSpec, toolset: Toolset) -> list[ToolSource]:
    """Bound skills, each a :class:`sessions.runner.subrun.SkillTool` (source alias ``skill``,
    tool name = the skill's name) that runs a sub-run with a subset of ``toolset``."""
    from sessions.runner.subrun import SkillTool

    return [
        ToolSource(
            origin=ToolOrigin(source="skill", name=b.name, binding_id=b.binding_id, approval_policy=b.approval_policy),
            factory=lambda exposed, b=b: SkillTool(skill=b, exposed_name=exposed, parent=spec, parent_toolset=toolset),
        )
        for b in spec.skill_bindings
    ]


def _browser_sources(spec: RunSpec) -> list[ToolSource]:
    """The browser tools of the run's browser binding (they share one BrowserRun: backend choice, origins)."""
    from browser.tools import BrowserConfig, BrowserRun, browser_tools

    sources = []
    for b in spec.browser_bindings:
        run = BrowserRun(config=BrowserConfig.from_json(b.config))
        for tool in browser_tools(run):
            sources.append(ToolSource(
                origin=ToolOrigin(source="browser", name=tool.spec.name, binding_id=b.binding_id,
                                  approval_policy=b.approval_policy),
                factory=lambda exposed, t=tool: renamed(t, exposed),
            ))
    return sources


def renamed(tool: Tool, exposed: str) -> Tool:
    """``tool`` with its spec carrying ``exposed`` as the name."""
    if tool.spec.name != exposed:
        tool.spec = dataclasses.replace(tool.spec, name=exposed)
    return tool
