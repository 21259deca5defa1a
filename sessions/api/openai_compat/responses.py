"""The Responses API (OpenAI's, and the Open Responses specification) over runs.

A response is a run: its id is ``resp_<run id>``. :func:`response_body` builds the response
object of a run from what is stored (``GET /responses/<id>``, the answer of a non-streamed
``POST /responses``, the final event of a stream); :class:`ResponseStream` turns the run's
events into the streaming events (``response.created``, ``response.output_item.added``,
``response.output_text.delta``, ``response.function_call_arguments.done``,
``response.completed``, ...), numbered by ``sequence_number``.

Output items, in the order the run made them: the assistant's text of each turn (a
``message`` item ``msg_<run>_<n>``), and for each server-side tool call a ``function_call``
item (``fc_<tool call id>``) followed by its ``function_call_output`` (``fco_<tool call id>``).

Status: ``queued`` and ``running`` → ``queued`` / ``in_progress``; ``completed``;
``failed`` (``error.code``: the run's failure reason); ``cancelled``; a run waiting for a
person's decision → ``incomplete`` with ``incomplete_details.reason`` ``approval_required``
(the run stays paused; decide it in the chat app, then ``GET`` the response again).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from sessions.models import Message, MessageRole, Run, RunStatus, ToolCall, ToolCallStatus

STATUS = {RunStatus.QUEUED: "queued", RunStatus.RUNNING: "in_progress", RunStatus.COMPLETED: "completed",
          RunStatus.FAILED: "failed", RunStatus.CANCELLED: "cancelled", RunStatus.AWAITING_APPROVAL: "incomplete"}
"""A run's status as a response's."""

ENDED = frozenset({"completed", "failed", "cancelled", "incomplete"})
"""Response statuses after which a stream ends."""


def response_id(run_id: int) -> str:
    return f"resp_{run_id}"


def run_id_of(response_id_: str) -> int | None:
    """The run id in ``resp_<id>``, or None when it is not one of ours."""
    raw = response_id_.removeprefix("resp_")
    return int(raw) if response_id_.startswith("resp_") and raw.isdigit() and len(raw) <= 18 else None


def message_item(item_id: str, text: str, *, status: str = "completed") -> dict[str, Any]:
    return {"type": "message", "id": item_id, "status": status, "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]}


def call_item(tool_call_id: int, *, name: str, arguments: str, status: str = "completed") -> dict[str, Any]:
    """A server-side tool call as a ``function_call`` item (``call_id``: ``call_<tool call id>``,
    the same whether streamed or read back)."""
    return {"type": "function_call", "id": f"fc_{tool_call_id}", "call_id": f"call_{tool_call_id}", "name": name,
            "arguments": arguments, "status": status}


def output_item(tool_call_id: int, *, output: str) -> dict[str, Any]:
    """A server-side tool call's result (or ``Error: <reason>``) as a ``function_call_output`` item."""
    return {"type": "function_call_output", "id": f"fco_{tool_call_id}", "call_id": f"call_{tool_call_id}",
            "output": output, "status": "completed"}


def arguments_text(raw: str) -> str:
    """A call's arguments as JSON text: re-encoded when they parse as an object (so a stored
    call and its streamed event say the same), else as the model wrote them."""
    try:
        parsed = json.loads(raw)
    except ValueError:
        return raw
    return json.dumps(parsed) if isinstance(parsed, dict) else raw


def _call_output(call: ToolCall) -> str:
    if call.status == ToolCallStatus.SUCCEEDED:
        return call.result
    return f"Error: {call.error}" if call.error else ""


def stored_output(run: Run) -> list[dict[str, Any]]:
    """The run's output items from its messages and tool calls (see the module docstring)."""
    calls = {c.call_id: c for c in ToolCall.objects.filter(run=run)}
    items: list[dict[str, Any]] = []
    texts = 0
    # A conversation given whole is stored before the run's own message: the output starts after it.
    inputs = Message.objects.filter(run=run, role=MessageRole.USER, content=run.input).order_by("-position")
    start = inputs.values_list("position", flat=True).first() or 0
    answers = Message.objects.filter(run=run, role=MessageRole.ASSISTANT, position__gt=start).order_by("position")
    for message in answers:
        if message.content:
            items.append(message_item(f"msg_{run.pk}_{texts}", message.content))
            texts += 1
        for requested in message.tool_calls:
            call = calls.get(requested["id"])
            if call is None:
                continue
            items.append(call_item(call.pk, name=call.name, arguments=arguments_text(call.arguments_raw)))
            if call.status not in (ToolCallStatus.PENDING, ToolCallStatus.AWAITING_APPROVAL, ToolCallStatus.RUNNING):
                items.append(output_item(call.pk, output=_call_output(call)))
    if run.status == RunStatus.COMPLETED and run.reply and not any(
        i["type"] == "message" and i["content"][0]["text"] == run.reply for i in items[-1:]
    ):
        items.append(message_item(f"msg_{run.pk}_{texts}", run.reply))
    return items


