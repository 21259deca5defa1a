"""The ASGI app of ``/a2a/<slug>/``: each agent an A2A 1.0 server, on the a2a-sdk's Starlette routes.

Per agent (``<slug>``: the agent's slug in the caller's tenant; ``<slug>@<n>``: its version
``n``, as on the OpenAI-compatible API: new tasks there run that version, not the published one;
its card names the pinned URLs; the tasks are the agent's either way):

- ``GET /a2a/<slug>/.well-known/agent-card.json`` (and ``/.well-known/agent.json``, the older
  clients' path): the card (:mod:`.cards`, with ETag).
- ``POST /a2a/<slug>/``: the JSON-RPC binding (``SendMessage``, ``GetTask``…, and the 0.3
  methods ``message/send``… for older clients).
- ``/a2a/<slug>/rest/…``: the HTTP+JSON binding (``POST /message:send``, ``GET /tasks/<id>``…,
  and the 0.3 paths under ``/v1/``).

Authentication before the SDK sees anything: ``Authorization: Bearer <API token>`` (a token is
one membership: its tenant and user; :func:`tenants.resolution.caller_resolve`). A missing or
bad token is a 401 (``WWW-Authenticate: Bearer``) for every call; for the card too, unless the
agent is ``a2a_public`` (then the card is served without a token, found by its slug among the
public agents; two tenants' public agents of one slug make it ambiguous: 401, ask for a token).
With a token, ``<slug>`` is looked up in the token's tenant only: another tenant's agent is the
same 404 as a missing one. The SDK checks ``A2A-Version`` (1.0; none means 0.3, served by its
0.3 adapter) and answers every A2A error in the binding's shape; the platform's own refusals
(401, 404, 400 bad host, 429 throttled, with ``Retry-After``) are ``{"message", "extra"}`` like
the rest of the platform, with Django's security headers on every answer. Failed token checks
are counted per client address (``API_THROTTLE_RATES["a2a_auth.ip"]``, as the MCP servers'
``mcp_auth.ip``): over the budget, a 429 with ``Retry-After`` before the token is looked at.
A POST body over ``DATA_UPLOAD_MAX_MEMORY_SIZE`` is a 413 before the SDK reads it.
"""

from __future__ import annotations

import io
import json
import logging
import math
import re
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

from a2a.server.context import ServerCallContext
from a2a.server.request_handlers.response_helpers import build_error_response
from a2a.server.routes import (
    DefaultServerCallContextBuilder,
    create_agent_card_routes,
    create_jsonrpc_routes,
    create_rest_routes,
)
from a2a.types.a2a_pb2 import AgentCard, TaskState
from a2a.utils.error_handlers import build_rest_error_payload
from a2a.utils.errors import InvalidParamsError
from channels.db import database_sync_to_async
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Mount

from agents.models import AgentInstance
from agents.versions import split_pinned_slug
from sessions.api.a2a.cards import PATH_PREFIX, REST_SUFFIX, agent_card
from sessions.api.a2a.handler import PlatformRequestHandler
from sessions.api.a2a.tasks import CALLER_KEY, REFUSAL_KEY, A2ACaller, RefusalBox
from tenants.scoping import system_scope, tenant_scope

logger = logging.getLogger(__name__)

CARD_PATHS = frozenset({".well-known/agent-card.json", ".well-known/agent.json"})
"""The card's paths under the agent's prefix (1.0 and 0.3's; the 0.2 ``agent.json``)."""
SCOPE_KEY = "platform_a2a_caller"
"""Where the ASGI scope carries the :class:`.tasks.A2ACaller` to the SDK's context builder."""
_SLUG = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}(@[1-9][0-9]{0,8})?")
WWW_AUTHENTICATE = ("WWW-Authenticate", 'Bearer realm="agent-platform"')
AUTH_THROTTLE_SCOPE = "a2a_auth"
"""Failed token checks per client address: ``API_THROTTLE_RATES["a2a_auth.ip"]``."""


@dataclass(frozen=True, slots=True)
class _CardFor:
    """What the card of this request describes."""

    base_url: str
    slug: str
    name: str
    description: str
    tenant_name: str


_card_for: ContextVar[_CardFor | None] = ContextVar("a2a_card_for", default=None)


async def _current_card(_static: AgentCard) -> AgentCard:
    """The card of the agent this request names (the SDK's ``card_modifier``)."""
    found = _card_for.get()
    if found is None:  # the app sets it before every request it passes on
        raise HTTPException(404, "No agent.")
    return agent_card(base_url=found.base_url, slug=found.slug, name=found.name, description=found.description,
                      tenant_name=found.tenant_name)


