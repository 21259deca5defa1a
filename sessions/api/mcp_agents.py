"""The tenant's agents offered to other AI systems over MCP: a Streamable HTTP server at
``/mcp/agents/``.

An MCP client (a desktop or IDE assistant, another agent platform, the ``mcp`` SDK) connects with
an API token of this platform (``Authorization: Bearer ap_…``) and gets one tool per active agent
of the token's tenant, the agents ``GET /api/v1/agents/`` and the OpenAI-compatible ``/models``
list for the same caller: the tool's name is the agent's slug (a slug is already within MCP's
tool-name rules, 1-128 characters of ``[A-Za-z0-9_.-]``), its title the agent's name, its
description the agent's description; input ``{message: string, chat_id?: string, version?: integer}``.
A call runs the agent's published version; ``version`` pins one of its versions (the number the
console's Versions tab shows, as ``slug@<n>`` does on the OpenAI-compatible API: ``@`` is outside
MCP's tool-name characters, so a pin is an argument, not a tool of its own). A version the agent
does not have is a tool error naming it.

Calling a tool is an ordinary run of that agent (:mod:`sessions.api.agent_runs`, the starter the
OpenAI-compatible API uses: purpose ``api`` budgets, the ``messages``/``runs`` throttles, the
user's stream slots, usage and trace): a new chat, or with ``chat_id`` the next message of the
caller's chat with that agent. The answer is read from the session's events through the one
event reader (:class:`sessions.event_reader.SessionEventReader`) and is the reply as text plus
``structuredContent`` ``{reply, chat_id, run_id, citations, status, approval_url?}`` (the tool's
``outputSchema``: :data:`OUTPUT_SCHEMA`). While the run works, a client that sent a
``progressToken`` gets ``notifications/progress`` (a tool called or answered, the answer being
written, a keep-alive), so the answer comes on an SSE stream.

- A run that pauses for a person's approval answers at once with where to decide: the chat app's
  URL of that chat (``<origin>/#/sessions/<chat_id>``), ``status: awaiting_approval``; the run
  goes on in that chat once decided. A client that declares URL-mode elicitation gets the same
  as a URL elicitation instead (``-32042``, URL elicitation required): on 2026-07-28 it declares
  it in each request's ``_meta``; on 2025-11-25 (the revision that introduced URL mode) at
  ``initialize``, a POST of its own on this stateless server, so the answer to that
  ``initialize`` carries an ``Mcp-Session-Id`` that says so, signed and bound to the credential
  (:func:`_url_session_id`); the client sends it back on its later requests (2025-11-25,
  "Session Management"). Such a session id holds no state on the server.
- A busy chat, a throttle, too many open answers, a run over its budget, a failed or cancelled
  run: a tool result with ``isError`` and the reason (a client's model reads it). An unknown
  tool (no such active agent for the caller, another tenant's) is the protocol's error
  (``-32602``), with the same words as a missing one.
- Cancellation cancels the run: on 2026-07-28 the client closes the request's stream (the
  handler is cancelled); on 2025-11-25 it posts ``notifications/cancelled`` with the request's
  id, which any web process answers: the call's run is found under the token and the request id
  in the cache (:func:`_call_key`), so only the token that made the call can cancel it. At
  2025-11-25 a client that goes away has not cancelled (the specification's rule): the run goes
  on and its answer lands in the chat.

Both protocol revisions the SDK serves are answered by its ``StreamableHTTPSessionManager``,
stateless (every POST carries its own credential; any web process answers): a request with
``MCP-Protocol-Version: 2026-07-28`` takes the SDK's single-exchange path (no ``initialize``,
per-request ``_meta``), any other the handshake-era path (2025-11-25 and older). The HTTP edge
(``Host``, POST only, bearer token, failed-login throttle, security headers) is
:func:`agent_platform.mcp_http.serve`, shared with ``/mcp/knowledge/``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import uuid
from concurrent.futures import ThreadPoolExecutor
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Final

import mcp_types as types
from mcp.server import Server, ServerRequestContext
from mcp.server.streamable_http import check_accept_headers
from mcp.server.streamable_http_manager import DEFAULT_MAX_REQUEST_BODY_SIZE, StreamableHTTPSessionManager
from mcp.shared.exceptions import MCPError, UrlElicitationRequiredError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from starlette.requests import Request

from agent_platform import mcp_http
from sessions.api.agent_runs import (
    AGENT_NOT_FOUND,
    RunRefused,
    agent_run_start,
    answer_reader_open,
    chat_continue,
    person_decision_note,
)
from sessions.event_reader import Closed, Event, SessionEventReader

PATH: Final[str] = "/mcp/agents/"
"""Where the server answers (also without the trailing slash)."""
SERVER_NAME: Final[str] = "agent-platform-agents"
CALL_THREADS: Final[int] = 4
"""Threads for the blocking parts of the calls (listing agents, starting or cancelling a run):
short ORM work; the wait for the answer holds no thread."""
CALL_KEY_SECONDS: Final[int] = 24 * 3600
"""How long the cache remembers a call's run for a 2025-11-25 ``notifications/cancelled`` (the
key is deleted when the call ends; this only bounds a key a killed process left)."""
TOOL_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,128}\Z")
"""MCP's tool-name rule (specification 2025-11-25, "Tool names")."""

