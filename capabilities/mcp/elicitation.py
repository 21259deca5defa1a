"""MCP elicitation in our client: a server that asks the user a question during a tool call.

Two shapes reach us (MCP spec, "Elicitation", revisions 2025-11-25 and 2026-07-28):

- **2026-07-28** (multi-round-trip, SEP-2322): ``tools/call`` answers with an
  ``InputRequiredResult`` whose ``inputRequests`` hold ``elicitation/create`` requests and an
  opaque ``requestState``. The client re-issues the same call with ``inputResponses`` and the
  echoed state. Nothing is held open in between, so the run pauses durably (the worker is
  freed) and resumes on any worker: :func:`elicitation_from_input_required` turns the result
  into an :class:`~capabilities.tools.InputForUser`, and :func:`resume_arguments` turns the
  person's answer into the retried call's ``input_responses`` / ``request_state``.
- **URL elicitation required** (error ``-32042``, both revisions): the server refuses the call
  until the user has visited a URL; :func:`elicitation_from_url_required` makes the same
  pause, and the call is simply issued again once the user accepted.

A **2025-11-25** server sends a standalone ``elicitation/create`` request *inside* the open
call. The pool holds that call open (:class:`HeldCall`: an asyncio task waiting on a future,
no thread, no worker; its timeout stops meanwhile), the run pauses the same way, and the run
that resumes *in this process* gives it the answer (:func:`held_call_answer`). A run resumed
by another process, or after this one stopped, finds no held call: the call fails with
:data:`LOST_HELD_CALL`. A request that cannot be tied to one call (several in flight on the
session) or that arrives on a plain connection is declined at once
(:func:`answer_legacy_elicitation`). A 2025-11-25 sampling request that needs a person's
approval is held the same way (:mod:`capabilities.mcp.sampling`).

Content of an accepted form is checked against the requested schema (the spec's restricted
subset: a flat object of primitive properties: string with ``minLength`` / ``maxLength`` /
``format`` email, uri, date, date-time; number and integer with ``minimum`` / ``maximum``;
boolean; single-select enums as ``enum`` or ``oneOf`` ``const``; multi-select arrays of
enums with ``minItems`` / ``maxItems``) by :func:`content_errors`.

No Django imports.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import math
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import anyio
import mcp_types

from capabilities.tools import InputForUser, ToolError

logger = logging.getLogger(__name__)

URL_ELICITATION_REQUIRED = -32042
"""JSON-RPC error code of "URL elicitation required" (MCP 2025-11-25)."""

ACTIONS = ("accept", "decline", "cancel")
"""What a person may answer (``ElicitResult.action``)."""

MAX_MESSAGE_CHARS = 4_000
"""Longest elicitation message kept (servers are not trusted)."""

LEGACY_ANSWER_NOTE = (
    "The server asked during an open call (MCP 2025-11-25) that the platform cannot hold (several "
    "calls of this session in flight, or a connection outside the pool): declined at once."
)

_EMAIL = re.compile(r"^[^@\s]+@[^@\s]+\.[^@\s]+$")


def _message(text: Any) -> str:
    return str(text or "")[:MAX_MESSAGE_CHARS]


def elicitation_from_input_required(
    result: mcp_types.InputRequiredResult, *, server: str, tool_name: str
) -> InputForUser | None:
    """The person's question in a 2026-07-28 ``InputRequiredResult``, or None when it has no
    elicitation (only ``requestState``, sampling or roots requests: the caller decides).

    Only the first elicitation request is asked; the call's retry carries its answer and the
    server asks again for what is still missing (each question is asked once per round).

    Returns:
        ``InputForUser(request)`` with ``request`` = ``{mode, message, schema, url,
        elicitation_id, server, tool, key, request_state, protocol: "input_required"}``.
    """
    for key, request in (result.input_requests or {}).items():
        if isinstance(request, mcp_types.ElicitRequest):
            return InputForUser(_request_json(request.params, server=server, tool_name=tool_name,
                                              key=key, request_state=result.request_state))
    return None


def elicitation_from_url_required(error_data: Any, *, server: str, tool_name: str) -> InputForUser | None:
    """The URL the server wants the user to visit, from a ``-32042`` error's ``data``
    (``{"elicitations": [{mode: "url", url, message, elicitationId}]}``), or None when the data
    holds no usable URL (an http(s) URL)."""
    items = error_data.get("elicitations") if isinstance(error_data, dict) else None
    for item in items or ():
        if isinstance(item, dict) and _is_web_url(item.get("url")):
            return InputForUser({
                "mode": "url", "message": _message(item.get("message")), "schema": None, "url": item["url"],
                "elicitation_id": str(item.get("elicitationId") or ""), "server": server, "tool": tool_name,
                "key": "", "request_state": None, "protocol": "url_required",
            })
    return None


def _request_json(params: Any, *, server: str, tool_name: str, key: str, request_state: str | None) -> dict[str, Any]:
    if isinstance(params, mcp_types.ElicitRequestURLParams):
        mode, schema, url, elicitation_id = "url", None, params.url, params.elicitation_id
    else:
        mode, url, elicitation_id = "form", "", ""
        schema = params.requested_schema if isinstance(params.requested_schema, dict) else dict(params.requested_schema)
    return {
        "mode": mode, "message": _message(params.message), "schema": schema, "url": url,
        "elicitation_id": elicitation_id, "server": server, "tool": tool_name, "key": key,
        "request_state": request_state, "protocol": "input_required",
    }


def _is_web_url(value: Any) -> bool:
    if not isinstance(value, str) or len(value) > 4_000:
        return False
    parts = urlsplit(value)
    return parts.scheme in ("http", "https") and bool(parts.hostname)


def elicit_result(action: str, content: dict[str, Any] | None) -> mcp_types.ElicitResult:
    """The ``ElicitResult`` for a person's answer (content only with ``accept``)."""
    return mcp_types.ElicitResult(action=action, content=content if action == "accept" else None)  # type: ignore[arg-type]