class _ContextBuilder(DefaultServerCallContextBuilder):
    """The SDK's call context plus the caller the app authenticated (``state[CALLER_KEY]``)."""

    def build(self, request: Request) -> ServerCallContext:
        context = super().build(request)
        context.state[CALLER_KEY] = request.scope.get(SCOPE_KEY)
        context.state[REFUSAL_KEY] = request.scope.get(REFUSAL_KEY)
        return context


async def _http_error(request: Request, exc: Exception) -> Response:
    """An HTTPException raised under the SDK's routes (a card of no agent: 404) as ``{message, extra}``."""
    assert isinstance(exc, HTTPException)
    return JSONResponse({"message": exc.detail, "extra": {}}, status_code=exc.status_code, headers=exc.headers)


def _build() -> Starlette:
    handler = PlatformRequestHandler()
    builder = _ContextBuilder()
    placeholder = agent_card(base_url="http://localhost", slug="agent", name="agent", description="An agent.",
                             tenant_name="tenant")
    routes = [
        *[route for path in sorted(CARD_PATHS)
          for route in create_agent_card_routes(placeholder, card_modifier=_current_card, card_url=f"/{path}")],
        *create_jsonrpc_routes(handler, rpc_url="/", context_builder=builder, enable_v0_3_compat=True),
        Mount(f"/{REST_SUFFIX}", routes=create_rest_routes(handler, context_builder=builder, enable_v0_3_compat=True)),
    ]
    return Starlette(routes=routes, exception_handlers={HTTPException: _http_error})


_sdk_app: Starlette | None = None


def _sdk() -> Starlette:
    global _sdk_app
    if _sdk_app is None:
        _sdk_app = _build()
    return _sdk_app


def handles(path: str) -> bool:
    """True for the paths :func:`application` answers (everything under ``/a2a/``)."""
    return path.startswith(PATH_PREFIX)


def _split(path: str) -> tuple[str, str] | None:
    """``(slug, rest)`` of ``/a2a/<slug>/<rest>`` (``/a2a/<slug>`` too), or None."""
    slug, _, rest = path[len(PATH_PREFIX):].partition("/")
    return (slug, rest) if _SLUG.fullmatch(slug) else None


def _bearer(scope: dict[str, Any]) -> str | None:
    """The bearer token of the request; None without an Authorization header, "" for a malformed one."""
    for name, value in scope.get("headers", []):
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            return token.strip() if scheme.lower() == "bearer" else ""
    return None


@dataclass(frozen=True, slots=True)
class _Login:
    """What :func:`_caller` decided: the caller (None: a bad token, or ``retry_after`` set) and
    the card of its agent (None: the tenant has no active agent of the slug)."""

    caller: A2ACaller | None
    card: _CardFor | None = None
    retry_after: float | None = None
    """Seconds the client address must wait (too many failed token checks); the token was not looked at."""


@database_sync_to_async
def _caller(raw_token: str, slug: str, base_url: str, address: str) -> _Login:
    """Who ``raw_token`` is and the card of agent ``slug`` of its tenant, for a request from
    client ``address``: refused unseen when the address is over its failed-token budget
    (``API_THROTTLE_RATES["a2a_auth.ip"]``, as the MCP servers' ``mcp_auth.ip``:
    :func:`tenants.throttling.failures_wait`); a bad token is counted as a failure."""
    from tenants.resolution import caller_resolve
    from tenants.throttling import failure_record, failures_wait

    wait = failures_wait(scope=AUTH_THROTTLE_SCOPE, address=address)
    if wait is not None:
        return _Login(caller=None, retry_after=wait)
    resolved = caller_resolve(raw_token=raw_token)
    if resolved is None or resolved.membership is None or resolved.token is None:
        failure_record(scope=AUTH_THROTTLE_SCOPE, address=address)
        return _Login(caller=None)
    membership = resolved.membership
    base_slug, number = split_pinned_slug(slug)
    with tenant_scope(membership.tenant_id):
        agent = AgentInstance.objects.select_related("tenant").filter(slug=base_slug, is_active=True).first()
        if agent is not None and number is not None and not agent.versions.filter(number=number).exists():
            agent = None  # no such version: the same 404 as no such agent
    caller = A2ACaller(tenant_id=membership.tenant_id, user_id=resolved.user.pk, membership_id=membership.pk,
                       token_id=resolved.token.pk, agent_id=agent.pk if agent else 0, agent_slug=slug,
                       base_url=base_url, version=number)
    if agent is None:
        return _Login(caller=caller)
    return _Login(caller=caller, card=_CardFor(base_url=base_url, slug=slug, name=agent.name,
                                               description=agent.description, tenant_name=agent.tenant.name))


