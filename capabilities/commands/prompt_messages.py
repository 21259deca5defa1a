"""An MCP prompt's messages (``prompts/get``) as what the chat app puts into its message box:
one text and the files to attach (no Django imports).

- text blocks: their text; a message of another role than ``user`` is labelled with its role
  (``Assistant:``), since the chat sends one message as the person;
- images, audio and embedded binary resources: files to attach (``{filename, mime_type,
  data}``, base64), at most :data:`MAX_ATTACHMENT_BYTES` each (a larger one is named in the
  text instead);
- embedded text resources: a fenced block under their URI;
- resource links: a Markdown link.

Spec: MCP "Prompts", ``PromptMessage`` and its content blocks.
"""

from __future__ import annotations

import base64
import binascii
import mimetypes
from dataclasses import dataclass, field
from typing import Any

MAX_ATTACHMENT_BYTES = 10 * 1024 * 1024
"""The chat app's attachment limit (``ATTACHMENT_MAX_BYTES``' default)."""
MAX_TEXT_CHARS = 200_000
"""The longest text given to the message box."""


@dataclass(slots=True)
class RenderedPrompt:
    """``text`` for the message box and ``attachments`` ``[{filename, mime_type, data}]``."""

    text: str = ""
    attachments: list[dict[str, str]] = field(default_factory=list)


def _decoded_size(data: str) -> int:
    try:
        return len(base64.b64decode(data, validate=False))
    except (binascii.Error, ValueError):
        return 0


def _attachment(out: RenderedPrompt, prefix: str, data: str, mime_type: str, name: str = "") -> str:
    """Add a file (base64 ``data``) to ``out``; returns '' or a note for the text when it is left out."""
    size = _decoded_size(data)
    n = len(out.attachments) + 1
    filename = name or f"{prefix}-{n}{mimetypes.guess_extension(mime_type or '') or '.bin'}"
    if not size:
        return f"({filename}: empty or not base64; left out)"
    if size > MAX_ATTACHMENT_BYTES:
        return f"({filename}: {size:,} bytes, larger than the {MAX_ATTACHMENT_BYTES // (1024 * 1024)} MB limit; left out)"
    out.attachments.append({"filename": filename, "mime_type": mime_type or "application/octet-stream", "data": data})
    return ""


def _resource_text(block: dict[str, Any], out: RenderedPrompt, prefix: str) -> str:
    resource = block.get("resource") or {}
    uri = str(resource.get("uri", ""))
    if "text" in resource:
        return f"{uri}:\n\n```\n{resource['text']}\n```" if uri else f"```\n{resource['text']}\n```"
    name = uri.rstrip("/").rsplit("/", 1)[-1] if uri else ""
    return _attachment(out, prefix, str(resource.get("blob", "")), str(resource.get("mimeType", "")), name)


def _block_text(block: dict[str, Any], out: RenderedPrompt, prefix: str) -> str:
    kind = block.get("type")
    if kind == "text":
        return str(block.get("text", ""))
    if kind in ("image", "audio"):
        return _attachment(out, prefix, str(block.get("data", "")), str(block.get("mimeType", "")))
    if kind == "resource":
        return _resource_text(block, out, prefix)
    if kind == "resource_link":
        label = block.get("title") or block.get("name") or block.get("uri")
        return f"[{label}]({block.get('uri', '')})"
    return ""


def prompt_messages_render(messages: list[dict[str, Any]], *, prefix: str = "prompt") -> RenderedPrompt:
    """The text and files of ``messages`` (``PromptMessage`` s as JSON: ``{role, content}``),
    in order (see the module docstring); ``prefix`` names unnamed files (``<prefix>-1.png``)."""
    out = RenderedPrompt()
    labelled = any(m.get("role", "user") != "user" for m in messages)
    parts = []
    for message in messages:
        content = message.get("content")
        blocks = content if isinstance(content, list) else [content] if isinstance(content, dict) else []
        text = "\n\n".join(t for t in (_block_text(b, out, prefix) for b in blocks if isinstance(b, dict)) if t)
        if not text:
            continue
        role = str(message.get("role", "user"))
        parts.append(f"{role.capitalize()}: {text}" if labelled else text)
    out.text = "\n\n".join(parts)[:MAX_TEXT_CHARS]
    return out