def response_body(run: Run, *, model: str, previous_response_id: str | None = None) -> dict[str, Any]:
    """The response object of ``run`` (requires the run's tenant scope)."""
    status = STATUS[run.status]
    error = None
    if run.status == RunStatus.FAILED:
        error = {"code": run.reason or "run_failed", "message": run.error or "The run failed."}
    usage = {"input_tokens": run.prompt_tokens, "output_tokens": run.completion_tokens,
             "total_tokens": run.prompt_tokens + run.completion_tokens,
             "input_tokens_details": {"cached_tokens": 0}, "output_tokens_details": {"reasoning_tokens": 0}}
    return {
        "id": response_id(run.pk), "object": "response", "created_at": int(run.created_at.timestamp()),
        "completed_at": int(run.finished_at.timestamp()) if run.finished_at else None, "status": status,
        "incomplete_details": {"reason": "approval_required"} if status == "incomplete" else None,
        "model": model, "previous_response_id": previous_response_id, "instructions": None,
        "output": stored_output(run), "error": error, "tools": [], "tool_choice": "auto", "truncation": "disabled",
        "parallel_tool_calls": True, "text": {"format": {"type": "text"}}, "top_p": 1.0, "presence_penalty": 0.0,
        "frequency_penalty": 0.0, "top_logprobs": 0, "temperature": 1.0, "reasoning": None,
        "usage": usage if status in ENDED else None, "max_output_tokens": None, "max_tool_calls": None,
        "store": True, "background": False, "service_tier": "default", "metadata": {}, "safety_identifier": None,
        "prompt_cache_key": None,
    }


@dataclass(slots=True)
class ResponseStream:
    """The streaming events of one response, made from its run's event frames.

    :meth:`frame_events` is fed every frame of the session (other runs' are skipped) and
    returns the events to send; :meth:`ends` tells whether a frame ends the response (the
    caller then sends :meth:`final` with the stored response).
    """

    run_id: int
    sequence: int = 0
    output_index: int = 0
    texts: int = 0
    open_text: list[str] | None = None
    """The text of the message item being streamed (None: none is open)."""

    def event(self, type_: str, **fields: Any) -> dict[str, Any]:
        """One event with the next ``sequence_number``."""
        self.sequence += 1
        return {"type": type_, "sequence_number": self.sequence, **fields}

    def opening(self, response: dict[str, Any]) -> list[dict[str, Any]]:
        """``response.created`` and ``response.in_progress`` (the response as it starts)."""
        started = {**response, "status": "in_progress"}
        return [self.event("response.created", response=response), self.event("response.in_progress", response=started)]

    def frame_events(self, frame: dict[str, Any]) -> list[dict[str, Any]]:
        """The events one frame of the session gives (none for another run's frame)."""
        if frame.get("run_id") != self.run_id:
            return []
        kind, data = frame.get("type"), frame.get("data") or {}
        if kind == "content_token":
            return self._text(data["text"])
        if kind == "tool_call_started":
            return self._close_text() + self._call_started(data)
        if kind in ("tool_call_succeeded", "tool_call_failed"):
            return self._close_text() + self._call_finished(kind, data)
        if kind in ("run_completed", "run_failed", "run_cancelled", "run_awaiting_approval"):
            return self._close_text()
        return []

    @staticmethod
    def ends(frame: dict[str, Any], run_id: int) -> bool:
        return frame.get("run_id") == run_id and frame.get("type") in (
            "run_completed", "run_failed", "run_cancelled", "run_awaiting_approval")

    def final(self, response: dict[str, Any]) -> dict[str, Any]:
        """The last event: ``response.completed``, ``.failed`` or ``.incomplete`` (also for a
        cancelled run, whose status says ``cancelled``)."""
        kind = {"completed": "response.completed", "failed": "response.failed"}.get(response["status"],
                                                                                   "response.incomplete")
        return self.event(kind, response=response)

    def _text(self, text: str) -> list[dict[str, Any]]:
        events = []
        item_id = f"msg_{self.run_id}_{self.texts}"
        if self.open_text is None:
            self.open_text = []
            events.append(self.event("response.output_item.added", output_index=self.output_index,
                                     item={**message_item(item_id, "", status="in_progress"), "content": []}))
            events.append(self.event("response.content_part.added", item_id=item_id, output_index=self.output_index,
                                     content_index=0, part={"type": "output_text", "text": "", "annotations": [],
                                                            "logprobs": []}))
        self.open_text.append(text)
        events.append(self.event("response.output_text.delta", item_id=item_id, output_index=self.output_index,
                                 content_index=0, delta=text, logprobs=[]))
        return events

    def _close_text(self) -> list[dict[str, Any]]:
        if self.open_text is None:
            return []
        text, item_id = "".join(self.open_text), f"msg_{self.run_id}_{self.texts}"
        part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
        events = [
            self.event("response.output_text.done", item_id=item_id, output_index=self.output_index, content_index=0,
                       text=text, logprobs=[]),
            self.event("response.content_part.done", item_id=item_id, output_index=self.output_index,
                       content_index=0, part=part),
            self.event("response.output_item.done", output_index=self.output_index, item=message_item(item_id, text)),
        ]
        self.open_text, self.texts, self.output_index = None, self.texts + 1, self.output_index + 1
        return events

    def _call_started(self, data: dict[str, Any]) -> list[dict[str, Any]]:
        pk = data["tool_call_id"]
        arguments = data["arguments"] if isinstance(data["arguments"], str) else json.dumps(data["arguments"])
        item = call_item(pk, name=data["name"], arguments=arguments, status="in_progress")
        index = self.output_index
        self.output_index += 1
        return [
            self.event("response.output_item.added", output_index=index, item={**item, "arguments": ""}),
            self.event("response.function_call_arguments.delta", item_id=item["id"], output_index=index,
                       delta=arguments),
            self.event("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                       name=item["name"], arguments=arguments),
            self.event("response.output_item.done", output_index=index, item={**item, "status": "completed"}),
        ]

    def _call_finished(self, kind: str, data: dict[str, Any]) -> list[dict[str, Any]]:
        pk = data["tool_call_id"]
        text = data["result"] if kind == "tool_call_succeeded" else f"Error: {data['error']}"
        item = output_item(pk, output=text)
        index = self.output_index
        self.output_index += 1
        return [self.event("response.output_item.added", output_index=index, item={**item, "status": "in_progress"}),
                self.event("response.output_item.done", output_index=index, item=item)]
