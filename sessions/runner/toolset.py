"""The tools of one run: every bound capability opened through its kind, named for the model,
under the runner's registered wrappers.

:func:`toolset_open` asks each registered capability kind (:mod:`capabilities.registry`) to
open the run's bindings of that kind, gives each binding's tools its id and approval rules
(:meth:`capabilities.toolsets.KindToolset.for_binding`), names all tools at once
(:class:`capabilities.toolsets.NamedToolset`) and builds the run's :class:`Toolset`: those
named tools under the wrappers of :data:`sessions.runner.interceptors.INTERCEPTORS` (approval
policy, start record, output, timeout), through which :mod:`sessions.runner.tool_execution`
runs every call. Connections a kind opens (MCP sessions...) are entered on the run's
AsyncExitStack so they close with the run; MCP sessions come from the process's pool and
are only leased by the run (they outlive it).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from capabilities.builtin.kind import renamed
from capabilities.builtin.registry import builtin_create
from capabilities.registry import OpenContext, kinds
from capabilities.tools import ModelSampler, Tool
from capabilities.toolsets import (
    NamedToolset,
    ToolInvocation,
    ToolOrigin,
    ToolOutcome,
    ToolSource,
    WrapperToolset,
)
from llm.types import ToolSpec
from sessions.runner.interceptors import CLIENT_SOURCE, ClientTool, intercepted
from sessions.runner.spec import RunSpec
from sessions.runner.threads import db

__all__ = [
    "CapabilityUnavailable", "ClientToolClash", "Publish", "ToolOrigin", "ToolSource", "Toolset", "renamed", "toolset_open",
]

logger = logging.getLogger(__name__)

Publish = Callable[[str, dict[str, Any]], Awaitable[Any]]


class CapabilityUnavailable(Exception):
    """A bound capability could not be reached when the run started (kept for callers that
    still catch it; :func:`toolset_open` now leaves such a capability out instead, with a
    ``capability_unavailable`` event)."""


class Toolset(WrapperToolset):
    """A run's toolset: its named tools (:attr:`table`, a :class:`~capabilities.toolsets.NamedToolset`)
    under the registered wrappers (:func:`sessions.runner.interceptors.intercepted`).

    :meth:`call_tool` resolves the called tool by its exposed name and sends the call through
    the wrappers; :attr:`tools`, :attr:`origins` and :attr:`hidden` are the table's.
    """

    def __init__(
        self, table: NamedToolset | None = None, *, tools: dict[str, Tool] | None = None,
        origins: dict[str, ToolOrigin] | None = None, hidden: set[str] | None = None, context: OpenContext | None = None,
    ) -> None:
        """``table``: the named tools (default: an empty one), to which ``tools``, ``origins`` and
        ``hidden`` are added."""
        self.table = table if table is not None else NamedToolset()
        self.table.tools.update(tools or {})
        self.table.origins.update(origins or {})
        self.table.hidden.update(hidden or ())
        super().__init__(intercepted(self.table))
        self.context = context
        """The OpenContext the kinds opened their tools with (None: the run has no bindings);
        the run's start context (:mod:`sessions.runner.run_context`) is asked with the same one."""
        self.handoff: tuple[int, str] | None = None
        """Set by a handoff tool call that finished (``sessions.runner.subrun.AgentTool``): ``(the
        agent taking over, its reply)``; the turn then ends the run with that reply."""
        self.sampler: ModelSampler | None = None
        """The run's model route for outside servers' sampling requests (each call's
        ``ToolContext.sample``; set by the loop, :func:`sessions.runner.sampling.run_sampler`)."""

    @property
    def tools(self) -> dict[str, Tool]:
        """``{exposed name: Tool}``."""
        return self.table.tools

    @property
    def origins(self) -> dict[str, ToolOrigin]:
        """``{exposed name: ToolOrigin}``."""
        return self.table.origins

    @property
    def hidden(self) -> set[str]:
        """Exposed names callable but not offered (skill tools past the depth limit: a call
        gets a clear error instead of "unknown tool")."""
        return self.table.hidden

    @property
    def specs(self) -> list[ToolSpec]:
        """The ToolSpecs offered to the model (exposed names)."""
        return [t.spec for name, t in self.tools.items() if name not in self.hidden]

    def add_builtin(self, name: str) -> None:
        """Offer the built-in tool ``name`` from now on (no-op if it is already offered)."""
        if name not in self.tools:
            self.tools[name] = builtin_create(name)
            self.origins[name] = ToolOrigin(source="builtin", name=name)

    async def call_tool(self, call: ToolInvocation) -> ToolOutcome:
        """Run ``call`` (``call.name``: an exposed name) through the wrappers; see
        :meth:`capabilities.toolsets.AbstractToolset.call_tool` for the outcome and what it raises."""
        call.tool, call.origin = self.tools.get(call.name), self.origins.get(call.name)
        call.offer_tool = self.add_builtin
        return await self.wrapped.call_tool(call)


