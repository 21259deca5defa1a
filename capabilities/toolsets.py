"""Toolsets: the tools a capability opens for a run, and the wrappers every kind shares.

A capability kind (:mod:`capabilities.registry`) opens one :class:`KindToolset` per binding:
its tools under their *own* names (the name inside their source: an MCP server's tool name,
a built-in tool's name, ...). Two wrappers then apply, the same for every kind, in the
manner of pydantic-ai's ``WrapperToolset`` / ``FilteredToolset`` / ``PrefixedToolset``:

- :class:`ApprovalPolicyToolset`: the binding's approval rules go with each of its tools;
  :func:`approval_action` decides a call (first match wins; a rule matches the tool's own
  name or its exposed name; no match: allow);
- :class:`NamedToolset`: the union of a run's toolsets, each tool given the name the model
  sees (:func:`capabilities.naming.assign_exposed_names`: ``<alias>__<tool>`` for qualified
  sources such as MCP servers, bare names otherwise, names over 64 characters shortened
  with a hash; independent of the order servers list their tools).

No Django and no ``sessions`` imports: the runner builds its run-level ``Toolset`` from a
:class:`NamedToolset`.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from capabilities.naming import assign_exposed_names
from capabilities.tools import Tool

APPROVAL_ACTIONS = ("allow", "ask", "deny")
"""The actions of an approval rule (``agents.models.ApprovalAction`` has the same values)."""


def approval_action(policy: Sequence[dict[str, str]], *names: str) -> str:
    """The action of the first rule whose pattern matches any of ``names``; ``"allow"`` if none.

    Args:
        policy: ``[{"pattern": str, "action": "allow" | "ask" | "deny"}, ...]`` in order.
        names: The names a call is known by (its own name, its exposed name).

    Patterns are :func:`fnmatch.fnmatchcase` patterns (``*``, ``?``, ``[...]``).
    """
    for rule in policy:
        if any(fnmatch.fnmatchcase(name, rule["pattern"]) for name in names):
            return rule["action"]
    return "allow"


@dataclass(frozen=True, slots=True)
class ToolOrigin:
    """Where an exposed tool comes from: what approval policies and the UI need."""

    source: str
    """The capability's alias (an MCP server alias, ``builtin``, ``cli``, ...)."""
    name: str
    """The tool's name inside its source."""
    binding_id: int | None = None
    """The CapabilityBinding it was bound by (None: offered by the platform)."""
    approval_policy: tuple[dict[str, str], ...] = ()
    """The binding's ``[{pattern, action}]`` rules (set by :class:`ApprovalPolicyToolset`)."""


@dataclass(frozen=True, slots=True)
class ToolSource:
    """One tool a toolset offers, before it is named for the model."""

    origin: ToolOrigin
    factory: Callable[[str], Tool]
    """``factory(exposed_name)`` → the Tool, its spec carrying the exposed name."""


@dataclass(slots=True)
class KindToolset:
    """The tools one binding contributes to a run, under their own names.

    ``qualified``: its tools are always exposed as ``<source>__<name>`` (MCP servers: names
    stay stable when another server is bound or a server adds a tool).
    """

    sources: list[ToolSource] = field(default_factory=list)
    qualified: bool = False

    def tool_sources(self) -> list[ToolSource]:
        """The tools (own names), as wrapped toolsets return them."""
        return list(self.sources)


@dataclass(slots=True)
class ApprovalPolicyToolset:
    """Wrapper: every tool of ``wrapped`` carries its binding's approval rules.

    The run asks :func:`approval_action` with ``origin.approval_policy``, the tool's own
    name and its exposed name before a call runs: ``ask`` pauses for a human, ``deny`` fails
    the call without running it.
    """

    wrapped: KindToolset
    binding_id: int | None
    policy: tuple[dict[str, str], ...]

    @property
    def qualified(self) -> bool:
        return self.wrapped.qualified

    def tool_sources(self) -> list[ToolSource]:
        """The wrapped tools, their origins carrying ``binding_id`` and ``policy``."""
        return [
            ToolSource(origin=ToolOrigin(s.origin.source, s.origin.name, self.binding_id, self.policy), factory=s.factory)
            for s in self.wrapped.tool_sources()
        ]


@dataclass(slots=True)
class NamedToolset:
    """Wrapper over a run's toolsets: one flat namespace of exposed names.

    :meth:`named` returns ``[(exposed name, ToolSource)]`` in the toolsets' order; names come
    from :func:`capabilities.naming.assign_exposed_names` over all tools at once (so a
    collision between two kinds' tools is resolved the same wherever they come from).
    """

    toolsets: Sequence[Any]
    """:class:`KindToolset` or wrappers of one (anything with ``tool_sources()`` and ``qualified``)."""

    def named(self) -> list[tuple[str, ToolSource]]:
        sources: list[ToolSource] = []
        qualified: set[str] = set()
        for toolset in self.toolsets:
            found = toolset.tool_sources()
            sources += found
            if toolset.qualified:
                qualified.update(s.origin.source for s in found)
        names = assign_exposed_names([(s.origin.source, s.origin.name) for s in sources], qualified_sources=qualified)
        return [(names[(s.origin.source, s.origin.name)], s) for s in sources]


def sources_toolset(sources: Iterable[ToolSource], *, qualified: bool = False) -> KindToolset:
    """A :class:`KindToolset` of ``sources``."""
    return KindToolset(sources=list(sources), qualified=qualified)
