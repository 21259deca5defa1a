"""The one Tool interface every capability kind implements.

A tool is what the model can call: an exposed name, a description (a prompt: the model reads
it), a JSON Schema for its arguments, and an async ``execute``. MCP tools, built-in tools,
CLI commands and browser operations all implement :class:`Tool`; the runner knows nothing
else about them.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

from llm.types import ToolSpec


class ToolError(Exception):
    """A tool failed in a way the model should hear about.

    The message goes back to the model as the failed tool call's result, so write it for the
    model: say what went wrong and, where possible, what to do instead.
    """

    def __init__(self, message: str, *, code: str = "tool_error") -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        """Short machine-readable reason, e.g. ``mcp_error``, ``timeout``, ``invalid_arguments``."""


@dataclass(frozen=True, slots=True)
class ToolResult:
    """What a successful tool call returns."""

    content: str
    """Text the model sees as the tool result."""
    data: Any = None
    """Optional structured result (JSON-serialisable), stored beside the text and shown in the UI."""


@dataclass(slots=True)
class ToolContext:
    """What a tool may know about the call it serves.

    Built by the runner for each call. Tools must not reach for tenant data outside
    ``tenant_id``; the runner has already set the tenant scope for the current task.
    """

    tenant_id: int
    session_id: int
    run_id: int
    tool_call_id: int
    """Primary key of the ToolCall row."""
    publish: Callable[[str, dict[str, Any]], Awaitable[None]] = field(default=None)  # type: ignore[assignment]
    """``await publish(event_type, data)`` puts an event on the session stream."""


class Tool(abc.ABC):
    """A callable capability as the model sees it."""

    spec: ToolSpec
    """Exposed name, description and argument schema."""

    @abc.abstractmethod
    async def execute(self, arguments: dict[str, Any], context: ToolContext) -> ToolResult:
        """Run the tool.

        Args:
            arguments: The model's arguments, already parsed from JSON (not yet schema-checked).
            context: Ids of the tenant, session, run and tool call, and an event publisher.

        Returns:
            The result the model sees.

        Raises:
            ToolError: A failure the model should be told about (recorded as a failed call).
        """