@database_sync_to_async
def _public_card(slug: str, base_url: str) -> _CardFor | None:
    """The card of the one active public agent called ``slug`` (None: none, or several; with
    ``@<n>``: also when it has no version ``n``)."""
    base_slug, number = split_pinned_slug(slug)
    with system_scope():  # tenant-bypass: public cards are looked up by slug across tenants, and only they
        agents = list(AgentInstance.all_tenants.select_related("tenant")
                      .filter(slug=base_slug, is_active=True, a2a_public=True)[:2])
        if len(agents) != 1 or (number is not None and not agents[0].versions.filter(number=number).exists()):
            return None
    agent = agents[0]
    return _CardFor(base_url=base_url, slug=slug, name=agent.name, description=agent.description,
                    tenant_name=agent.tenant.name)


def _encoded(headers: list[tuple[str, str]]) -> list[tuple[bytes, bytes]]:
    return [(name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in headers]


async def _refuse(send: Any, status: int, message: str, headers: list[tuple[str, str]]) -> None:
    body = json.dumps({"message": message, "extra": {}}).encode()
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *_encoded(headers)]})
    await send({"type": "http.response.body", "body": body})


def _answering(send: Any, headers: list[tuple[str, str]], box: RefusalBox) -> Any:
    """``send`` for the SDK's answer: ``headers`` added to the response's start (those it does
    not set itself); a refusal the handler recorded (:class:`.tasks.PlatformRefusal`) answered
    instead of the SDK's rendering of it (an internal error), as its status with ``Retry-After``."""
    added = _encoded(headers)
    replaced = False

    async def sending(message: dict[str, Any]) -> None:
        nonlocal replaced
        if replaced:
            return
        if message["type"] == "http.response.start" and box.refusal is not None:
            replaced = True
            refusal = box.refusal
            await _refuse(send, refusal.status, refusal.message, [*headers, ("Retry-After", str(refusal.retry_after))])
            return
        if message["type"] == "http.response.start":
            present = {name.lower() for name, _ in message.get("headers", [])}
            message = {**message, "headers": [*message.get("headers", []),
                                              *[(n, v) for n, v in added if n not in present]]}
        await send(message)

    return sending


async def _resolve(scope: dict[str, Any], slug: str, rest: str, base_url: str, address: str,
                   ) -> tuple[A2ACaller | None, _CardFor | None, tuple[int, str, list[tuple[str, str]]] | None]:
    """Who calls and which agent: ``(caller, card, None)``, or ``(…, (status, message,
    headers))`` to refuse (401 with ``WWW-Authenticate``, 429 with ``Retry-After``, 404)."""
    raw = _bearer(scope)
    if raw is None and rest in CARD_PATHS and scope.get("method") in ("GET", "HEAD"):
        card = await _public_card(slug, base_url)
        if card is not None:
            return None, card, None
    if not raw:
        return None, None, (401, "Send an API token of the agent's tenant as 'Authorization: Bearer <token>'.",
                            [WWW_AUTHENTICATE])
    login = await _caller(raw, slug, base_url, address)
    if login.retry_after is not None:
        seconds = max(1, math.ceil(login.retry_after))
        return None, None, (429, f"Too many failed logins from this address: try again in {seconds} s.",
                            [("Retry-After", str(seconds))])
    if login.caller is None:
        return None, None, (401, "Invalid or revoked API token.", [WWW_AUTHENTICATE])
    if login.card is None:
        return login.caller, None, (404, f"No agent {slug!r}.", [])
    return login.caller, login.card, None


def _bad_list_status(status: Any) -> str | None:
    """Why ``status`` is no ``TaskState`` for ``ListTasks`` (None: it is one, or absent).

    The SDK parses requests with ``ignore_unknown_fields``, which turns an unknown enum value into
    0 (no filter): a typo would list every task. The A2A TCK (protocol/test_tasks_list_method.py::
    test_invalid_status_error) requires -32602 for it, so the raw value is checked here."""
    if status is None:
        return None
    names = TaskState.keys()
    if (isinstance(status, str) and status in names) or (type(status) is int and status in TaskState.values()):
        return None
    return f"status: {status!r} is not a task state ({', '.join(n for n in names if n != 'TASK_STATE_UNSPECIFIED')})."