SkillToolFactory = Callable[[Any, str, RunSpec, "Toolset"], Tool]
"""``factory(skill binding spec, exposed name, parent run, parent toolset)`` → the Tool a bound
skill is offered as (:meth:`sessions.runner.subrun.SkillTool.for_run`, given by the adapters:
this module does not import the sub-run's module, which runs the loop over a toolset)."""


async def toolset_open(
    spec: RunSpec, stack: contextlib.AsyncExitStack, *, publish: Publish | None = None,
    skill_tool: SkillToolFactory | None = None,
) -> Toolset:
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
    if spec.bindings:
        await _open_bindings(spec, stack, toolset, publish=publish, skill_tool=skill_tool)
    client_tools_add(toolset, spec.request_options.client_tools)
    return toolset


class ClientToolClash(ValueError):
    """A tool the API client declared has the exposed name of one of the agent's own tools
    (the API refuses the names it can tell in advance; this is the run's own check)."""


def client_tools_add(toolset: Toolset, specs: tuple[ToolSpec, ...]) -> None:
    """Offer the API client's tools (:class:`~sessions.runner.interceptors.ClientTool`, origin
    source ``client``) beside the agent's.

    Raises:
        ClientToolClash: a name is taken by one of the agent's tools (the run fails
            ``configuration``: which of two tools the model meant could not be told).
    """
    for tool_spec in specs:
        if tool_spec.name in toolset.tools:
            raise ClientToolClash(f"The client tool {tool_spec.name!r} has the name of one of the agent's tools; "
                                  "rename it.")
        toolset.tools[tool_spec.name] = ClientTool(tool_spec)
        toolset.origins[tool_spec.name] = ToolOrigin(source=CLIENT_SOURCE, name=tool_spec.name)


def _file_attacher(spec: RunSpec, publish: Publish | None) -> Callable[[str, str, bytes], Awaitable[str]]:
    """``OpenContext.attach_file`` of the run: the file stored as an attachment of its user message
    (:func:`sessions.chat_services.run_file_attach`), announced as ``artifact_updated``."""

    async def attach(name: str, mime_type: str, data: bytes) -> str:
        from sessions.chat_services import run_file_attach

        artifact, line = await db(run_file_attach)(run_id=spec.run_id, name=name, mime_type=mime_type, data=data)
        if publish is not None:
            await publish("artifact_updated", {"artifact_id": artifact.pk, "name": artifact.name,
                                               "mime_type": artifact.mime_type, "size_bytes": artifact.size_bytes,
                                               "tool_call_id": None})
        return line

    return attach


async def _open_bindings(spec: RunSpec, stack: contextlib.AsyncExitStack, toolset: Toolset, *,
                         publish: Publish | None, skill_tool: SkillToolFactory | None) -> None:
    """Open the run's bindings, each kind in turn, and name their tools into ``toolset``."""

    def subrun_tool(skill: Any, exposed: str) -> Tool:
        if skill_tool is None:
            raise RuntimeError("this run's toolset was opened without a factory of skill tools")
        return skill_tool(skill, exposed, spec, toolset)

    ctx = OpenContext(
        tenant_id=spec.tenant_id, run_id=spec.run_id, tool_timeout_seconds=spec.tool_timeout_seconds, stack=stack,
        publish=publish, in_thread=db, subrun_tool=subrun_tool, run=spec, user_id=spec.user_id, agent_id=spec.agent_id,
        attach_file=_file_attacher(spec, publish), attended=not spec.request_options.unattended,
    )
    toolset.context = ctx
    by_kind: dict[str, list[Any]] = {}
    for binding in spec.bindings:
        by_kind.setdefault(binding.kind, []).append(binding)
    bound = []
    for kind in kinds():
        specs = by_kind.get(kind.key)
        if specs:
            for binding, opened in await kind.open_toolset(specs, ctx):
                bound.append(opened.for_binding(binding.binding_id, binding.approval_policy))
    toolset.table.add_named(bound)
