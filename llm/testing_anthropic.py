"""``FakeAnthropicServer``: a real Anthropic Messages API server for tests.

Same usage as :class:`llm.testing.FakeLLMServer` (it reuses that server's asyncio HTTP/1.1
plumbing, thread, scripting and request log) and the same step dataclasses, so tests read
the same whichever provider they script::

    with FakeAnthropicServer() as server:
        server.script(Reply("Hello", reasoning="Let me think."), ToolCalls([("get_time", {})]), Fail(529))
        ... RouteEntryConfig(..., api="anthropic", base_url=server.base_url) ...
        assert server.requests[0]["messages"][0]["role"] == "user"

``server.base_url`` is the provider root ``http://127.0.0.1:PORT`` (the SDK appends
``/v1/messages``). Each ``POST /v1/messages`` consumes one step, first in first out; with no
step left (and no :meth:`~llm.testing.FakeLLMServer.respond` hook) it answers HTTP 500 with an
``api_error`` body saying so. ``GET /v1/models`` lists one model.

``"stream": true`` requests get Server-Sent Events with ``event:`` lines, as the API sends
them: ``message_start`` (usage ``input_tokens``), ``ping``, then per content block
``content_block_start`` / ``content_block_delta`` (``thinking_delta`` + ``signature_delta``
for :attr:`Reply.reasoning`, ``text_delta``, ``input_json_delta`` for tool arguments) /
``content_block_stop``, then ``message_delta`` (``stop_reason``, cumulative
``output_tokens``) and ``message_stop``. Other requests get one JSON ``Message``.

Steps (from :mod:`llm.testing`, plus :class:`ErrorEvent`):

* ``Reply(text, reasoning=…, finish_reason=…)``: ``finish_reason`` is a canonical value
  (``stop`` → ``end_turn``, ``length`` → ``max_tokens``, ``content_filter`` → ``refusal``,
  ``tool_calls`` → ``tool_use``) or an Anthropic ``stop_reason`` sent as is.
* ``ToolCalls([(name, args), …], text=…)``: ``tool_use`` blocks with ids ``toolu_fake<n>``.
* ``Fail(status, body=None, headers={})``: default body ``{"type": "error", "error":
  {"type": <by status>, "message": …}}`` (429 ``rate_limit_error``, 529 ``overloaded_error``,
  500 ``api_error``, 402 ``billing_error``, …).
* ``Hang``, ``Delay``, ``Stall`` (after ``message_start``, ``ping`` and ``n_chunks`` more
  events), ``CutAfter`` (``n_chunks`` text deltas, then the connection drops).
* :class:`ErrorEvent`: an ``error`` event inside an open (HTTP 200) stream.

Usage numbers: ``Reply.usage``/``ToolCalls.usage`` when given, else chars/4 counts;
``include_usage=False`` leaves ``usage`` out of ``message_start`` and ``message_delta``
(tests the estimate). Pure Python, no Django.
"""

from __future__ import annotations

import asyncio
import inspect
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from llm.testing import (
    CutAfter,
    Delay,
    Fail,
    FakeLLMServer,
    Hang,
    Reply,
    Stall,
    Step,
    ToolCalls,
    _chunks,
    _ClientGone,
    _usage_numbers,
)

DEFAULT_ANTHROPIC_MODEL: Final[str] = "fake-claude"
NO_STEP_LEFT_ANTHROPIC: Final[str] = "FakeAnthropicServer: no scripted step left"

_ERROR_TYPES_BY_STATUS: Final[dict[int, str]] = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    504: "timeout_error",
    529: "overloaded_error",
}
_STATUS_BY_ERROR_TYPE: Final[dict[str, int]] = {kind: status for status, kind in _ERROR_TYPES_BY_STATUS.items()}

STOP_REASONS: Final[dict[str, str]] = {
    "stop": "end_turn",
    "length": "max_tokens",
    "content_filter": "refusal",
    "tool_calls": "tool_use",
}
"""Canonical ``finish_reason`` of a scripted step → Anthropic ``stop_reason``."""