INSTRUCTIONS = (
    "Each tool is an agent of this organisation. Call it with your message; it answers as a chat in the "
    "organisation's agent platform. Pass the chat_id of an earlier answer to continue that chat. When an agent "
    "needs a person's approval, the answer says where to decide."
)
INPUT_SCHEMA: Final[dict[str, Any]] = {
    "type": "object",
    "properties": {
        "message": {"type": "string", "minLength": 1, "description": "What to ask or tell the agent."},
        "chat_id": {"type": "string", "pattern": "^[0-9]{1,18}$",
                    "description": "Continue this chat (the chat_id of an earlier answer) instead of starting one."},
        "version": {"type": "integer", "minimum": 1,
                    "description": "Run this version of the agent (its number in the console) instead of the "
                                   "published one."},
    },
    "required": ["message"],
    "additionalProperties": False,
}
OUTPUT_SCHEMA: Final[dict[str, Any]] = {
    "type": "object",
    "properties": {
        "reply": {"type": "string", "description": "The agent's answer (or what it waits for)."},
        "chat_id": {"type": "string", "description": "The chat: pass it back to continue."},
        "run_id": {"type": "string", "description": "The run that answered (the console's trace)."},
        "citations": {"type": "array", "items": {"type": "object"},
                      "description": "Passages of knowledge bases the answer used: {n, document_title, heading, ...}."},
        "status": {"type": "string", "enum": ["completed", "awaiting_approval"]},
        "approval_url": {"type": "string", "description": "Where a person decides (status awaiting_approval)."},
    },
    "required": ["reply", "chat_id", "run_id", "citations", "status"],
}
URL_ELICITATION_HANDSHAKE_VERSIONS: Final[frozenset[str]] = frozenset({"2025-11-25"})
"""The handshake-era revisions that define URL-mode elicitation and ``-32042`` (introduced in
2025-11-25, specification "Elicitation"; 2026-07-28 and later are :data:`MODERN_PROTOCOL_VERSIONS`)."""
SESSION_ID_SALT: Final[str] = "sessions.api.mcp_agents.url-elicitation"
"""The ``django.core.signing`` salt of the ``Mcp-Session-Id`` that records a 2025-11-25 client's
declared URL-mode elicitation."""
RUN_END_TYPES: Final[frozenset[str]] = frozenset({"run_completed", "run_failed", "run_cancelled"})

logger = logging.getLogger(__name__)

_call_pool = ThreadPoolExecutor(max_workers=CALL_THREADS, thread_name_prefix="mcp-agents-call")
_request: ContextVar[mcp_http.McpRequest | None] = ContextVar("agents_mcp_request", default=None)
_url_session: ContextVar[bool] = ContextVar("agents_mcp_url_session", default=False)
"""True while answering a request whose ``Mcp-Session-Id`` is ours for the same credential: its
client declared URL-mode elicitation at ``initialize``."""


def _error(message: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(text=message)], is_error=True)


def agent_tools(caller: Any) -> list[types.Tool]:
    """One tool per active agent ``caller`` may use, by slug (an agent whose slug breaks MCP's
    name rule is left out). Blocking (ORM)."""
    from agents.selectors import agent_list_active
    from tenants.scoping import tenant_scope

    with tenant_scope(caller.membership.tenant_id):
        agents = list(agent_list_active().order_by("slug"))
    return [types.Tool(name=agent.slug, title=agent.name, description=agent.description or f"The agent {agent.name}.",
                       input_schema=INPUT_SCHEMA, output_schema=OUTPUT_SCHEMA)
            for agent in agents if TOOL_NAME.match(agent.slug)]


