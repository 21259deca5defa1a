"""Canonical message, tool-call and stream-event types.

Inside the platform every conversation is held in the OpenAI chat shape, as plain dataclasses;
provider adapters (``llm/providers/<name>.py``) translate to and from their wire format. A
fallback can therefore cross providers in the middle of a run: the history is never in a
provider's own format.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

Role = Literal["system", "user", "assistant", "tool"]


@dataclass(frozen=True, slots=True)
class ToolCallRequest:
    """One tool call the model asked for."""

    id: str
    """Provider-issued id (``call_…``) or one we minted for text-parsed calls."""
    name: str
    """The exposed tool name, as the model wrote it."""
    arguments: str
    """The arguments as the JSON text the model wrote (may be invalid JSON: parse at execution)."""

    def parsed_arguments(self) -> dict[str, Any]:
        """Arguments as a dict.

        Raises:
            ValueError: the text is not a JSON object.
        """
        if not self.arguments.strip():
            return {}
        value = json.loads(self.arguments)
        if not isinstance(value, dict):
            raise ValueError(f"tool arguments must be a JSON object, got {type(value).__name__}")
        return value


IMAGE_MIME_TYPES: frozenset[str] = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp"})
"""Image types both APIs take as input (OpenAI vision and the Anthropic Messages API list the
same four: PNG, JPEG, GIF, WebP)."""


@dataclass(frozen=True, slots=True)
class ImagePart:
    """An image given to the model with a user message, as both APIs take it inline.

    Raises:
        ValueError: (on construction) a ``mime_type`` outside :data:`IMAGE_MIME_TYPES` or
            empty ``data``.
    """

    mime_type: str
    """One of :data:`IMAGE_MIME_TYPES`."""
    data: str = field(repr=False)
    """The image's bytes, standard base64 (no ``data:`` prefix, no line breaks)."""

    def __post_init__(self) -> None:
        if self.mime_type not in IMAGE_MIME_TYPES:
            raise ValueError(f"mime_type must be one of {sorted(IMAGE_MIME_TYPES)}, got {self.mime_type!r}")
        if not self.data:
            raise ValueError("an image part needs data")

    def data_url(self) -> str:
        """``data:<mime_type>;base64,<data>`` (RFC 2397), the form OpenAI's ``image_url`` takes."""
        return f"data:{self.mime_type};base64,{self.data}"


@dataclass(frozen=True, slots=True)
class ChatMessage:
    """One message of the canonical (OpenAI chat) history."""

    role: Role
    content: str = ""
    tool_calls: tuple[ToolCallRequest, ...] = ()
    """Only on assistant messages."""
    tool_call_id: str | None = None
    """Only on tool messages: the id of the call this result answers."""
    name: str | None = None
    """Only on tool messages: the tool's exposed name."""
    images: tuple[ImagePart, ...] = ()
    """Only on user messages: images for route entries that take them (``supports_images``).
    ``content`` stays the whole text (with its ``[image: artifact:N …]`` reference lines), so an
    entry without image input gets the text alone; the adapters add these parts beside it."""

    def to_openai(self, *, with_images: bool = True) -> dict[str, Any]:
        """The OpenAI chat-completions wire dict for this message.

        Args:
            with_images: Render :attr:`images` (when there are any) as content parts: the
                content becomes ``[{"type": "text", "text": content}, {"type": "image_url",
                "image_url": {"url": "data:…;base64,…"}}, …]``. False: the text alone.
        """
        if with_images and self.images:
            parts: list[dict[str, Any]] = [{"type": "text", "text": self.content}] if self.content else []
            parts.extend({"type": "image_url", "image_url": {"url": image.data_url()}} for image in self.images)
            return {"role": self.role, "content": parts}
        out: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            out["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for c in self.tool_calls
            ]
            # "" rather than None: llama.cpp's server (and others) answer 500 to a null content.
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        return out


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """A tool as offered to the model: name, description and JSON Schema of its arguments."""

    name: str
    """Exposed name: ``^[a-zA-Z0-9_-]{1,64}$`` (the OpenAI function-name rule)."""
    description: str
    parameters: dict[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}})

    def to_openai(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }


@dataclass(frozen=True, slots=True)
class Usage:
    """Token usage of one model call."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    estimated: bool = False
    """True when the provider reported no usage and we counted with ``llm.tokens``."""


# --- Stream events yielded by the router to the runner -------------------------------------


@dataclass(frozen=True, slots=True)
class TextDelta:
    """A fragment of the answer text."""

    text: str
    type: Literal["text_delta"] = "text_delta"


@dataclass(frozen=True, slots=True)
class ReasoningDelta:
    """A fragment of reasoning output (``reasoning_content``); recorded, never fed back as text."""

    text: str
    type: Literal["reasoning_delta"] = "reasoning_delta"


@dataclass(frozen=True, slots=True)
class Completion:
    """The end of one model call: the whole assistant message and its usage."""

    message: ChatMessage
    usage: Usage
    finish_reason: str | None
    entry_index: int
    """Which route entry answered (0-based, in route order)."""
    model: str
    type: Literal["completion"] = "completion"


StreamEvent = TextDelta | ReasoningDelta | Completion
