"""A run's events as OpenAI chat-completion chunks, or as one chat completion.

The run's own events (its sub-runs' are left out) become deltas: ``content_token`` →
``content``; ``reasoning_token`` and the activity of the agent's server-side tools (started,
answered, failed; a pause for a person's approval) → ``reasoning_content``, the field
LibreChat, Open WebUI and LiteLLM render as the model's thinking; the run's end → the finish
(``stop``), or an error in OpenAI's shape for a run that failed or was cancelled; its pause on
calls of the client's tools → ``tool_calls`` and the finish ``tool_calls``. A pause for a
person's decision ends a non-streamed answer (``status: "awaiting_approval"``, where to decide);
a stream stays open through it (keep-alives) and goes on once decided.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from sessions.api.agent_runs import person_decision_note
from sessions.api.openai_compat.client_tools import call_id
from sessions.api.openai_compat.errors import OpenAIError
from sessions.api.openai_compat.formats import VALIDATION_FAILED_CODE

RUN_END_TYPES = frozenset({"run_completed", "run_failed", "run_cancelled"})
"""The events that end a run (:func:`frame_delta` turns them into a :class:`RunEnd`)."""


@dataclass(frozen=True, slots=True)
class RunEnd:
    """The run ended: ``status`` ``completed`` (``reply``), ``failed`` (``reason``, ``error``) or
    ``cancelled`` (``reason``); or it paused on calls of the client's tools: ``tool_calls``
    (``tool_calls``: OpenAI's ``[{id, type: function, function: {name, arguments}}]``); or, for
    a non-streamed answer, it paused for a person's decision: ``awaiting_approval``
    (``approvals``: the event's ``[{tool_name?, ...}]``)."""

    status: str
    reply: str = ""
    reason: str = ""
    error: str = ""
    tool_calls: tuple[dict[str, Any], ...] = ()
    approvals: tuple[dict[str, Any], ...] = ()

    @property
    def finish_reason(self) -> str:
        """``tool_calls`` for a pause on the client's tools, else ``stop``."""
        return "tool_calls" if self.status == "tool_calls" else "stop"

    def failure(self) -> OpenAIError | None:
        """The error to answer for a run that did not complete (None: it completed).

        ``budget_exceeded`` is a 429 (as OpenAI's ``insufficient_quota``); a cancelled run a 409;
        any other failure (the model route failed, the loop limit, a timeout) a 502
        ``server_error`` whose ``code`` is the run's failure reason.
        """
        if self.status in ("completed", "tool_calls", "awaiting_approval"):
            return None
        if self.status == "cancelled":
            return OpenAIError(409, "The run was cancelled.", code="run_cancelled")
        if self.reason == "output_invalid":
            return OpenAIError(502, self.error or "The answer did not match the requested format.", type="server_error",
                               code=VALIDATION_FAILED_CODE)
        if self.reason == "budget_exceeded":
            return OpenAIError(429, self.error or "The agent's budget is spent.", type="insufficient_quota",
                               code="budget_exceeded")
        return OpenAIError(502, self.error or "The run failed.", type="server_error", code=self.reason or "run_failed")


def client_calls(frame: dict[str, Any]) -> list[dict[str, Any]]:
    """The calls of the client's tools a ``run_awaiting_approval`` frame announces (its
    approvals of kind ``client_tool``): ``[{tool_call_id, tool_name, arguments}]`` in the order
    the model wrote them (by tool call id: the calls of a turn may wait in any order); [] for any
    other frame."""
    if frame.get("type") != "run_awaiting_approval":
        return []
    calls = [a for a in (frame.get("data") or {}).get("approvals", []) if a.get("kind") == "client_tool"]
    return sorted(calls, key=lambda a: a["tool_call_id"])


def person_pause(frame: dict[str, Any]) -> bool:
    """Whether ``frame`` is a pause for a person's decision (a ``run_awaiting_approval`` with no
    call of the client's tools)."""
    return frame.get("type") == "run_awaiting_approval" and not client_calls(frame)


def ends_answer(frame: dict[str, Any], run_id: int, *, at_person_pause: bool = False) -> bool:
    """Whether ``frame`` ends the answer of run ``run_id``: the run's end, its pause on calls of
    the client's tools, and with ``at_person_pause`` (a non-streamed answer, which would
    otherwise hold its request until someone decides) its pause for a person's decision."""
    return frame.get("run_id") == run_id and (
        frame.get("type") in RUN_END_TYPES or bool(client_calls(frame)) or (at_person_pause and person_pause(frame))
    )


def tool_call_of(call: dict[str, Any]) -> dict[str, Any]:
    """OpenAI's ``tool_calls`` entry for a paused call (``client_calls``' item)."""
    arguments = call.get("arguments")
    return {"id": call_id(call["tool_call_id"]), "type": "function",
            "function": {"name": call["tool_name"], "arguments": json.dumps(arguments if arguments is not None else {})}}


def frame_delta(frame: dict[str, Any], *, run_id: int, at_person_pause: bool = False) -> dict[str, str] | RunEnd | None:
    """What one event frame (``{type, run_id, data, ...}``) of the session gives: a delta
    (``{"content": ...}`` or ``{"reasoning_content": ...}``), the run's end or its pause on
    the client's tools (a :class:`RunEnd`), with ``at_person_pause`` its pause for a person's
    decision (a :class:`RunEnd` ``awaiting_approval``), or None (another run's event, or one a
    client of this API does not see)."""
    if frame.get("run_id") != run_id:
        return None
    calls = client_calls(frame)
    if calls:
        return RunEnd(status="tool_calls", tool_calls=tuple(tool_call_of(c) for c in calls))
    kind, data = frame.get("type"), frame.get("data") or {}
    if at_person_pause and person_pause(frame):
        return RunEnd(status="awaiting_approval", approvals=tuple(data.get("approvals", [])))
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
    structured: bool = False
    """A ``response_format`` was asked: the content is sent once checked (the run's reply), not as
    the model writes it (an answer that fails the check is repaired in a later turn)."""
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

    def tool_calls_chunk(self, end: RunEnd) -> dict[str, Any]:
        """The chunk announcing the calls of the client's tools (before the finish chunk)."""
        calls = [{"index": i, **call} for i, call in enumerate(end.tool_calls)]
        return self.chunk({"tool_calls": calls})

    def whole(self, end: RunEnd, usage: dict[str, int], *, base_url: str = "") -> dict[str, Any]:
        """The non-streamed ``chat.completion``: the run's reply (its final answer), the thinking
        and tool activity as ``reasoning_content``; for a pause on the client's tools, the text
        so far and ``tool_calls`` (``finish_reason: "tool_calls"``); for a pause for a person's
        decision, the text so far and a sentence saying where to decide (``finish_reason:
        "stop"``), with ``status: "awaiting_approval"`` and ``approval_url`` (the chat in the
        chat app under ``base_url``) beside ``chat_id``."""
        content = end.reply or "".join(self.content)
        extra: dict[str, Any] = {}
        if end.status == "awaiting_approval":
            note, extra["approval_url"] = person_decision_note(list(end.approvals), base_url=base_url,
                                                               chat_id=self.chat_id)
            content = f"{content}\n\n{note}" if content else note
            extra["status"] = "awaiting_approval"
        message: dict[str, Any] = {"role": "assistant", "content": content or (None if end.tool_calls else "")}
        if end.tool_calls:
            message["tool_calls"] = list(end.tool_calls)
        if self.reasoning:
            message["reasoning_content"] = "".join(self.reasoning)
        return {"id": self.id, "object": "chat.completion", "created": self.created, "model": self.model,
                "chat_id": self.chat_id, **extra,
                "choices": [{"index": 0, "message": message, "finish_reason": end.finish_reason, "logprobs": None}],
                "usage": usage}


def usage_of(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    """OpenAI's ``usage`` object from a run's token counts (every model call of the run)."""
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}