def agent_usable(caller: Any, slug: str) -> bool:
    """Whether ``slug`` names an active agent ``caller`` may use (a tool of theirs). Blocking (ORM)."""
    from agents.models import AgentInstance
    from tenants.scoping import tenant_scope

    with tenant_scope(caller.membership.tenant_id):
        return AgentInstance.objects.filter(slug=slug, is_active=True).exists()


@dataclass(frozen=True, slots=True)
class CallAsk:
    """A tool call's checked arguments."""

    message: str
    """What to ask the agent (not yet stripped; the post refuses an empty or over-long one)."""
    chat_id: int | None
    """The chat to continue, or None for a new chat."""
    version: int | None = None
    """The agent's version to run (its number), or None for the published one."""


def _positive(value: Any, digits: int) -> int | None:
    """``value`` as a positive integer (an int, or a string of at most ``digits`` digits), else None."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 < value < 10**digits:
        return value
    if isinstance(value, str) and re.fullmatch(rf"[0-9]{{1,{digits}}}", value) and int(value) > 0:
        return int(value)
    return None


def call_arguments(arguments: dict[str, Any]) -> CallAsk | str:
    """A tool call's ``arguments`` checked (``message`` a non-empty string, ``chat_id`` digits
    or a positive integer, ``version`` a positive integer, nothing else), or what is wrong with them."""
    unknown = set(arguments) - {"message", "chat_id", "version"}
    if unknown:
        return f"Unknown arguments {sorted(unknown)}; use message, chat_id and version."
    message, chat_id, version = arguments.get("message"), arguments.get("chat_id"), arguments.get("version")
    if not isinstance(message, str) or not message.strip():
        return "message must be a non-empty string."
    if chat_id is not None and _positive(chat_id, 18) is None:
        return "chat_id must be the chat_id of an earlier answer (digits)."
    if version is not None and _positive(version, 9) is None:
        return "version must be a positive integer: a version number of the agent."
    return CallAsk(message=message, chat_id=None if chat_id is None else _positive(chat_id, 18),
                   version=None if version is None else _positive(version, 9))


def call_start(caller: Any, slug: str, ask: CallAsk) -> tuple[int, int]:
    """The run a call of the tool ``slug`` asks for: a new chat with that agent, or the next
    message of the caller's chat ``ask.chat_id`` (:func:`sessions.api.agent_runs.agent_run_start`).
    Blocking (ORM, cache).

    Returns:
        ``(chat id, run id)``.

    Raises:
        RunRefused: ``agent_not_found`` (the protocol's unknown tool), or a refusal that is a
            tool error (throttled, chat busy or not the caller's, a refused message).
    """
    from sessions.services import chat_from_conversation

    def post(agent: Any) -> Any:
        if ask.chat_id is None:
            return chat_from_conversation(user=caller.user, agent=agent, history=[], content=ask.message)
        return chat_continue(caller, agent, chat_id=ask.chat_id, content=ask.message, param="chat_id")

    return agent_run_start(caller, f"{slug}@{ask.version}" if ask.version else slug, post)


def _cancel(caller: Any, run_id: int) -> None:
    """Cancel the caller's run ``run_id`` if it has not ended. Blocking."""
    from agent_platform.api_errors import ApplicationError
    from sessions.selectors import run_get_for_user
    from sessions.services import run_cancel
    from tenants.scoping import tenant_scope

    with tenant_scope(caller.membership.tenant_id):
        run = run_get_for_user(run_id=run_id, user_id=caller.user.pk)
        if run is None:
            return
        try:
            run_cancel(run=run)
        except ApplicationError:  # it ended meanwhile
            pass


def _call_key(caller: Any, request_id: Any) -> str:
    """The cache key of a call in flight: the credential's (API token or OAuth grant) and the
    request's id (a request id is the client's own, so only the credential that made the call
    finds it)."""
    return f"mcp-agents:call:{caller.credential_key}:{json.dumps(request_id)}"


def _remember(key: str, run_id: int | None) -> None:
    from django.core.cache import cache

    if run_id is None:
        cache.delete(key)
    else:
        cache.set(key, run_id, CALL_KEY_SECONDS)


def cancelled_notification(caller: Any, request_id: Any) -> bool:
    """A 2025-11-25 ``notifications/cancelled`` for ``request_id``: cancel the run of the
    caller's call in flight under that id (any web process). True when there was one. Blocking."""
    from django.core.cache import cache

    run_id = cache.get(_call_key(caller, request_id))
    if run_id is None:
        return False
    _cancel(caller, run_id)
    return True


@dataclass(slots=True)
class _Answer:
    """What the call's run said so far, from its frames."""

    run_id: int
    chat_id: int
    citations: list[dict[str, Any]] = field(default_factory=list)
    writing: bool = False
    progress: int = 0

    def note(self, frame: dict[str, Any]) -> str | None:
        """The progress message a frame of the run gives (None: none), its citations kept."""
        kind, data = frame.get("type"), frame.get("data") or {}
        if kind == "tool_call_started":
            return f"Calling {data.get('name')}…"
        if kind == "tool_call_succeeded":
            found = (data.get("data") or {}).get("citations") if isinstance(data.get("data"), dict) else None
            if isinstance(found, list):
                self.citations.extend(c for c in found if isinstance(c, dict))
            return f"{data.get('name')} answered."
        if kind == "tool_call_failed":
            return f"{data.get('name')} failed."
        if kind in ("content_token", "reasoning_token") and not self.writing:
            self.writing = True
            return "Writing the answer…"
        return None

    def structured(self, reply: str, status: str, **more: Any) -> dict[str, Any]:
        return {"reply": reply, "chat_id": str(self.chat_id), "run_id": str(self.run_id), "citations": self.citations,
                "status": status, **more}


def _ended(answer: _Answer, frame: dict[str, Any]) -> types.CallToolResult:
    """The tool result of the run's last frame (completed, failed, cancelled)."""
    kind, data = frame["type"], frame.get("data") or {}
    if kind == "run_completed":
        reply = data.get("reply", "")
        return types.CallToolResult(content=[types.TextContent(text=reply)],
                                    structured_content=answer.structured(reply, "completed"))
    if kind == "run_cancelled":
        return _error("The run was cancelled.")
    if data.get("reason") == "budget_exceeded":
        return _error(f"Over budget: {data.get('error') or 'the agent has spent its budget.'}")
    return _error(f"The run failed: {data.get('error') or data.get('reason') or 'no reason given'}.")


def _url_session_id(credential_key: str) -> str:
    """The ``Mcp-Session-Id`` given to a 2025-11-25 client that declared URL-mode elicitation at
    ``initialize``: ``credential_key`` (:attr:`tenants.resolution.Caller.credential_key`) signed
    with the site's ``SECRET_KEY`` (``django.core.signing``, salt :data:`SESSION_ID_SALT`); only
    visible ASCII, as the specification requires of a session id. No state is kept."""
    from django.core import signing

    return signing.dumps({"credential": credential_key, "url_elicitation": True}, salt=SESSION_ID_SALT)


def _declares_url_session(scope: dict[str, Any], credential_key: str) -> bool:
    """True when the request's ``Mcp-Session-Id`` is one of :func:`_url_session_id` for this
    credential; a missing, forged or another credential's id is False (never an error)."""
    from django.core import signing

    raw = next((value for name, value in scope.get("headers", []) if name.lower() == b"mcp-session-id"), None)
    if raw is None:
        return False
    try:
        data = signing.loads(raw.decode("ascii"), salt=SESSION_ID_SALT)
    except (signing.BadSignature, UnicodeDecodeError, ValueError):
        return False
    return isinstance(data, dict) and data.get("credential") == credential_key and data.get("url_elicitation") is True


def _initialize_declares_url(body: bytes) -> bool:
    """True for an ``initialize`` request whose capabilities declare ``elicitation.url``."""
    try:
        message = json.loads(body)
    except (ValueError, RecursionError):
        return False
    if not isinstance(message, dict) or message.get("method") != "initialize":
        return False
    params = message.get("params")
    capabilities = params.get("capabilities") if isinstance(params, dict) else None
    elicitation = capabilities.get("elicitation") if isinstance(capabilities, dict) else None
    return isinstance(elicitation, dict) and isinstance(elicitation.get("url"), dict)


def _wants_url_elicitation(ctx: ServerRequestContext[Any]) -> bool:
    """Whether the client declared URL-mode elicitation at a revision that defines it: in this
    request's ``_meta`` (2026-07-28) or at ``initialize``, as our session id says (2025-11-25)."""
    if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
        capabilities = ctx.session.client_capabilities
        elicitation = capabilities.elicitation if capabilities is not None else None
        return elicitation is not None and elicitation.url is not None
    return ctx.protocol_version in URL_ELICITATION_HANDSHAKE_VERSIONS and _url_session.get()


def _awaiting(answer: _Answer, frame: dict[str, Any], ctx: ServerRequestContext[Any],
              base_url: str) -> types.CallToolResult:
    """The run paused for a person: where to decide, as a URL elicitation (a client that declared
    URL mode, :func:`_wants_url_elicitation`) or a tool result."""
    reply, url = person_decision_note((frame.get("data") or {}).get("approvals", []), base_url=base_url,
                                      chat_id=answer.chat_id)
    if _wants_url_elicitation(ctx):
        # 2025-11-25 requires an elicitationId (2026-07-28 removed it).
        elicitation_id = None if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS else uuid.uuid4().hex
        raise UrlElicitationRequiredError(
            [types.ElicitRequestURLParams(message=reply, url=url, elicitation_id=elicitation_id)], message=reply)
    return types.CallToolResult(content=[types.TextContent(text=reply)],
                                structured_content=answer.structured(reply, "awaiting_approval", approval_url=url))


async def _progress(ctx: ServerRequestContext[Any], answer: _Answer, message: str) -> None:
    answer.progress += 1
    await ctx.session.report_progress(answer.progress, None, message)


async def _read(reader: SessionEventReader, answer: _Answer, ctx: ServerRequestContext[Any],
                base_url: str) -> types.CallToolResult:
    """The run's frames until it ends or pauses: progress for each step, then the result."""
    async for item in reader:
        if isinstance(item, Closed):
            return _error(f"The answer's stream ended: {item.reason.replace('_', ' ')}.")
        if not isinstance(item, Event):
            await _progress(ctx, answer, "Working…")
            continue
        frame = json.loads(item.text)
        if frame.get("run_id") != answer.run_id:
            continue
        if frame.get("type") in RUN_END_TYPES:
            return _ended(answer, frame)
        if frame.get("type") == "run_awaiting_approval":
            return _awaiting(answer, frame, ctx, base_url)
        note = answer.note(frame)
        if note:
            await _progress(ctx, answer, note)
    return _error("The answer ended early.")


async def _answer(ctx: ServerRequestContext[Any], request: mcp_http.McpRequest, session_id: int,
                  run_id: int) -> types.CallToolResult:
    """Read the run's answer; a cancelled call cancels the run."""
    caller = request.caller
    try:
        reader = await answer_reader_open(caller, session_id)
    except RunRefused as exc:
        await mcp_http.off_thread(_call_pool, _cancel, caller, run_id)
        return _error(exc.message)
    key = _call_key(caller, ctx.request_id)
    try:
        await mcp_http.off_thread(_call_pool, _remember, key, run_id)
        await reader.open()
        return await _read(reader, _Answer(run_id=run_id, chat_id=session_id), ctx, request.base_url)
    except asyncio.CancelledError:
        # 2026-07-28: closing the request's stream is the client's cancellation. Earlier
        # revisions cancel with notifications/cancelled alone; a client gone is no cancellation
        # there (the run goes on, its answer in the chat).
        if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
            await asyncio.shield(mcp_http.off_thread(_call_pool, _cancel, caller, run_id))
        raise
    finally:
        await asyncio.shield(_close(reader, key))


async def _close(reader: SessionEventReader, key: str) -> None:
    try:
        await reader.close()
    finally:
        await mcp_http.off_thread(_call_pool, _remember, key, None)


async def _on_list_tools(ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
                         ) -> types.ListToolsResult:
    request = _request.get()
    if request is None:  # the ASGI wrapper sets it before any message is read
        raise MCPError(code=types.INTERNAL_ERROR, message="No authenticated caller.")
    return types.ListToolsResult(tools=await mcp_http.off_thread(_call_pool, agent_tools, request.caller))


def _unknown_tool(name: str) -> MCPError:
    return MCPError(code=types.INVALID_PARAMS, message=f"Unknown tool: {name} (no agent of yours has that name).")


async def _on_call_tool(ctx: ServerRequestContext[Any], params: types.CallToolRequestParams) -> types.CallToolResult:
    request = _request.get()
    if request is None:
        raise MCPError(code=types.INTERNAL_ERROR, message="No authenticated caller.")
    if not TOOL_NAME.match(params.name) or not await mcp_http.off_thread(_call_pool, agent_usable, request.caller,
                                                                            params.name):
        raise _unknown_tool(params.name)
    ask = call_arguments(params.arguments or {})
    if isinstance(ask, str):
        return _error(ask)
    try:
        session_id, run_id = await mcp_http.off_thread(_call_pool, call_start, request.caller, params.name, ask)
    except RunRefused as exc:
        if exc.code == AGENT_NOT_FOUND and ask.version is None:
            raise _unknown_tool(params.name) from exc
        wait = f" Try again in {exc.retry_after} s." if exc.retry_after else ""
        return _error(f"{exc.message}{wait}")
    await _progress_started(ctx)
    return await _answer(ctx, request, session_id, run_id)


async def _progress_started(ctx: ServerRequestContext[Any]) -> None:
    await ctx.session.report_progress(0, None, "The run is queued.")


SERVER: Final[Server[Any]] = Server(
    SERVER_NAME, version="1.0", instructions=INSTRUCTIONS, on_list_tools=_on_list_tools, on_call_tool=_on_call_tool,
    get_tool_input_schema=lambda name: INPUT_SCHEMA if TOOL_NAME.match(name) else None,
)


async def application(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """The ASGI app for :data:`PATH` (HTTP only): the shared checks of
    :func:`agent_platform.mcp_http.serve`, then the MCP exchange (Streamable HTTP, stateless,
    answers on SSE so progress can come before them)."""
    await mcp_http.serve(scope, receive, send, path=PATH, handler=_exchange)


async def _body(receive: Any) -> bytes | None:
    """The request's body, or None when it is over the SDK's limit."""
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return b"".join(chunks)
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > DEFAULT_MAX_REQUEST_BODY_SIZE:
            return None
        chunks.append(chunk)
        if not message.get("more_body"):
            return b"".join(chunks)


def _cancelled_id(body: bytes) -> tuple[bool, Any]:
    """``(True, request id)`` for a ``notifications/cancelled`` body, else ``(False, None)``."""
    try:
        message = json.loads(body)
    except (ValueError, RecursionError):
        return False, None
    if not isinstance(message, dict) or message.get("method") != "notifications/cancelled" or "id" in message:
        return False, None
    params = message.get("params")
    request_id = params.get("requestId") if isinstance(params, dict) else None
    return isinstance(request_id, str | int) and not isinstance(request_id, bool), request_id


NOT_ACCEPTABLE: Final[bytes] = json.dumps({"jsonrpc": "2.0", "id": None, "error": {
    "code": types.INVALID_REQUEST,
    "message": "Not Acceptable: Client must accept both application/json and text/event-stream"}}).encode()
"""The answer to a request whose ``Accept`` lacks either (the answers come on SSE): what the SDK's
2025-11-25 transport answers, at both revisions (its 2026-07-28 one answers an empty 406)."""


async def _not_acceptable(send: Any) -> None:
    await send({"type": "http.response.start", "status": 406, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(NOT_ACCEPTABLE)).encode())]})
    await send({"type": "http.response.body", "body": NOT_ACCEPTABLE})


