"""The ``builtin`` capability kind: one of the platform's own tools (:mod:`capabilities.builtin.registry`).

Validation: ``builtin_name`` is a registered built-in tool. Spec: :class:`BuiltinBindingSpec`
(a tool bound twice loads once: the first binding). Toolset: the tool under its bare name,
source ``builtin``; a fresh instance per run.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from capabilities.builtin.registry import builtin_create, builtin_names
from capabilities.registry import CapabilityKind, OpenContext, kind_register
from capabilities.tools import Tool
from capabilities.toolsets import KindToolset, ToolOrigin, ToolSource


@dataclass(frozen=True, slots=True)
class BuiltinBindingSpec:
    """A ``builtin`` binding, as a run needs it."""

    kind: ClassVar[str] = "builtin"
    name: str
    """The registered built-in tool name."""
    binding_id: int | None = None
    approval_policy: tuple[dict[str, str], ...] = ()
    config: dict = field(default_factory=dict)


def renamed(tool: Tool, exposed: str) -> Tool:
    """``tool`` with its spec carrying ``exposed`` as the name."""
    if tool.spec.name != exposed:
        tool.spec = dataclasses.replace(tool.spec, name=exposed)
    return tool


class BuiltinKind(CapabilityKind):
    """Bindings of kind ``builtin``."""

    key = "builtin"
    label = "Built-in tool"
    fields = ("builtin_name", "approval_policy")
    position = 20

    def validate(self, binding: Any) -> dict[str, Any]:
        names = builtin_names()
        if binding.builtin_name not in names:
            return {"builtin_name": f"Unknown built-in tool; choose one of {sorted(names)}."}
        return {}

    def spec_key(self, binding: Any) -> str:
        return binding.builtin_name

    def load_spec(self, binding: Any) -> BuiltinBindingSpec:
        return BuiltinBindingSpec(name=binding.builtin_name, binding_id=binding.pk,
                                  approval_policy=tuple(binding.approval_policy), config=dict(binding.config))

    async def open_toolset(self, specs: Sequence[BuiltinBindingSpec], ctx: OpenContext) -> list[tuple[Any, KindToolset]]:
        return [
            (b, KindToolset(sources=[ToolSource(
                origin=ToolOrigin(source="builtin", name=b.name),
                factory=lambda exposed, n=b.name: renamed(builtin_create(n), exposed),
            )]))
            for b in specs
        ]


kind_register(BuiltinKind())
