"""MCP tools as :class:`capabilities.tools.Tool`: one listed MCP tool behind its exposed name.

No Django imports. The registry builds these from ``McpConnection.list_tools()`` and
``capabilities.naming.assign_exposed_names``; the runner only sees ``Tool``.
"""

from __future__ import annotations

import copy
import logging
from typing import Any

from capabilities.mcp.client import McpConnection, McpToolInfo, check_timeout_seconds
from capabilities.naming import EXPOSED_NAME_RE
from capabilities.tools import Tool, ToolContext, ToolResult
from llm.types import ToolSpec

logger = logging.getLogger(__name__)

MAX_DESCRIPTION_CHARS = 1_024
"""Longest description offered to the model; longer ones are cut and end with ``...``."""


def cap_description(description: str, *, max_chars: int = MAX_DESCRIPTION_CHARS) -> str:
    """``description`` stripped and cut to at most ``max_chars`` characters (ending ``...`` if cut)."""
    text = description.strip()
    if len(text) <= max_chars:
        return text
    return text[: max_chars - 3].rstrip() + "..."


def normalize_input_schema(schema: Any) -> dict[str, Any]:
    """Make an MCP input schema usable as function ``parameters``: an object schema.

    Args:
        schema: The server's ``inputSchema`` (anything; servers are not trusted).

    Returns:
        A deep copy that has ``"type": "object"`` and a ``"properties"`` dict. A missing or
        non-dict schema, or one whose type is not ``object``, becomes
        ``{"type": "object", "properties": {}}`` (logged at WARNING for the latter).
    """
    if not isinstance(schema, dict) or not schema:
        return {"type": "object", "properties": {}}
    schema_type = schema.get("type", "object")
    if schema_type != "object":
        logger.warning("MCP tool input schema has type %r, not 'object'; offering no parameters", schema_type)
        return {"type": "object", "properties": {}}
    out = copy.deepcopy(schema)
    out["type"] = "object"
    if not isinstance(out.get("properties"), dict):
        out["properties"] = {}
    return out


class McpTool(Tool):
    """One tool of an open :class:`McpConnection`, offered to the model under ``exposed_name``.

    The connection must stay open (its ``async with`` block) for as long as the tool is used.
    """

    untrusted = True  # results come from an outside server

    def __init__(
        self,
        *,
        connection: McpConnection,
        info: McpToolInfo,
        exposed_name: str,
        call_timeout_seconds: float,
    ) -> None:
        """Wrap a listed tool.

        Args:
            connection: The open connection that listed ``info``.
            info: The tool as the server listed it.
            exposed_name: The name the model sees (from ``assign_exposed_names``);
                must match ``^[a-zA-Z0-9_-]{1,64}$``.
            call_timeout_seconds: Bound on each call, positive and finite.

        Raises:
            ValueError: ``exposed_name`` or ``call_timeout_seconds`` is invalid.
        """
        if not EXPOSED_NAME_RE.match(exposed_name):
            raise ValueError(f"exposed_name must match ^[a-zA-Z0-9_-]{{1,64}}$, got {exposed_name!r}")
        check_timeout_seconds(call_timeout_seconds, what="call_timeout_seconds")
        self.connection = connection
        self.info = info
        self.call_timeout_seconds = call_timeout_seconds
        description = info.description or (
            f"Tool {info.name!r} of the MCP server {connection.config.alias!r}."
        )
        self.spec = ToolSpec(
            name=exposed_name,
            description=cap_description(description),
            parameters=normalize_input_schema(info.input_schema),
        )

    async def execute(self, arguments: dict[str, Any], context: ToolContext) -> ToolResult:
        """Call the MCP tool (by its server name) with the model's arguments.

        Args:
            arguments: The model's arguments; the MCP server validates them.
            context: Unused: MCP servers get no tenant/session ids.

        Returns:
            ``ToolResult(content, data)`` as mapped by ``McpConnection.call_tool``.

        Raises:
            ToolError: ``mcp_tool_error`` (the tool reported an error), ``timeout`` (after
                ``call_timeout_seconds``) or ``mcp_error`` (protocol/transport failure).
        """
        return await self.connection.call_tool(
            self.info.name, arguments, timeout_seconds=self.call_timeout_seconds
        )
