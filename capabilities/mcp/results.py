"""How an MCP tool's result reads for the model: content blocks rendered as text
(:func:`render_block`), a successful ``CallToolResult`` as a :class:`~capabilities.tools.ToolResult`
(:func:`to_tool_result`), an ``isError`` one as its message (:func:`error_text`).

Text blocks pass verbatim; images, audio, resource links and blob resources become one-line
summaries such as ``[image image/png, 1234 bytes]``; ``structuredContent`` becomes the result's
``data`` and, when no block is text, also leads its content as JSON.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

import mcp_types

from capabilities.tools import ToolResult


def _base64_size(data: str) -> int:
    """Decoded size in bytes of base64 ``data`` (estimated from its length if it is invalid)."""
    try:
        return len(base64.b64decode(data, validate=False))
    except (binascii.Error, ValueError):
        return len(data) * 3 // 4


def render_block(block: Any) -> tuple[str, bool]:
    """Render one content block as text for the model.

    Returns:
        ``(text, is_text_block)``: text blocks verbatim; images, audio, resource links and
        blob resources as one-line summaries like ``[image image/png, 1234 bytes]``; embedded
        text resources as a summary line followed by their text.
    """
    if isinstance(block, mcp_types.TextContent):
        return block.text, True
    if isinstance(block, mcp_types.ImageContent):
        return f"[image {block.mime_type}, {_base64_size(block.data)} bytes]", False
    if isinstance(block, mcp_types.AudioContent):
        return f"[audio {block.mime_type}, {_base64_size(block.data)} bytes]", False
    if isinstance(block, mcp_types.ResourceLink):
        mime = f" {block.mime_type}" if block.mime_type else ""
        return f"[resource link {block.uri}{mime}]", False
    if isinstance(block, mcp_types.EmbeddedResource):
        resource = block.resource
        mime = f" {resource.mime_type}" if resource.mime_type else ""
        if isinstance(resource, mcp_types.TextResourceContents):
            return f"[resource {resource.uri}{mime}]\n{resource.text}", False
        return f"[resource {resource.uri}{mime}, {_base64_size(resource.blob)} bytes]", False
    return f"[{getattr(block, 'type', type(block).__name__)} content]", False


def to_tool_result(result: mcp_types.CallToolResult) -> ToolResult:
    """Map a successful ``CallToolResult`` to a ``ToolResult`` (see ``McpConnection.call_tool``)."""
    parts: list[str] = []
    has_text = False
    for block in result.content:
        text, is_text = render_block(block)
        has_text = has_text or is_text
        parts.append(text)
    return tool_result(parts, has_text=has_text, data=result.structured_content)


def tool_result(parts: list[str], *, has_text: bool, data: Any) -> ToolResult:
    """The ``ToolResult`` of rendered content blocks: structured content goes first, as JSON,
    when no block was text (so the model still reads it)."""
    if data is not None and not has_text:
        parts = [json.dumps(data, ensure_ascii=False, default=str), *parts]
    return ToolResult(content="\n".join(parts), data=data)


def error_text(result: mcp_types.CallToolResult, name: str) -> str:
    """The text of an ``isError`` result, for the model."""
    text = "\n".join(render_block(block)[0] for block in result.content).strip()
    if not text and result.structured_content is not None:
        text = json.dumps(result.structured_content, ensure_ascii=False, default=str)
    return text or f"MCP tool {name!r} reported an error without a message"
