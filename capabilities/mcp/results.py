"""How an MCP tool's result reads for the model: content blocks rendered as text
(:func:`render_block`), a successful ``CallToolResult`` as a :class:`~capabilities.tools.ToolResult`
(:func:`to_tool_result`), an ``isError`` one as its message (:func:`error_text`).

Text blocks pass verbatim; images, audio, resource links and blob resources become one-line
summaries such as ``[image image/png, 1234 bytes]``; ``structuredContent`` becomes the result's
``data`` and, when no block is text, also leads its content as JSON. A string of the structured
content that repeats a content block's binary (an image's or audio's base64, bare or as a
``data:`` URL; some servers send both) is replaced there by the block's summary, so the model
is not sent the image as base64 text on top of the image, and the stored result does not keep
it twice (:func:`without_repeated_binary`).
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
        title = block.title or block.name
        named = f' "{title}"' if title else ""
        return f"[resource link {block.uri}{named}{mime}]", False
    if isinstance(block, mcp_types.EmbeddedResource):
        resource = block.resource
        mime = f" {resource.mime_type}" if resource.mime_type else ""
        if isinstance(resource, mcp_types.TextResourceContents):
            return f"[resource {resource.uri}{mime}]\n{resource.text}", False
        return f"[resource {resource.uri}{mime}, {_base64_size(resource.blob)} bytes]", False
    return f"[{getattr(block, 'type', type(block).__name__)} content]", False


_EXTENSIONS = {"image/png": "png", "image/jpeg": "jpg", "image/gif": "gif", "image/webp": "webp",
               "audio/wav": "wav", "audio/mpeg": "mp3", "audio/ogg": "ogg"}


def stored_binary(block: Any, *, alias: str, tool_name: str, index: int) -> tuple[str, str, str, str] | None:
    """What of a tool result's block is stored as an artifact (a download in the chat app): images,
    audio and embedded blob resources (a PDF, an image, any file a server returns).

    Args:
        index: The block's position in the result (0-based), for the file name.

    Returns:
        ``(label, mime type, base64 data, file name)`` or None (the block is rendered as text).
        ``label`` starts the model's line: ``image``, ``audio``, ``resource <uri>``; the file is
        ``<alias>-<tool>-<n>.<ext>`` for images and audio, the URI's last segment for resources.
    """
    if isinstance(block, mcp_types.ImageContent | mcp_types.AudioContent):
        kind = "image" if isinstance(block, mcp_types.ImageContent) else "audio"
        name = f"{alias}-{tool_name}-{index + 1}.{_EXTENSIONS.get(block.mime_type, 'bin')}"
        return kind, block.mime_type, block.data, name
    if isinstance(block, mcp_types.EmbeddedResource) and isinstance(block.resource, mcp_types.BlobResourceContents):
        resource = block.resource
        mime = resource.mime_type or "application/octet-stream"
        name = resource.uri.rstrip("/").rsplit("/", 1)[-1][:200] or f"{alias}-{tool_name}-{index + 1}.bin"
        return f"resource {resource.uri}", mime, resource.blob, name
    return None


def _binaries(blocks: Any) -> dict[str, str]:
    """The base64 payloads of ``blocks`` (images, audio, blob resources) → their summaries."""
    found: dict[str, str] = {}
    for block in blocks:
        if isinstance(block, mcp_types.ImageContent | mcp_types.AudioContent):
            found[block.data] = render_block(block)[0]
        elif isinstance(block, mcp_types.EmbeddedResource) and isinstance(
            block.resource, mcp_types.BlobResourceContents
        ):
            found[block.resource.blob] = render_block(block)[0]
    return found


def without_repeated_binary(data: Any, binaries: dict[str, str]) -> Any:
    """``data`` (structured content: JSON values) with every string that is one of
    ``binaries``' base64 payloads, bare or as a ``data:<mime>;base64,`` URL, replaced by that
    payload's summary (e.g. ``[image image/png, 1234 bytes]``). Other values unchanged."""
    if not binaries:
        return data
    if isinstance(data, str):
        payload = data.split(";base64,", 1)[1] if data.startswith("data:") and ";base64," in data else data
        return binaries.get(payload, data)
    if isinstance(data, dict):
        return {key: without_repeated_binary(value, binaries) for key, value in data.items()}
    if isinstance(data, list):
        return [without_repeated_binary(value, binaries) for value in data]
    return data


def to_tool_result(result: mcp_types.CallToolResult) -> ToolResult:
    """Map a successful ``CallToolResult`` to a ``ToolResult`` (see ``McpConnection.call_tool``)."""
    parts: list[str] = []
    has_text = False
    for block in result.content:
        text, is_text = render_block(block)
        has_text = has_text or is_text
        parts.append(text)
    data = without_repeated_binary(result.structured_content, _binaries(result.content))
    return tool_result(parts, has_text=has_text, data=data)


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
