"""The tools of one run: every bound capability opened through its kind, named for the model.

:func:`toolset_open` asks each registered capability kind (:mod:`capabilities.registry`) to
open the run's bindings of that kind, wraps each binding's toolset with its approval policy
(:class:`capabilities.toolsets.ApprovalPolicyToolset`), names all tools at once
(:class:`capabilities.toolsets.NamedToolset`) and builds the :class:`Toolset` the loop offers
to the model. Connections a kind opens (MCP sessions...) are entered on the run's
AsyncExitStack so they close with the run; MCP sessions come from the process's pool and
are only leased by the run (they outlive it).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from capabilities.builtin.kind import renamed
from capabilities.builtin.registry import builtin_create
from capabilities.registry import OpenContext, kinds
from capabilities.tools import Tool
from capabilities.toolsets import (
    ApprovalPolicyToolset,
    NamedToolset,
    ToolOrigin,
    ToolSource,
    approval_action,
)
from llm.types import ToolSpec
from sessions.runner.spec import RunSpec
from sessions.runner.threads import db

__all__ = [
    "CapabilityUnavailable", "Publish", "ToolOrigin", "ToolSource", "Toolset", "renamed", "toolset_open",
]

logger = logging.getLogger(__name__)

Publish = Callable[[str, dict[str, Any]], Awaitable[Any]]


class CapabilityUnavailable(Exception):
    """A bound capability could not be reached when the run started (kept for callers that
    still catch it; :func:`toolset_open` now leaves such a capability out instead, with a
    ``capability_unavailable`` event)."""


@dataclass(slots=True)
class Toolset:
    tools: dict[str, Tool] = field(default_factory=dict)
    """``{exposed name: Tool}``."""
    origins: dict[str, ToolOrigin] = field(default_factory=dict)
    """``{exposed name: ToolOrigin}``."""
    hidden: set[str] = field(default_factory=set)
    """Exposed names callable but not offered (skill tools past the depth limit: a call
    gets a clear error instead of "unknown tool")."""
    context: OpenContext | None = None
    """The OpenContext the kinds opened their tools with (None: the run has no bindings);
    the run's start context (:mod:`sessions.runner.run_context`) is asked with the same one."""

    @property
    def specs(self) -> list[ToolSpec]:
        """The ToolSpecs offered to the model (exposed names)."""
        return [t.spec for name, t in self.tools.items() if name not in self.hidden]

    def approval_action(self, exposed: str) -> str:
        """``allow``, ``ask`` or ``deny``: what the approval policy its binding wrapped the tool
        ``exposed`` with says about a call (first match wins; rules match the tool's own name
        and its exposed name; no rule or no binding: ``allow``)."""
        origin = self.origins.get(exposed)
        if origin is None or not origin.approval_policy:
            return "allow"
        return approval_action(origin.approval_policy, origin.name, exposed)

    def add_builtin(self, name: str) -> None:
        """Offer the built-in tool ``name`` from now on (no-op if it is already offered)."""
        if name not in self.tools:
            self.tools[name] = builtin_create(name)
            self.origins[name] = ToolOrigin(source="builtin", name=name)


async def toolset_open(spec: RunSpec, stack: contextlib.AsyncExitStack, *, publish: Publish | None = None) -> Toolset:
    """Open the run's bound capabilities (in this task: it also closes them) and build its tools.

    Each registered kind opens its bindings (``spec.bindings`` of that kind), in the kinds'
    order. A capability that cannot be reached (an MCP server that does not answer, refuses
    the handshake, cannot list its tools, or whose breaker is open) is left out of the run:
    the run goes on with the others, and ``publish`` announces it as
    ``capability_unavailable`` ``{source: "mcp", alias, error}``.

    Args:
        spec: The run.
        stack: The run's exit stack (leases on pooled MCP sessions are released on it).
        publish: The run's event publisher, for ``capability_unavailable`` (None: logged only).

    Returns:
        The Toolset: ``{exposed name: Tool}`` and ``{exposed name: ToolOrigin}``.
    """
    toolset = Toolset()
    if not spec.bindings:
        return toolset

    def subrun_tool(skill: Any, exposed: str) -> Tool:
        from sessions.runner.subrun import SkillTool

        return SkillTool(skill=skill, exposed_name=exposed, parent=spec, parent_toolset=toolset)

    ctx = OpenContext(
        tenant_id=spec.tenant_id, run_id=spec.run_id, tool_timeout_seconds=spec.tool_timeout_seconds, stack=stack,
        publish=publish, in_thread=db, subrun_tool=subrun_tool, run=spec, user_id=spec.user_id, agent_id=spec.agent_id,
    )
    toolset.context = ctx
    by_kind: dict[str, list[Any]] = {}
    for binding in spec.bindings:
        by_kind.setdefault(binding.kind, []).append(binding)
    wrapped = []
    for kind in kinds():
        specs = by_kind.get(kind.key)
        if specs:
            for binding, opened in await kind.open_toolset(specs, ctx):
                wrapped.append(ApprovalPolicyToolset(opened, binding_id=binding.binding_id,
                                                     policy=tuple(binding.approval_policy)))
    for exposed, source in NamedToolset(wrapped).named():
        toolset.tools[exposed] = source.factory(exposed)
        toolset.origins[exposed] = source.origin
    return toolset
