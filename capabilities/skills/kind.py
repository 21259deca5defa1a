"""The ``skill`` capability kind: a tenant's skill offered as a tool that runs a sub-run.

Validation: the binding names a skill of its tenant. Spec: :class:`SkillBindingSpec` (a
skill bound twice loads once). Toolset: one tool, source ``skill``, named as the skill; the
runner makes it (``OpenContext.subrun_tool``: ``sessions.runner.subrun.SkillTool``), so
this module needs nothing of ``sessions``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from capabilities.registry import CapabilityKind, OpenContext, kind_register
from capabilities.toolsets import KindToolset, ToolOrigin, ToolSource


@dataclass(frozen=True, slots=True)
class SkillBindingSpec:
    """A ``skill`` binding, as a run needs it."""

    kind: ClassVar[str] = "skill"
    skill_id: int
    name: str
    """The skill's name: the tool name asked for (before collision renaming)."""
    description: str
    allowed_tools: tuple[str, ...] = ()
    """Patterns (fnmatch) over the calling run's exposed tool names; empty: no tools."""
    binding_id: int | None = None
    approval_policy: tuple[dict[str, str], ...] = ()


class SkillKind(CapabilityKind):
    """Bindings of kind ``skill``."""

    key = "skill"
    label = "Skill"
    fields = ("skill", "approval_policy")
    starts_subruns = True
    position = 50

    def validate(self, binding: Any) -> dict[str, Any]:
        if not binding.skill_id:
            return {"skill": "Choose a skill."}
        if binding.tenant_id and binding.skill.tenant_id != binding.tenant_id:
            return {"skill": "Skill not found."}
        return {}

    def spec_key(self, binding: Any) -> int | None:
        return binding.skill_id

    def load_spec(self, binding: Any) -> SkillBindingSpec | None:
        if binding.skill_id is None:
            return None
        skill = binding.skill
        return SkillBindingSpec(
            skill_id=binding.skill_id, name=skill.name, description=skill.description,
            allowed_tools=tuple(skill.allowed_tools), binding_id=binding.pk, approval_policy=tuple(binding.approval_policy),
        )

    async def open_toolset(self, specs: Sequence[SkillBindingSpec], ctx: OpenContext) -> list[tuple[Any, KindToolset]]:
        if ctx.subrun_tool is None:
            raise RuntimeError("skills need a runner that provides OpenContext.subrun_tool")
        make = ctx.subrun_tool
        return [
            (b, KindToolset(sources=[ToolSource(
                origin=ToolOrigin(source="skill", name=b.name),
                factory=lambda exposed, b=b: make(b, exposed),
            )]))
            for b in specs
        ]


kind_register(SkillKind())
