"""The ``cli`` capability kind: a tenant's CLI command as one tool (:mod:`capabilities.cli.tool`).

Validation: the binding names a CLI command of its tenant. Spec: :class:`CliBindingSpec` (the
command's config with its decrypted environment; a disabled or deleted command is left out;
a command bound twice loads once). Toolset: one tool, source ``cli``, named as the command;
no process starts until it is called.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from capabilities.cli.tool import CliCommandConfig, CliTool
from capabilities.registry import CapabilityKind, OpenContext, kind_register
from capabilities.toolsets import KindToolset, ToolOrigin, ToolSource


@dataclass(frozen=True, slots=True)
class CliBindingSpec:
    """A ``cli`` binding, as a run needs it."""

    kind: ClassVar[str] = "cli"
    command: CliCommandConfig
    """The command: template, schema, limits, sandbox flags and its decrypted env."""
    binding_id: int | None = None
    approval_policy: tuple[dict[str, str], ...] = ()
    """``[{pattern, action}]`` rules (capabilities.toolsets.approval_action)."""


class CliKind(CapabilityKind):
    """Bindings of kind ``cli``."""

    key = "cli"
    label = "CLI command"
    fields = ("cli_command", "allowed_tools", "approval_policy")
    position = 30

    def validate(self, binding: Any) -> dict[str, Any]:
        if not binding.cli_command_id:
            return {"cli_command": "Choose a CLI command."}
        if binding.tenant_id and binding.cli_command.tenant_id != binding.tenant_id:
            return {"cli_command": "CLI command not found."}
        return {}

    def spec_key(self, binding: Any) -> int | None:
        return binding.cli_command_id

    def load_spec(self, binding: Any) -> CliBindingSpec | None:
        from capabilities.cli.models import CliCommand
        from capabilities.services import cli_command_config

        command = CliCommand.objects.filter(pk=binding.cli_command_id, enabled=True).first()
        if command is None:
            return None
        return CliBindingSpec(command=cli_command_config(command=command), binding_id=binding.pk,
                              approval_policy=tuple(binding.approval_policy))

    async def open_toolset(self, specs: Sequence[CliBindingSpec], ctx: OpenContext) -> list[tuple[Any, KindToolset]]:
        return [
            (b, KindToolset(sources=[ToolSource(
                origin=ToolOrigin(source="cli", name=b.command.name),
                factory=lambda exposed, c=b.command: CliTool(c, exposed_name=exposed),
            )]))
            for b in specs
        ]


kind_register(CliKind())
