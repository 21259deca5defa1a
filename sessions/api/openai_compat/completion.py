"""A run's events as OpenAI chat-completion chunks, or as one chat completion.

The run's own events (its sub-runs' are left out) become deltas: ``content_token`` →
``content``; ``reasoning_token`` and the activity of the agent's server-side tools (started,
answered, failed; a pause for a person's approval) → ``reasoning_content``, the field
LibreChat, Open WebUI and LiteLLM render as the model's thinking; the run's end → the finish
(``stop``), or an error in OpenAI's shape for a run that failed or was cancelled.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from sessions.api.openai_compat.errors import OpenAIError

RUN_END_TYPES = frozenset({"run_completed", "run_failed", "run_cancelled"})
"""The events that end a run (:func:`frame_delta` turns them into a :class:`RunEnd`)."""


@dataclass(frozen=True, slots=True)
class RunEnd:
    """The run ended: ``status`` ``completed`` (``reply``), ``failed`` (``reason``, ``error``) or
    ``cancelled`` (``reason``)."""

    status: str
    reply: str = ""
    reason: str = ""
    error: str = ""

    def failure(self) -> OpenAIError | None:
        """The error to answer for a run that did not complete (None: it completed).

        ``budget_exceeded`` is a 429 (as OpenAI's ``insufficient_quota``); a cancelled run a 409;
        any other failure (the model route failed, the loop limit, a timeout) a 502
        ``server_error`` whose ``code`` is the run's failure reason.
        """
        if self.status == "completed":
            return None
        if self.status == "cancelled":
            return OpenAIError(409, "The run was cancelled.", code="run_cancelled")
        if self.reason == "budget_exceeded":
            return OpenAIError(429, self.error or "The agent's budget is spent.", type="insufficient_quota",
                               code="budget_exceeded")
        return OpenAIError(502, self.error or "The run failed.", type="server_error", code=self.reason or "run_failed")


def frame_delta(frame: dict[str, Any], *, run_id: int) -> dict[str, str] | RunEnd | None:
    """What one event frame (``{type, run_id, data, ...}``) of the session gives: a delta
    (``{"content": ...}`` or ``{"reasoning_content": ...}``), the run's end, or None (another
    run's event, or one a client of this API does not see)."""
    if frame.get("run_id") != run_id:
        return None
    kind, data = frame.get("type"), frame.get("data") or {}
    if kind == "content_token":
        return {"content": data["text"]}
    if kind == "reasoning_token":
        return {"reasoning_content": data["text"]}
    if kind in RUN_END_TYPES:
        return RunEnd(status=kind.removeprefix("run_"), reply=data.get("reply", ""), reason=data.get("reason", ""),
                      error=data.get("error", ""))
    note = _activity_note(kind, data)
    return {"reasoning_content": note} if note else None


def _activity_note(kind: str | None, data: dict[str, Any]) -> str:
    """One line on a server-side tool call or a pause, as the thinking a client renders."""
    if kind == "tool_call_started":
        return f"Calling `{data['name']}`…\n"
    if kind == "tool_call_succeeded":
        return f"`{data['name']}` answered ({data['duration_ms']} ms).\n"
    if kind == "tool_call_failed":
        return f"`{data['name']}` failed: {data['error']}\n"
    if kind == "run_awaiting_approval":
        names = ", ".join(f"`{a['tool_name']}`" for a in data.get("approvals", []) if a.get("tool_name"))
        return f"Waiting for a person's decision in the chat app{f' on {names}' if names else ''}.\n"
    return ""


@dataclass(slots=True)
class Completion:
    """The chat completion being answered (ids and the text gathered for a non-streamed answer)."""

    run_id: int
    model: str
    chat_id: int
    created: int = field(default_factory=lambda: int(time.time()))
    content: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)

    @property
    def id(self) -> str:
        return f"chatcmpl-{self.run_id}"

    def chunk(self, delta: dict[str, str], *, finish_reason: str | None = None) -> dict[str, Any]:
        """A ``chat.completion.chunk`` with one choice."""
        return {"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
                "chat_id": self.chat_id, "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}]}

    def usage_chunk(self, usage: dict[str, int]) -> dict[str, Any]:
        """The chunk ``stream_options.include_usage`` asks for: no choices, the run's usage."""
        return {"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
                "chat_id": self.chat_id, "choices": [], "usage": usage}

    def gather(self, delta: dict[str, str]) -> None:
        """Keep a delta for the non-streamed answer."""
        (self.content if "content" in delta else self.reasoning).append(next(iter(delta.values())))

    def whole(self, end: RunEnd, usage: dict[str, int]) -> dict[str, Any]:
        """The non-streamed ``chat.completion``: the run's reply (its final answer), the thinking
        and tool activity as ``reasoning_content``."""
        message: dict[str, Any] = {"role": "assistant", "content": end.reply or "".join(self.content)}
        if self.reasoning:
            message["reasoning_content"] = "".join(self.reasoning)
        return {"id": self.id, "object": "chat.completion", "created": self.created, "model": self.model,
                "chat_id": self.chat_id,
                "choices": [{"index": 0, "message": message, "finish_reason": "stop", "logprobs": None}],
                "usage": usage}


def usage_of(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    """OpenAI's ``usage`` object from a run's token counts (every model call of the run)."""
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}
