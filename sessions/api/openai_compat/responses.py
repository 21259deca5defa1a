"""The Responses API (OpenAI's, and the Open Responses specification) over runs.

A response is a run, or one segment of it: its id is ``resp_<run id>``. A run that called
the client's own tools (``tools`` of the request, :mod:`.client_tools`) is split after each
such turn: the response ends there (``completed``, with the calls as ``function_call`` items)
and the request bringing their outputs continues the same run as the next response,
``resp_<run id>_<k>`` (segment ``k``, 1-based). :func:`response_body` builds the response
object of a run (segment) from what is stored (``GET /responses/<id>``, the answer of a
non-streamed ``POST /responses``, the final event of a stream); :class:`ResponseStream` turns
the run's events into the streaming events (``response.created``,
``response.output_item.added``, ``response.output_text.delta``,
``response.function_call_arguments.done``, ``response.completed``, ...), numbered by
``sequence_number``.

Output items, in the order the run made them: the assistant's text of each turn (a
``message`` item ``msg_<run>_<n>``, ``msg_<run>_<k>_<n>`` in segment ``k``), for each
server-side tool call a ``function_call`` item (``fc_<tool call id>``) followed by its
``function_call_output`` (``fco_<tool call id>``), and for each call of the client's tools a
``function_call`` item alone (``call_id`` ``call_<tool call id>``: the client answers it).

Status: ``queued`` and ``running`` → ``queued`` / ``in_progress``; ``completed`` (also a
segment that ended with calls of the client's tools); ``failed`` (``error.code``: the run's
failure reason); ``cancelled``; a run waiting for a person's decision → ``incomplete`` with
``incomplete_details.reason`` ``approval_required`` (the run stays paused; decide it in the
chat app, then ``GET`` the response again). ``usage`` is the whole run's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from sessions.api.openai_compat.completion import client_calls
from sessions.api.openai_compat.formats import VALIDATION_FAILED_CODE, format_echo
from sessions.models import (
    Approval,
    ApprovalKind,
    ApprovalStatus,
    Message,
    MessageRole,
    Run,
    RunFailureReason,
    RunStatus,
    ToolCall,
    ToolCallStatus,
)

STATUS = {RunStatus.QUEUED: "queued", RunStatus.RUNNING: "in_progress", RunStatus.COMPLETED: "completed",
          RunStatus.FAILED: "failed", RunStatus.CANCELLED: "cancelled", RunStatus.AWAITING_APPROVAL: "incomplete"}
"""A run's status as a response's."""

ENDED = frozenset({"completed", "failed", "cancelled", "incomplete"})
"""Response statuses after which a stream ends."""


def response_id(run_id: int, segment: int = 0) -> str:
    """``resp_<run id>``, or ``resp_<run id>_<segment>`` for a later segment."""
    return f"resp_{run_id}" if segment == 0 else f"resp_{run_id}_{segment}"


def response_ref_of(response_id_: str) -> tuple[int, int] | None:
    """``(run id, segment)`` of ``resp_<id>`` / ``resp_<id>_<k>``, or None when it is not one of ours."""
    if not isinstance(response_id_, str) or not response_id_.startswith("resp_"):
        return None
    run, _, segment = response_id_.removeprefix("resp_").partition("_")
    if not (run.isdigit() and len(run) <= 18) or (segment and not (segment.isdigit() and len(segment) <= 6)):
        return None
    if segment and int(segment) == 0:
        return None
    return int(run), int(segment or 0)


def run_id_of(response_id_: str) -> int | None:
    """The run id in ``resp_<id>`` (or ``resp_<id>_<k>``), or None when it is not one of ours."""
    ref = response_ref_of(response_id_)
    return None if ref is None else ref[0]


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


@dataclass(frozen=True, slots=True)
class Segments:
    """A run's answers (its assistant messages after its input), split after each one that
    called the client's tools."""

    parts: list[list[Message]]
    """The segments' messages; the last is left out while its calls still wait."""
    client_calls: set[str]
    """The model's ids (``ToolCall.call_id``) of the calls of the client's tools."""
    waiting: bool
    """Whether the last segment ended with calls of the client's tools that still wait."""

    @classmethod
    def of(cls, run: Run) -> Segments:
        approvals = list(Approval.objects.filter(run=run, kind=ApprovalKind.CLIENT_TOOL)
                         .values_list("tool_call__call_id", "status"))
        client = {call for call, _status in approvals}
        pending = {call for call, status in approvals if status == ApprovalStatus.PENDING}
        # A conversation given whole is stored before the run's own message: the output starts after it.
        inputs = Message.objects.filter(run=run, role=MessageRole.USER, content=run.input).order_by("-position")
        start = inputs.values_list("position", flat=True).first() or 0
        parts: list[list[Message]] = [[]]
        for message in Message.objects.filter(run=run, role=MessageRole.ASSISTANT, position__gt=start).order_by(
                "position"):
            parts[-1].append(message)
            if any(c["id"] in client for c in message.tool_calls):
                parts.append([])
        waiting = any(c["id"] in pending for m in parts[-2] for c in m.tool_calls) if len(parts) > 1 else False
        return cls(parts=parts[:-1] if waiting else parts, client_calls=client, waiting=waiting)

    def ends_with_calls(self, segment: int) -> bool:
        """Whether segment ``segment`` ended with calls of the client's tools."""
        return segment < len(self.parts) - 1 or self.waiting


