"""Cheap token estimates, used only when a provider reports no usage.

The estimate is *not* a tokenizer: it counts characters and divides by four (the usual
English-text ratio for BPE tokenizers), plus a few tokens of per-message and per-tool
framing. Expect ±30 % on prose, worse on code, CJK text or long numbers. Records built from
it carry ``Usage.estimated = True``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from typing import Final

from llm.types import ChatMessage, ToolSpec, Usage

CHARS_PER_TOKEN: Final[float] = 4.0
"""Average characters per token assumed by every estimate here."""

MESSAGE_OVERHEAD_TOKENS: Final[int] = 4
"""Framing per message (role markers, separators) in chat templates."""

TOOL_OVERHEAD_TOKENS: Final[int] = 8
"""Framing per offered tool."""

REPLY_PRIMING_TOKENS: Final[int] = 3
"""Tokens that open the assistant's reply in most chat templates."""

IMAGE_TOKENS: Final[int] = 1600
"""Assumed per image part: Anthropic's vision docs put an image at ``width × height / 750``
tokens, about 1,600 for the largest image it takes without downscaling (~1.15 megapixels);
OpenAI's high-detail tiling costs at most ~1,105 for the sizes it keeps. The larger of the two,
so a route entry is never chosen for a prompt its images do not fit."""


def estimate_text_tokens(text: str) -> int:
    """Estimated tokens of a bare string: ``ceil(len(text) / 4)``; 0 for ``""``."""
    return math.ceil(len(text) / CHARS_PER_TOKEN) if text else 0


def estimate_message_tokens(message: ChatMessage) -> int:
    """Estimated tokens of one message, framing included.

    Counts the content, the tool calls' names and argument text, the tool name / call id
    of tool results, and :data:`IMAGE_TOKENS` per image part.
    """
    chars = len(message.content)
    for call in message.tool_calls:
        chars += len(call.name) + len(call.arguments) + len(call.id)
    if message.name:
        chars += len(message.name)
    if message.tool_call_id:
        chars += len(message.tool_call_id)
    return MESSAGE_OVERHEAD_TOKENS + math.ceil(chars / CHARS_PER_TOKEN) + IMAGE_TOKENS * len(message.images)


def estimate_tool_tokens(tool: ToolSpec) -> int:
    """Estimated tokens of one tool definition as offered to the model (name, description, schema)."""
    schema = json.dumps(tool.parameters, separators=(",", ":"), ensure_ascii=False, default=str)
    chars = len(tool.name) + len(tool.description) + len(schema)
    return TOOL_OVERHEAD_TOKENS + math.ceil(chars / CHARS_PER_TOKEN)


def estimate_tokens(messages: Iterable[ChatMessage], tools: Iterable[ToolSpec] = ()) -> int:
    """Estimated prompt tokens of a request (chars/4 plus framing; see the module docstring).

    Args:
        messages: The canonical history as sent.
        tools: The tools offered with it (their JSON schemas count too).

    Returns:
        A non-negative token count; ``REPLY_PRIMING_TOKENS`` for an empty request.
    """
    total = REPLY_PRIMING_TOKENS
    total += sum(estimate_message_tokens(m) for m in messages)
    total += sum(estimate_tool_tokens(t) for t in tools)
    return total


def estimate_completion_tokens(message: ChatMessage, *, reasoning: str = "") -> int:
    """Estimated completion tokens of a generated assistant message (no framing).

    Args:
        message: The assistant message (content and tool calls).
        reasoning: Reasoning text the model produced alongside it, if any.
    """
    chars = len(message.content) + len(reasoning)
    for call in message.tool_calls:
        chars += len(call.name) + len(call.arguments)
    return math.ceil(chars / CHARS_PER_TOKEN)


__all__ = [
    "CHARS_PER_TOKEN",
    "IMAGE_TOKENS",
    "estimate_completion_tokens",
    "estimate_message_tokens",
    "estimate_text_tokens",
    "estimate_tokens",
    "estimate_tool_tokens",
]


def usage_or_estimate(
    *,
    prompt_tokens: int | None,
    completion_tokens: int | None,
    messages: Sequence[ChatMessage],
    tools: Sequence[ToolSpec],
    message: ChatMessage,
    reasoning: str = "",
) -> Usage:
    """Usage from what the provider reported; what it did not report is estimated.

    Args:
        prompt_tokens, completion_tokens: The provider's counts, None where absent.
        messages, tools: What was sent (to estimate the prompt).
        message, reasoning: What came back (to estimate the completion).

    Returns:
        ``Usage``; ``estimated=True`` as soon as either count is an estimate.
    """
    if prompt_tokens is not None and completion_tokens is not None:
        return Usage(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens)
    return Usage(
        prompt_tokens=prompt_tokens if prompt_tokens is not None else estimate_tokens(messages, tools),
        completion_tokens=(
            completion_tokens if completion_tokens is not None
            else estimate_completion_tokens(message, reasoning=reasoning)
        ),
        estimated=True,
    )