@dataclass(frozen=True, slots=True)
class ErrorEvent:
    """Open a stream (HTTP 200, ``message_start``), send the first ``n_events`` events of
    ``after`` (if any), then an ``error`` event ``{"type": "error", "error": {"type":
    error_type, "message": message}}`` and end the stream. Non-streaming requests get the
    matching HTTP error instead (529 for ``overloaded_error``, …, else 500)."""

    error_type: str = "overloaded_error"
    message: str = "Overloaded"
    after: Reply | ToolCalls | None = None
    n_events: int = 0
    """Events of ``after`` sent before the error (content_block_start/delta/stop each count)."""


AnthropicStep = Step | ErrorEvent

_STEP_TYPES: Final[tuple[type, ...]] = (Reply, ToolCalls, Fail, Hang, CutAfter, Stall, Delay, ErrorEvent)

_SSE_HEAD: Final[bytes] = (
    b"HTTP/1.1 200 OK\r\n"
    b"content-type: text/event-stream; charset=utf-8\r\n"
    b"cache-control: no-cache\r\n"
    b"request-id: req_fake\r\n"
    b"transfer-encoding: chunked\r\n"
    b"\r\n"
)
_CHUNKED_END: Final[bytes] = b"0\r\n\r\n"

_Event = tuple[str, dict[str, Any]]


def _sse_event(kind: str, data: Mapping[str, Any]) -> bytes:
    """One ``event:``/``data:`` frame as an HTTP chunk."""
    frame = f"event: {kind}\ndata: {json.dumps(data)}\n\n".encode()
    return f"{len(frame):x}\r\n".encode() + frame + b"\r\n"


def error_body(error_type: str, message: str) -> dict[str, Any]:
    """An Anthropic error body: ``{"type": "error", "error": {"type", "message"}, "request_id"}``."""
    return {"type": "error", "error": {"type": error_type, "message": message}, "request_id": "req_fake"}