def resume_arguments(answer: dict[str, Any]) -> dict[str, Any]:
    """Keyword arguments of the retried ``tools/call`` for a stored answer.

    Args:
        answer: ``{"request": <InputForUser.request>, "action", "content"}``.

    Returns:
        ``{"input_responses": {key: ElicitResult}, "request_state": ...}`` for a
        2026-07-28 request; ``{}`` for a URL-required error (the call is issued again as it
        was). A declined or cancelled URL request is not retried (see :func:`resume_refusal`).
    """
    request = answer.get("request") or {}
    if request.get("protocol") != "input_required":
        return {}
    return {
        "input_responses": {request.get("key") or "": elicit_result(answer["action"], answer.get("content"))},
        "request_state": request.get("request_state"),
    }


def resume_refusal(answer: dict[str, Any]) -> str | None:
    """The failed call's reason when the answer ends the call without asking the server again:
    a URL-required error the person declined or cancelled; else None."""
    request = answer.get("request") or {}
    if request.get("protocol") == "url_required" and answer.get("action") != "accept":
        verb = "cancelled opening" if answer.get("action") == "cancel" else "declined to open"
        return (f"The user {verb} the page the MCP server {request.get('server')!r} asked for, so the tool "
                "was not called. Do not retry it unless the user asks.")
    return None


def _string_errors(name: str, spec: dict[str, Any], value: Any) -> str | None:
    if not isinstance(value, str):
        return f"{name}: must be a string"
    if isinstance(spec.get("minLength"), int) and len(value) < spec["minLength"]:
        return f"{name}: at least {spec['minLength']} characters"
    if isinstance(spec.get("maxLength"), int) and len(value) > spec["maxLength"]:
        return f"{name}: at most {spec['maxLength']} characters"
    fmt = spec.get("format")
    if fmt == "email" and not _EMAIL.match(value):
        return f"{name}: not an email address"
    if fmt == "uri" and not urlsplit(value).scheme:
        return f"{name}: not a URI"
    try:
        if fmt == "date":
            dt.date.fromisoformat(value)
        elif fmt == "date-time":
            dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return f"{name}: not a valid {fmt}"
    return None


def _number_errors(name: str, spec: dict[str, Any], value: Any) -> str | None:
    integer = spec.get("type") == "integer"
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (integer and not float(value).is_integer()):
        return f"{name}: must be {'an integer' if integer else 'a number'}"
    if isinstance(spec.get("minimum"), (int, float)) and value < spec["minimum"]:
        return f"{name}: at least {spec['minimum']}"
    if isinstance(spec.get("maximum"), (int, float)) and value > spec["maximum"]:
        return f"{name}: at most {spec['maximum']}"
    return None


def _choices(spec: dict[str, Any]) -> list[Any] | None:
    if isinstance(spec.get("enum"), list):
        return spec["enum"]
    for key in ("oneOf", "anyOf"):
        if isinstance(spec.get(key), list):
            return [o.get("const") for o in spec[key] if isinstance(o, dict)]
    return None