async def _body(receive: Any, limit: int) -> tuple[bytes | None, Any]:
    """The request's whole body (None: over ``limit`` bytes, reading stopped there), and a
    ``receive`` that replays it, then passes on (a disconnect)."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return b"".join(chunks), receive
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None, receive
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    body, replayed = b"".join(chunks), False

    async def replay() -> dict[str, Any]:
        nonlocal replayed
        if replayed:
            return await receive()
        replayed = True
        return {"type": "http.request", "body": body, "more_body": False}

    return body, replay


def _rest_list_refusal(scope: dict[str, Any]) -> tuple[int, dict[str, Any]] | None:
    """HTTP+JSON ``GET …/tasks?status=<not a state>``: 400 ``INVALID_ARGUMENT`` (the SDK's shape)."""
    statuses = parse_qs(scope.get("query_string", b"").decode("latin-1")).get("status", [])
    why = next((w for w in map(_bad_list_status, statuses) if w), None)
    return (400, build_rest_error_payload(InvalidParamsError(message=why))) if why else None


def _rpc_list_refusal(body: bytes) -> tuple[int, dict[str, Any]] | None:
    """JSON-RPC ``ListTasks`` with ``params.status`` not a state: error -32602 (the SDK's shape)."""
    try:
        request = json.loads(body)
    except (ValueError, RecursionError):
        return None  # the SDK answers -32700
    if not (isinstance(request, dict) and request.get("method") == "ListTasks"
            and isinstance(request.get("params"), dict)):
        return None
    why = _bad_list_status(request["params"].get("status"))
    if why is None:
        return None
    request_id = request.get("id")
    request_id = request_id if isinstance(request_id, (str, int)) else None
    return 200, build_error_response(request_id, InvalidParamsError(message=why))


async def _checked(scope: dict[str, Any], rest: str, receive: Any) -> tuple[tuple[int, dict] | None, Any]:
    """Checks before the SDK: ``(refusal, receive)``, the refusal ``(status, body)``:

    - a POST body over ``DATA_UPLOAD_MAX_MEMORY_SIZE`` (Django's limit for the platform's other
      APIs; the SDK reads a body whole, with no limit of its own): 413 ``{message, extra}``;
    - what the SDK's parsing cannot see (:func:`_bad_list_status`): the binding's invalid-params
      answer, built by the SDK's own helpers (JSON-RPC: 200 with error -32602; HTTP+JSON: 400
      ``INVALID_ARGUMENT``).

    ``receive`` replays a POST body read for the checks."""
    from django.conf import settings

    method = scope.get("method")
    if rest == f"{REST_SUFFIX}/tasks" and method == "GET":
        return _rest_list_refusal(scope), receive
    if method != "POST":
        return None, receive
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE or 2_621_440
    body, receive = await _body(receive, limit)
    if body is None:
        return (413, {"message": f"The request body is larger than {limit} bytes.", "extra": {}}), receive
    return (_rpc_list_refusal(body) if rest == "" else None), receive


async def _invalid_params(send: Any, status: int, payload: dict[str, Any], headers: list[tuple[str, str]]) -> None:
    """The refusal of :func:`_checked` (``payload`` as JSON), with the platform's headers."""
    body = json.dumps(payload).encode()
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *_encoded(headers)]})
    await send({"type": "http.response.body", "body": body})


async def application(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """The ASGI app for ``/a2a/…`` (HTTP): 400 for a ``Host`` outside ``ALLOWED_HOSTS``, 404
    for a path that names no agent, 401/404 as the module docstring says, else the a2a-sdk's
    routes for the agent, with Django's security headers on every answer."""
    from django.core.exceptions import DisallowedHost
    from django.core.handlers.asgi import ASGIRequest

    from agent_platform.security_headers import security_headers_for

    request = ASGIRequest(scope, io.BytesIO())
    headers = security_headers_for(request)
    try:
        base_url = request.build_absolute_uri("/").rstrip("/")
    except DisallowedHost as exc:
        logging.getLogger("django.security.DisallowedHost").warning("%s", exc)  # as Django logs it
        await _refuse(send, 400, "Invalid Host header.", headers)
        return
    split = _split(scope.get("path", ""))
    if split is None:
        await _refuse(send, 404, "No agent here: A2A agents are at /a2a/<slug>/.", headers)
        return
    slug, rest = split
    caller, card, refusal = await _resolve(scope, slug, rest, base_url, request.META.get("REMOTE_ADDR") or "")
    if refusal is not None:
        status, message, own_headers = refusal
        await _refuse(send, status, message, [*headers, *own_headers])
        return
    invalid, receive = await _checked(scope, rest, receive)
    if invalid is not None:
        await _invalid_params(send, *invalid, headers)
        return
    prefix = f"{PATH_PREFIX}{slug}"
    path = scope["path"] if scope["path"] != prefix else f"{prefix}/"
    box = RefusalBox()
    inner = {**scope, "path": path, "root_path": prefix, SCOPE_KEY: caller, REFUSAL_KEY: box}
    token = _card_for.set(card)
    try:
        await _sdk()(inner, receive, _answering(send, headers, box))
    finally:
        _card_for.reset(token)