class FakeAnthropicServer(FakeLLMServer):
    """A scripted Anthropic Messages API server on 127.0.0.1 (see the module docstring).

    Args:
        model: Model id listed by ``GET /v1/models`` and echoed when a request has none.

    Thread-safe like :class:`~llm.testing.FakeLLMServer`; :attr:`requests` holds the JSON
    bodies of the ``POST /v1/messages`` requests, in order.
    """

    def __init__(self, *, model: str = DEFAULT_ANTHROPIC_MODEL) -> None:
        super().__init__(model=model)

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT``: the provider root (no ``/v1``)."""
        return f"http://127.0.0.1:{self.port}"

    def script(self, *steps: AnthropicStep) -> None:  # type: ignore[override]
        """Queue steps, consumed one per ``POST /v1/messages``, first in first out.

        Raises:
            TypeError: a step that is not one of :mod:`llm.testing`'s or an :class:`ErrorEvent`.
        """
        for step in steps:
            if not isinstance(step, _STEP_TYPES):
                raise TypeError(f"not a FakeAnthropicServer step: {step!r}")
        with self._lock:
            self._steps.extend(steps)  # type: ignore[arg-type]

    # -- HTTP --

    async def _dispatch(
        self, method: str, path: str, raw: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        route = path.rstrip("/")
        if method == "GET" and route.endswith("/v1/models"):
            data = {
                "data": [
                    {
                        "id": self.model,
                        "type": "model",
                        "display_name": self.model,
                        "created_at": "2025-01-01T00:00:00Z",
                    }
                ],
                "has_more": False,
                "first_id": self.model,
                "last_id": self.model,
            }
            await self._send_json(writer, 200, data)
            return True
        if method != "POST" or not route.endswith("/v1/messages"):
            await self._send_json(
                writer, 404, error_body("not_found_error", f"FakeAnthropicServer: no route {method} {path}")
            )
            return True
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            await self._send_json(writer, 400, error_body("invalid_request_error", "body is not JSON"))
            return True
        if not isinstance(body, dict):
            body = {"_raw": body}
        with self._changed:
            self._requests.append(body)
            step: Any = self._steps.popleft() if self._steps else None
            responder = self._responder
            self._changed.notify_all()
        if step is None and responder is not None:
            produced = responder(body)
            step = await produced if inspect.isawaitable(produced) else produced
        if step is None:
            await self._send_json(writer, 500, error_body("api_error", NO_STEP_LEFT_ANTHROPIC))
            return True
        return await self._perform(step, body, reader, writer)

    async def _perform(  # type: ignore[override]
        self, step: AnthropicStep, body: dict[str, Any], reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        while isinstance(step, Delay):
            await asyncio.sleep(step.seconds)
            step = step.step
        streaming = bool(body.get("stream"))
        if isinstance(step, Fail):
            data = step.body if step.body is not None else _default_error(step.status)
            await self._send_json(writer, step.status, data, headers=step.headers)
            return True
        if isinstance(step, ErrorEvent) and not streaming:
            status = _STATUS_BY_ERROR_TYPE.get(step.error_type, 500)
            await self._send_json(writer, status, error_body(step.error_type, step.message))
            return True
        if isinstance(step, Stall) and not streaming:
            step = Hang(step.seconds)
        if isinstance(step, Hang):
            await self._hang(step.seconds, reader)
            return False
        model = str(body.get("model") or self.model)
        message_id = f"msg_fake{next(self._ids)}"
        if isinstance(step, CutAfter):
            if streaming:
                start = _message_start(message_id, model, prompt_tokens=1)
                events: list[_Event] = [start, ("content_block_start", _block_start(0, {"type": "text", "text": ""}))]
                events += [
                    ("content_block_delta", _delta(0, {"type": "text_delta", "text": piece}))
                    for piece in _chunks(step.text, step.chunk_size)[: max(0, step.n_chunks)]
                ]
                writer.write(_SSE_HEAD + b"".join(_sse_event(k, d) for k, d in events))
            else:
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 100000\r\n\r\n"
                    + b'{"id": "' + message_id.encode()
                )
            await writer.drain()
            return False  # the handler closes the connection mid-body
        if isinstance(step, Stall):
            head, rest = self._events(step.step, body, model, message_id)
            writer.write(_SSE_HEAD + b"".join(_sse_event(k, d) for k, d in head + rest[: max(0, step.n_chunks)]))
            await writer.drain()
            await self._hang(step.seconds, reader)
            return False
        if isinstance(step, ErrorEvent):
            if step.after is not None:
                head, rest = self._events(step.after, body, model, message_id)
                events = head + rest[: max(0, step.n_events)]
            else:
                events = [_message_start(message_id, model, prompt_tokens=1), ("ping", {"type": "ping"})]
            events.append(("error", error_body(step.error_type, step.message)))
            writer.write(_SSE_HEAD + b"".join(_sse_event(k, d) for k, d in events) + _CHUNKED_END)
            await writer.drain()
            return True
        if not isinstance(step, (Reply, ToolCalls)):  # pragma: no cover - script() checks types
            raise TypeError(f"not a FakeAnthropicServer step: {step!r}")
        if streaming:
            head, rest = self._events(step, body, model, message_id)
            await self._stream_events(head + rest, step.chunk_interval_seconds, reader, writer)
        else:
            await self._send_json(writer, 200, self._message_json(step, body, model, message_id))
        return True

    # -- payloads --

    def _blocks(self, step: Reply | ToolCalls) -> tuple[list[dict[str, Any]], list[list[_Event]], str]:
        """``(final content blocks, per-block start/delta/stop events, stop_reason)``."""
        blocks: list[dict[str, Any]] = []
        events: list[list[_Event]] = []

        def add(final: dict[str, Any], start: dict[str, Any], deltas: list[dict[str, Any]]) -> None:
            index = len(blocks)
            blocks.append(final)
            events.append(
                [("content_block_start", _block_start(index, start))]
                + [("content_block_delta", _delta(index, d)) for d in deltas]
                + [("content_block_stop", {"type": "content_block_stop", "index": index})]
            )

        if isinstance(step, Reply) and step.reasoning:
            add(
                {"type": "thinking", "thinking": step.reasoning, "signature": "fake-signature"},
                {"type": "thinking", "thinking": "", "signature": ""},
                [{"type": "thinking_delta", "thinking": c} for c in _chunks(step.reasoning, step.chunk_size)]
                + [{"type": "signature_delta", "signature": "fake-signature"}],
            )
        if step.text:
            add(
                {"type": "text", "text": step.text},
                {"type": "text", "text": ""},
                [{"type": "text_delta", "text": c} for c in _chunks(step.text, step.chunk_size)],
            )
        if isinstance(step, Reply):
            return blocks, events, STOP_REASONS.get(step.finish_reason, step.finish_reason)
        for name, arguments in step.calls:
            call_id = f"toolu_fake{next(self._ids)}"
            args_json = json.dumps(dict(arguments))
            add(
                {"type": "tool_use", "id": call_id, "name": name, "input": dict(arguments)},
                {"type": "tool_use", "id": call_id, "name": name, "input": {}},
                [{"type": "input_json_delta", "partial_json": c} for c in _chunks(args_json, step.chunk_size)],
            )
        return blocks, events, "tool_use"

    def _events(
        self, step: Reply | ToolCalls, body: dict[str, Any], model: str, message_id: str
    ) -> tuple[list[_Event], list[_Event]]:
        """``(head, rest)``: ``message_start`` + ``ping``, then the content and end events."""
        prompt, completion = _usage_numbers(step, body)
        _, per_block, stop_reason = self._blocks(step)
        head = [
            _message_start(message_id, model, prompt_tokens=prompt if step.include_usage else None),
            ("ping", {"type": "ping"}),
        ]
        rest = [event for block in per_block for event in block]
        message_delta: dict[str, Any] = {
            "type": "message_delta",
            "delta": {"stop_reason": stop_reason, "stop_sequence": None},
        }
        if step.include_usage:
            message_delta["usage"] = {"output_tokens": completion}
        rest.append(("message_delta", message_delta))
        rest.append(("message_stop", {"type": "message_stop"}))
        return head, rest

    def _message_json(
        self, step: Reply | ToolCalls, body: dict[str, Any], model: str, message_id: str
    ) -> dict[str, Any]:
        blocks, _, stop_reason = self._blocks(step)
        message: dict[str, Any] = {
            "id": message_id,
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": blocks,
            "stop_reason": stop_reason,
            "stop_sequence": None,
        }
        if step.include_usage:
            prompt, completion = _usage_numbers(step, body)
            message["usage"] = {"input_tokens": prompt, "output_tokens": completion}
        return message

    @staticmethod
    async def _stream_events(
        events: list[_Event], interval: float, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        if interval <= 0:
            writer.write(_SSE_HEAD + b"".join(_sse_event(k, d) for k, d in events) + _CHUNKED_END)
            await writer.drain()
            return
        writer.write(_SSE_HEAD)
        for kind, data in events:
            if reader.at_eof() or writer.transport.is_closing():
                raise _ClientGone()
            writer.write(_sse_event(kind, data))
            try:
                await writer.drain()
            except ConnectionError as exc:
                raise _ClientGone() from exc
            await asyncio.sleep(interval)
        writer.write(_CHUNKED_END)
        await writer.drain()


def _default_error(status: int) -> dict[str, Any]:
    kind = _ERROR_TYPES_BY_STATUS.get(status) or ("api_error" if status >= 500 else "invalid_request_error")
    return error_body(kind, f"FakeAnthropicServer scripted failure (HTTP {status})")


def _message_start(message_id: str, model: str, *, prompt_tokens: int | None) -> _Event:
    message: dict[str, Any] = {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
    }
    if prompt_tokens is not None:
        message["usage"] = {"input_tokens": prompt_tokens, "output_tokens": 1}
    return "message_start", {"type": "message_start", "message": message}


def _block_start(index: int, block: dict[str, Any]) -> dict[str, Any]:
    return {"type": "content_block_start", "index": index, "content_block": block}


def _delta(index: int, delta: dict[str, Any]) -> dict[str, Any]:
    return {"type": "content_block_delta", "index": index, "delta": delta}


__all__ = [
    "DEFAULT_ANTHROPIC_MODEL",
    "NO_STEP_LEFT_ANTHROPIC",
    "STOP_REASONS",
    "AnthropicStep",
    "CutAfter",
    "Delay",
    "ErrorEvent",
    "Fail",
    "FakeAnthropicServer",
    "Hang",
    "Reply",
    "Stall",
    "ToolCalls",
    "error_body",
]