def _array_errors(name: str, spec: dict[str, Any], value: Any) -> str | None:
    items = spec.get("items") if isinstance(spec.get("items"), dict) else {}
    allowed = _choices(items) or []
    if not isinstance(value, list) or any(v not in allowed for v in value):
        return f"{name}: must be a list of {', '.join(map(str, allowed))}"
    if isinstance(spec.get("minItems"), int) and len(value) < spec["minItems"]:
        return f"{name}: choose at least {spec['minItems']}"
    if isinstance(spec.get("maxItems"), int) and len(value) > spec["maxItems"]:
        return f"{name}: choose at most {spec['maxItems']}"
    return None


def _value_error(name: str, spec: dict[str, Any], value: Any) -> str | None:
    choices = _choices(spec)
    if choices is not None and spec.get("type") != "array":
        return None if value in choices else f"{name}: must be one of {', '.join(map(str, choices))}"
    kind = spec.get("type")
    if kind == "string":
        return _string_errors(name, spec, value)
    if kind in ("number", "integer"):
        return _number_errors(name, spec, value)
    if kind == "boolean":
        return None if isinstance(value, bool) else f"{name}: must be true or false"
    if kind == "array":
        return _array_errors(name, spec, value)
    return f"{name}: the server asked for an unsupported type {kind!r}"


def content_errors(schema: dict[str, Any] | None, content: Any) -> dict[str, str]:
    """What is wrong with ``content`` for the requested ``schema`` (empty: it is valid).

    Args:
        schema: The server's ``requestedSchema`` (a flat object of primitive properties).
        content: The person's answer: a JSON object.

    Returns:
        ``{field: "field: reason"}``; the key ``content`` for an answer that is not an object,
        a field the schema does not have is refused (``{name: "name: not asked for"}``).
    """
    if not isinstance(content, dict):
        return {"content": "content: must be an object of the form's fields"}
    properties = (schema or {}).get("properties") or {}
    required = (schema or {}).get("required") or []
    errors: dict[str, str] = {}
    for name in required:
        if name not in content or content[name] in (None, ""):
            errors[name] = f"{name}: required"
    for name, value in content.items():
        spec = properties.get(name)
        if not isinstance(spec, dict):
            errors[name] = f"{name}: not asked for"
        elif name not in errors:
            problem = _value_error(name, spec, value)
            if problem:
                errors[name] = problem
    return errors


def url_domain(url: str) -> str:
    """The host of ``url`` (what the card highlights), ``""`` when it has none."""
    return urlsplit(url).hostname or ""


async def answer_legacy_elicitation(context: Any, params: Any) -> mcp_types.ElicitResult:
    """The SDK's default ``elicitation_callback`` (the pool's sessions hold the call instead when
    they can, :class:`HeldCall`): a 2025-11-25 server's standalone ``elicitation/create``
    inside an open call is declined at once (:data:`LEGACY_ANSWER_NOTE`).

    Registering it also makes the client declare the ``elicitation`` capability (form and
    URL), so that 2026-07-28 servers ask through ``InputRequiredResult`` instead of refusing
    the call; those are answered by the person (:func:`elicitation_from_input_required`) and
    never reach this callback.
    """
    logger.info("MCP server asked %r during an open call (2025-11-25); declined: %s",
                _message(getattr(params, "message", ""))[:200], LEGACY_ANSWER_NOTE)
    return mcp_types.ElicitResult(action="decline")


# --- 2025-11-25: a call held open while the person answers --------------------------------

LOST_HELD_CALL = (
    "The MCP server asked the user during this call (protocol 2025-11-25, where the call stays "
    "open), but the worker process that held the call stopped or is not this one, so the answer "
    "could not reach the server and the call is lost. Call the tool again if it is still needed."
)
"""The failed call's reason when a held call's answer finds no held call in this process."""

_held: dict[int, HeldCall] = {}
"""This process's held calls that asked the person, by tool call primary key."""


