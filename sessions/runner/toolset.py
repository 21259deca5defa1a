"""The tools of one run: every bound capability opened and its tools named for the model.

Each capability kind contributes :class:`ToolSource` entries; :func:`toolset_open` names them
(:func:`capabilities.naming.assign_exposed_names`) and builds the :class:`Toolset` the loop
offers to the model. Connections a kind opens (MCP sessions...) are entered on the run's
AsyncExitStack so they close with the run.
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass, field
from typing import Callable

from capabilities.builtin.registry import builtin_create
from capabilities.mcp.client import McpConnection
from capabilities.mcp.tool import McpTool
from capabilities.naming import assign_exposed_names
from capabilities.tools import Tool, ToolError
from llm.types import ToolSpec
from sessions.runner.spec import RunSpec


class CapabilityUnavailable(Exception):
    """A bound capability could not be reached when the run started."""


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

    @property
    def specs(self) -> list[ToolSpec]:
        """The ToolSpecs offered to the model (exposed names)."""
        return [t.spec for t in self.tools.values()]


async def toolset_open(spec: RunSpec, stack: contextlib.AsyncExitStack) -> Toolset:
    """Connect the run's bound capabilities (in this task: it also closes them) and build its tools.

    Raises:
        CapabilityUnavailable: a bound capability could not be connected or listed.
    """
    sources: list[ToolSource] = []
    sources += await _mcp_sources(spec, stack)
    sources += _builtin_sources(spec)
    sources += _browser_sources(spec)

    names = assign_exposed_names([(s.origin.source, s.origin.name) for s in sources])
    toolset = Toolset()
    for source in sources:
        exposed = names[(source.origin.source, source.origin.name)]
        toolset.tools[exposed] = source.factory(exposed)
        toolset.origins[exposed] = source.origin
    return toolset


async def _mcp_sources(spec: RunSpec, stack: contextlib.AsyncExitStack) -> list[ToolSource]:
    sources = []
    for binding in spec.mcp_bindings:
        try:
            connection = await stack.enter_async_context(McpConnection(binding.server))
            infos = await connection.list_tools()
        except ToolError as exc:
            raise CapabilityUnavailable(f"MCP server {binding.server.alias!r} is unavailable: {exc.message}") from exc
        for info in infos:
            if binding.allowed_tools and info.name not in binding.allowed_tools:
                continue
            sources.append(ToolSource(
                origin=ToolOrigin(source=binding.server.alias, name=info.name, binding_id=binding.binding_id,
                                  approval_policy=binding.approval_policy),
                factory=lambda exposed, c=connection, i=info: McpTool(
                    connection=c, info=i, exposed_name=exposed, call_timeout_seconds=spec.tool_timeout_seconds),
            ))
    return sources


def _builtin_sources(spec: RunSpec) -> list[ToolSource]:
    return [
        ToolSource(
            origin=ToolOrigin(source="builtin", name=b.name, binding_id=b.binding_id, approval_policy=b.approval_policy),
            factory=lambda exposed, n=b.name: renamed(builtin_create(n), exposed),
        )
        for b in spec.builtin_bindings
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
