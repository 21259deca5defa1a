"""The ``command`` capability kind: a tenant's slash command bound to an agent.

Binding: ``config = {"command": <id>}`` (a :class:`~capabilities.commands.models.Command` of the
binding's tenant). A command is chosen by the person in the chat app, never by the model: the
kind offers no tools and a run loads nothing for it (:meth:`CommandKind.load_spec` is None).
Which commands an agent's chat lists is read from the agent's bindings by
:mod:`agents.commands`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from capabilities.registry import CapabilityKind, OpenContext, kind_register
from capabilities.toolsets import KindToolset

KEY = "command"


def config_command_id(config: Any) -> int | None:
    """``config["command"]`` when it is a positive integer, else None."""
    value = config.get("command") if isinstance(config, dict) else None
    return value if type(value) is int and value > 0 else None


class CommandKind(CapabilityKind):
    """Bindings of kind ``command``."""

    key = KEY
    label = "Slash command"
    fields = ("config",)
    position = 90

    def validate(self, binding: Any) -> dict[str, Any]:
        """``config`` is ``{"command": <id>}`` naming a command of the binding's tenant."""
        from capabilities.commands.models import Command

        command_id = config_command_id(binding.config)
        if command_id is None or set(binding.config) != {"command"}:
            return {"config": 'Name the command to bind: {"command": <id>} (GET /api/v1/admin/commands/).'}
        if not binding.tenant_id or not Command.all_tenants.filter(pk=command_id, tenant_id=binding.tenant_id).exists():
            return {"config": "Command not found."}
        return {}

    def spec_key(self, binding: Any) -> int | None:
        return config_command_id(binding.config)

    def load_spec(self, binding: Any) -> None:
        """Nothing: a run has no use for a command (the person chose it before sending)."""
        return None

    async def open_toolset(self, specs: Sequence[Any], ctx: OpenContext) -> list[tuple[Any, KindToolset]]:
        """No tools (never called: :meth:`load_spec` gives runs no spec)."""
        return []


kind_register(CommandKind())