def _message_items(run: Run, segment: int, message: Message, texts: int) -> list[dict[str, Any]]:
    if not message.content:
        return []
    item_id = f"msg_{run.pk}_{texts}" if segment == 0 else f"msg_{run.pk}_{segment}_{texts}"
    return [message_item(item_id, message.content)]


def _call_items(call: ToolCall, *, client: bool) -> list[dict[str, Any]]:
    items = [call_item(call.pk, name=call.name, arguments=arguments_text(call.arguments_raw))]
    if not client and call.status not in (ToolCallStatus.PENDING, ToolCallStatus.AWAITING_APPROVAL,
                                          ToolCallStatus.RUNNING):
        items.append(output_item(call.pk, output=_call_output(call)))
    return items


def stored_output(run: Run, segment: int = 0, segments: Segments | None = None) -> list[dict[str, Any]] | None:
    """The output items of the run's segment ``segment`` from its messages and tool calls (see
    the module docstring); None when the run has no such segment (yet). With a format asked
    (``text.format``), the text is the run's checked reply only (the answers that failed the
    check and were repaired are left out)."""
    segments = segments or Segments.of(run)
    if segment >= len(segments.parts):
        return None
    calls = {c.call_id: c for c in ToolCall.objects.filter(run=run)}
    items: list[dict[str, Any]] = []
    texts = 0
    for message in segments.parts[segment]:
        found = _message_items(run, segment, message, texts)
        texts += len(found)
        items += found
        for requested in message.tool_calls:
            if requested["id"] in calls:
                items += _call_items(calls[requested["id"]], client=requested["id"] in segments.client_calls)
    if structured(run):  # the text is the checked reply alone (numbered as the segment's first)
        items, texts = [i for i in items if i["type"] != "message"], 0
    if segment == len(segments.parts) - 1 and not segments.waiting:
        items += _reply_items(run, segment, items, texts)
    return items


def _reply_items(run: Run, segment: int, items: list[dict[str, Any]], texts: int) -> list[dict[str, Any]]:
    """The run's reply as the last message item of its last segment, when no item says it yet
    (a steered run's, a structured answer's)."""
    if run.status != RunStatus.COMPLETED or not run.reply or any(
        i["type"] == "message" and i["content"][0]["text"] == run.reply for i in items[-1:]
    ):
        return []
    return _message_items(run, segment, Message(content=run.reply), texts)


def structured(run: Run) -> bool:
    """Whether the run's caller asked for a format (JSON)."""
    return bool((run.request_options or {}).get("response_format"))


def _options_fields(run: Run) -> dict[str, Any]:
    """``instructions``, ``tools`` and ``text`` as the request that started the run gave them."""
    options = run.request_options or {}
    tools = [{"type": "function", "name": t["name"], "description": t.get("description") or None,
              "parameters": t.get("parameters"), "strict": False} for t in options.get("client_tools", [])]
    return {"instructions": options.get("instructions") or None, "tools": tools,
            "text": {"format": format_echo(options.get("response_format"))}}