@dataclass(eq=False, slots=True)
class HeldCall:
    """A 2025-11-25 call whose server sent ``elicitation/create`` inside it, held open while
    the run is paused: an asyncio task waiting on a future in the pool's event loop (no thread,
    no worker). The call's timeout stops while the person is asked and restarts afterwards.

    Created by :meth:`capabilities.mcp.pool.PooledSession.call_tool_raw`; answered by the run
    that resumes in this process (:func:`held_call_answer`)."""

    wait_seconds: float
    """The longest the server waits for the answer; then it gets ``decline``."""
    call_seconds: float
    """The call's own timeout, given again once the person answered."""
    elicitation_wait_seconds: float | None = None
    """The longest the server waits for the answer to an ``elicitation/create`` when its
    binding sets ``elicitation_timeout_seconds`` (that plus a grace); None: ``wait_seconds``.
    A sampling request's approval always waits ``wait_seconds``."""
    task: asyncio.Task[Any] | None = None
    asked: asyncio.Future[Any] | None = None
    """Set to the server's request params when it asks (the current round)."""
    answer: asyncio.Future[Any] | None = None
    """The server's answer: an ``ElicitResult``, or a sampling answer (``CreateMessageResult``
    or ``ErrorData``)."""
    scope: anyio.CancelScope | None = None
    """The call's timeout scope (its deadline is moved while the person is asked)."""

    def next_round(self) -> None:
        """Expect a (next) question: a fresh ``asked`` future."""
        self.asked = asyncio.get_running_loop().create_future()

    async def ask(self, params: Any, *, question: InputForUser | None = None, timeout_answer: Any = None) -> Any:
        """The server's ``elicitation/create`` (or, with ``question``, its sampling request
        awaiting a person's approval, :mod:`capabilities.mcp.call_hooks`) for this call: hand
        it to the waiting caller and wait for the answer (after ``wait_seconds``, or
        ``elicitation_wait_seconds`` for an elicitation: ``timeout_answer``, default ``decline``)."""
        assert self.asked is not None
        self.answer = asyncio.get_running_loop().create_future()
        if self.scope is not None:
            self.scope.deadline = math.inf
        self.asked.set_result(question if question is not None else params)
        wait = self.wait_seconds
        if question is None and self.elicitation_wait_seconds is not None:
            wait = self.elicitation_wait_seconds
        try:
            with anyio.fail_after(wait):
                return await asyncio.shield(self.answer)
        except TimeoutError:
            return timeout_answer if timeout_answer is not None else mcp_types.ElicitResult(action="decline")
        finally:
            if self.scope is not None:
                self.scope.deadline = anyio.current_time() + self.call_seconds


async def held_call_drive(held: HeldCall, key: int, *, server: str, tool_name: str) -> Any:
    """Wait until the held call ends (its result) or its server asks the person (the call is
    registered under ``key`` and :class:`InputForUser` raised, with ``protocol: "held"``).

    Cancelled before the server asked (the run was cancelled): the call is cancelled too."""
    assert held.task is not None and held.asked is not None
    try:
        await asyncio.wait({held.task, held.asked}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        if not held.asked.done():
            held.task.cancel()
        raise
    if held.task.done():
        _held.pop(key, None)
        return held.task.result()
    _held[key] = held
    asked = held.asked.result()
    if isinstance(asked, InputForUser):  # a sampling request to approve (its question made by the call's hooks)
        raise asked
    request = _request_json(asked, server=server, tool_name=tool_name, key="", request_state=None)
    raise InputForUser({**request, "protocol": "held"})


async def held_call_answer(answer: dict[str, Any], key: int, *, reply: Callable[[], Awaitable[Any]] | None = None,
                           hooks: Any = None) -> Any:
    """Give the person's answer to this process's held call ``key`` and wait for it again
    (its result, or its next question: :class:`InputForUser`).

    Args:
        answer: The stored answer (``{request, action, content}``).
        reply: Makes what the server gets, when it is not the ``ElicitResult`` of ``answer``
            (a sampling request's: the model's answer once approved); awaited only when the
            call is held here.
        hooks: The resumed call's :class:`~capabilities.mcp.call_hooks.CallHooks`: the held
            call's next sampling request waits in it (``hooks.held``).

    Raises:
        ToolError: ``elicitation_lost`` (:data:`LOST_HELD_CALL`) when no call is held here.
    """
    held = _held.pop(key, None)
    if held is None or held.task is None:
        raise ToolError(LOST_HELD_CALL, code="elicitation_lost")
    request = answer.get("request") or {}
    if hooks is not None:
        hooks.held = held
    result = await reply() if reply is not None else elicit_result(answer.get("action", "decline"), answer.get("content"))
    held.next_round()  # before the answer: the server may ask its next question at once
    if held.answer is not None and not held.answer.done():
        held.answer.set_result(result)
    return await held_call_drive(held, key, server=str(request.get("server", "")),
                                 tool_name=str(request.get("tool", "")))