async def _exchange(request: mcp_http.McpRequest, scope: dict[str, Any], receive: Any) -> None:
    body = await _body(receive)
    if body is None:
        await mcp_http.refuse(request.send, 413, "Request body too large.", [])
        return
    is_cancel, request_id = _cancelled_id(body)
    if is_cancel:
        await mcp_http.off_thread(_call_pool, cancelled_notification, request.caller, request_id)
        await request.send({"type": "http.response.start", "status": 202, "headers": []})
        await request.send({"type": "http.response.body", "body": b""})
        return
    if not all(check_accept_headers(Request(scope))):
        await _not_acceptable(request.send)
        return
    replayed = False

    async def replay() -> dict[str, Any]:
        nonlocal replayed
        if not replayed:
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    send = request.send
    if _initialize_declares_url(body):
        send = mcp_http.with_headers(send, [("Mcp-Session-Id", _url_session_id(request.caller.credential_key))])
    token = _request.set(request)
    url_token = _url_session.set(_declares_url_session(scope, request.caller.credential_key))
    try:
        manager = StreamableHTTPSessionManager(SERVER, json_response=False, stateless=True)
        async with manager.run():
            await manager.handle_request(scope, replay, send)
    finally:
        _url_session.reset(url_token)
        _request.reset(token)


def handles(path: str) -> bool:
    """True for the paths :func:`application` answers (``/mcp/agents`` with or without a
    trailing slash)."""
    return mcp_http.handles(path, PATH)