def response_body(run: Run, *, model: str, previous_response_id: str | None = None,
                  segment: int = 0) -> dict[str, Any] | None:
    """The response object of ``run``'s segment ``segment`` (requires the run's tenant scope);
    None when the run has no such segment (yet)."""
    segments = Segments.of(run)
    output = stored_output(run, segment, segments)
    if output is None:
        return None
    status = "completed" if segments.ends_with_calls(segment) else STATUS[run.status]
    error = None
    if status == "failed":
        code = VALIDATION_FAILED_CODE if run.reason == RunFailureReason.OUTPUT_INVALID else run.reason
        error = {"code": code or "run_failed", "message": run.error or "The run failed."}
    usage = {"input_tokens": run.prompt_tokens, "output_tokens": run.completion_tokens,
             "total_tokens": run.prompt_tokens + run.completion_tokens,
             "input_tokens_details": {"cached_tokens": 0}, "output_tokens_details": {"reasoning_tokens": 0}}
    return _body(run, model=model, previous_response_id=previous_response_id, segment=segment, status=status,
                 output=output, error=error, usage=usage if status in ENDED else None)


def response_opening(run: Run, *, model: str, previous_response_id: str | None = None,
                     segment: int = 0) -> dict[str, Any]:
    """The response object a stream opens with (``response.created``), from the run row the
    request just wrote or resumed, with no database read: ``queued`` (or ``in_progress`` for a
    run a worker has), no output yet (the stream sends every item as it is made) and no usage.
    """
    status = "queued" if run.status == RunStatus.QUEUED else "in_progress"
    return _body(run, model=model, previous_response_id=previous_response_id, segment=segment, status=status,
                 output=[], error=None, usage=None)


def _body(run: Run, *, model: str, previous_response_id: str | None, segment: int, status: str,
          output: list[dict[str, Any]], error: dict[str, str] | None, usage: dict[str, Any] | None) -> dict[str, Any]:
    return {
        "id": response_id(run.pk, segment), "object": "response", "created_at": int(run.created_at.timestamp()),
        "completed_at": int(run.finished_at.timestamp()) if run.finished_at else None, "status": status,
        "incomplete_details": {"reason": "approval_required"} if status == "incomplete" else None,
        "model": model, "previous_response_id": previous_response_id, **_options_fields(run),
        "output": output, "error": error, "tool_choice": "auto", "truncation": "disabled",
        "parallel_tool_calls": True, "top_p": 1.0, "presence_penalty": 0.0,
        "frequency_penalty": 0.0, "top_logprobs": 0, "temperature": 1.0, "reasoning": None,
        "usage": usage, "max_output_tokens": None, "max_tool_calls": None,
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
    segment: int = 0
    """The run's segment this response is (0 for a new run; the resumed one for a request that
    brought the client's tool outputs)."""
    sequence: int = 0
    output_index: int = 0
    texts: int = 0
    open_text: list[str] | None = None
    """The text of the message item being streamed (None: none is open)."""
    structured: bool = False
    """A format was asked: the text is sent once checked, from the stored response (:meth:`final`)."""

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
            return [] if self.structured else self._text(data["text"])
        if kind == "tool_call_started":
            return self._close_text() + self._call_started(data)
        if kind in ("tool_call_succeeded", "tool_call_failed"):
            return self._close_text() + self._call_finished(kind, data)
        if kind == "run_awaiting_approval":
            return self._close_text() + [e for call in client_calls(frame) for e in self._call_started(
                {"tool_call_id": call["tool_call_id"], "name": call["tool_name"],
                 "arguments": call.get("arguments") if call.get("arguments") is not None else {}})]
        if kind in ("run_completed", "run_failed", "run_cancelled"):
            return self._close_text()
        return []

    @staticmethod
    def ends(frame: dict[str, Any], run_id: int) -> bool:
        return frame.get("run_id") == run_id and frame.get("type") in (
            "run_completed", "run_failed", "run_cancelled", "run_awaiting_approval")

    def final(self, response: dict[str, Any]) -> list[dict[str, Any]]:
        """The last events: a structured answer's checked text (its message item), then
        ``response.completed``, ``.failed`` or ``.incomplete`` (also for a cancelled run, whose
        status says ``cancelled``)."""
        events = []
        messages = [i for i in response["output"] if i["type"] == "message"]
        if self.structured and messages:
            self.output_index = response["output"].index(messages[-1])
            events += self._text(messages[-1]["content"][0]["text"]) + self._close_text()
        kind = {"completed": "response.completed", "failed": "response.failed"}.get(response["status"],
                                                                                   "response.incomplete")
        return [*events, self.event(kind, response=response)]

    def _text_id(self) -> str:
        base = f"msg_{self.run_id}" if self.segment == 0 else f"msg_{self.run_id}_{self.segment}"
        return f"{base}_{self.texts}"

    def _text(self, text: str) -> list[dict[str, Any]]:
        events = []
        item_id = self._text_id()
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
        text, item_id = "".join(self.open_text), self._text_id()
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
