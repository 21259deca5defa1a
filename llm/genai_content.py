"""A model call's bodies as the OpenTelemetry GenAI conventions' message content: the values of
``gen_ai.input.messages`` and ``gen_ai.output.messages`` on its ``chat`` span.

The shapes are the conventions' JSON schemas (semantic-conventions ``docs/gen-ai/
gen-ai-input-messages.json`` and ``gen-ai-output-messages.json``): a list of ``{"role",
"parts"}`` (output messages also ``"finish_reason"``), each part ``{"type": "text",
"content"}``, ``{"type": "tool_call", "id", "name", "arguments"}``, ``{"type":
"tool_call_response", "id", "response"}``, or a generic ``{"type": <kind>}`` (``"image"``:
an image's data is never put on a span; ``"reasoning"``: the model's thinking, with
``content``).

Read from the bodies the adapters capture (:class:`llm.records.BodyCapture`) in either wire
format: OpenAI chat completions (``messages`` with ``content`` text or parts, ``tool_calls``,
``tool_call_id``; a ``chat.completion`` answer) and the Anthropic Messages API (``system``,
``messages`` of content blocks; a ``message`` answer). Every text is cut at ``max_chars``.
Pure: no Django, no I/O.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

FINISH_REASONS = {"tool_calls": "tool_call", "tool_use": "tool_call", "end_turn": "stop", "stop_sequence": "stop",
                  "max_tokens": "length", "refusal": "content_filter"}
"""Wire finish/stop reasons → the conventions' (``stop``, ``length``, ``content_filter``,
``tool_call``, ``error``); others are kept as they are."""


def _cut(text: str, max_chars: int) -> str:
    return text if len(text) <= max_chars else text[:max_chars] + "…"


def _arguments(value: Any) -> Any:
    """Tool arguments as a JSON value: text that parses, else the text itself."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def _block_part(block: Any, max_chars: int) -> dict[str, Any] | None:
    """One content block (OpenAI part or Anthropic block) as a part; None for an empty one."""
    if isinstance(block, str):
        return {"type": "text", "content": _cut(block, max_chars)} if block else None
    if not isinstance(block, Mapping):
        return None
    kind = block.get("type")
    if kind == "text":
        return {"type": "text", "content": _cut(str(block.get("text") or ""), max_chars)}
    if kind in ("image_url", "image", "input_audio", "document", "file"):
        return {"type": "image" if kind.startswith("image") else kind}
    if kind == "tool_use":
        return {"type": "tool_call", "id": block.get("id"), "name": block.get("name", ""),
                "arguments": block.get("input")}
    if kind == "tool_result":
        return {"type": "tool_call_response", "id": block.get("tool_use_id"),
                "response": _cut(_text_of(block.get("content"), max_chars), max_chars)}
    if kind == "thinking":
        return {"type": "reasoning", "content": _cut(str(block.get("thinking") or ""), max_chars)}
    return {"type": str(kind or "unknown")}


def _text_of(content: Any, max_chars: int) -> str:
    """The text of a message content that may be a string or a list of blocks."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(p.get("content", "")) for p in (_block_part(b, max_chars) for b in content)
                         if p is not None and p.get("type") == "text")
    return "" if content is None else json.dumps(content, ensure_ascii=False)


def _parts(message: Mapping[str, Any], max_chars: int) -> list[dict[str, Any]]:
    """The parts of one request message (either wire format)."""
    content = message.get("content")
    if message.get("role") == "tool":  # OpenAI: a tool result is a message of its own
        return [{"type": "tool_call_response", "id": message.get("tool_call_id"),
                 "response": _cut(_text_of(content, max_chars), max_chars)}]
    blocks = content if isinstance(content, list) else [content] if content else []
    parts = [p for p in (_block_part(b, max_chars) for b in blocks) if p is not None]
    for call in message.get("tool_calls") or ():
        if not isinstance(call, Mapping):
            continue
        function = call.get("function") or {}
        parts.append({"type": "tool_call", "id": call.get("id"), "name": function.get("name", ""),
                      "arguments": _arguments(function.get("arguments"))})
    return parts


def input_messages(request: Mapping[str, Any], *, max_chars: int = 16_000) -> list[dict[str, Any]]:
    """``gen_ai.input.messages`` of a request body: its system prompt (Anthropic's ``system``)
    and messages, in order."""
    messages: list[dict[str, Any]] = []
    system = request.get("system")
    if system:
        messages.append({"role": "system", "parts": [{"type": "text", "content": _cut(_text_of(system, max_chars),
                                                                                        max_chars)}]})
    for message in request.get("messages") or ():
        if isinstance(message, Mapping):
            messages.append({"role": str(message.get("role", "")), "parts": _parts(message, max_chars)})
    return messages


def output_messages(response: Mapping[str, Any], *, max_chars: int = 16_000) -> list[dict[str, Any]]:
    """``gen_ai.output.messages`` of a response body: one message per choice (OpenAI) or the
    one message (Anthropic), with its finish reason."""
    if response.get("type") == "message":  # Anthropic
        reason = str(response.get("stop_reason") or "stop")
        blocks = response.get("content") or []
        parts = [p for p in (_block_part(b, max_chars) for b in blocks) if p is not None]
        return [{"role": "assistant", "parts": parts, "finish_reason": FINISH_REASONS.get(reason, reason)}]
    out = []
    for choice in response.get("choices") or ():
        message = choice.get("message") or {}
        parts = _parts(message, max_chars)
        reasoning = message.get("reasoning_content")
        if reasoning:
            parts.insert(0, {"type": "reasoning", "content": _cut(str(reasoning), max_chars)})
        reason = str(choice.get("finish_reason") or "stop")
        out.append({"role": "assistant", "parts": parts, "finish_reason": FINISH_REASONS.get(reason, reason)})
    return out


__all__ = ["FINISH_REASONS", "input_messages", "output_messages"]
