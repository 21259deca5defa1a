"""Adapter for the Anthropic Messages API (``POST /v1/messages``, streamed).

One streaming call per :func:`stream_chat`, over a pooled ``anthropic.AsyncAnthropic`` client
with SDK retries off (the router is the only retry loop). It offers the same contract as
:func:`llm.providers.openai_compat.stream_chat`, so a route may mix both and a fallback may
cross providers in the middle of a conversation: the canonical (OpenAI chat shaped) history
is translated on every call, never stored in Anthropic's format.

Translation of the canonical history (:func:`build_request`):

* ``system`` messages (wherever they are) → the top-level ``system`` string, joined by a
  blank line, in order.
* ``user`` text → ``text`` blocks; a user message's images → ``image`` blocks
  (``source: {type: base64, media_type, data}``) before its text, as Anthropic's vision docs
  advise, when the entry ``supports_images`` (else the text alone, with its
  ``[image: artifact:N …]`` reference); assistant text → ``text`` blocks; assistant tool calls →
  ``tool_use`` blocks (``input`` is the parsed JSON arguments; text that is not a JSON object
  → ``{"_raw": "<text>"}``).
* ``tool`` results → ``tool_result`` blocks (``tool_use_id``, ``content`` text) in a ``user``
  message. Consecutive messages that end up with the same role are merged into one (so
  parallel tool results, and a user message right after them, form ONE user message, tool
  results first, as the API requires). Empty text is dropped (the API rejects empty text
  blocks) and so are messages left without blocks.
* Tool-call ids that do not match Anthropic's ``^[a-zA-Z0-9_-]+$`` are rewritten by
  :func:`tool_use_id_for` (deterministic, so a ``tool_use`` and its ``tool_result`` agree).
* ``tools`` → ``{name, description, input_schema}``. When no tools are offered but the history
  contains tool calls or results (the API rejects that: "Requests which include tool_use or
  tool_result blocks must define tools"), the names used in the history are declared as stub
  tools and ``tool_choice`` is ``{"type": "none"}``.
* The entry's ``tool_calls`` mode is ignored: the Messages API always has native tool use.

Stream events → :class:`~llm.types.TextDelta` (``text_delta``),
:class:`~llm.types.ReasoningDelta` (``thinking_delta``; never fed back as answer text: the
canonical history has no place for it), ``tool_use`` blocks reassembled from
``input_json_delta`` fragments, ``message_delta.stop_reason`` → ``finish_reason`` (see
:data:`FINISH_REASONS`), usage from ``message_start``/``message_delta``.

Errors: every failure leaves as :class:`llm.errors.ModelCallError`, classified by
:func:`classify_anthropic_error` (HTTP errors, ``error`` events inside an open stream,
timeouts, transport failures); ``asyncio.CancelledError`` propagates untouched and the HTTP
response is closed on the way out.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

import anthropic
import httpx
import httpx2

from llm.errors import ErrorClass, ModelCallError, parse_retry_after
from llm.model import DEFAULT_SETTINGS, FirstTokenHook, ModelSettings, tool_choice_resolve
from llm.providers._clients import LoopClientCache, checked_httpx_transport
from llm.records import BodyCapture
from llm.tokens import usage_or_estimate
from llm.types import ChatMessage, Completion, ReasoningDelta, TextDelta, ToolCallRequest, ToolSpec, Usage

if TYPE_CHECKING:
    from llm.config import RouteEntryConfig

MAX_CLIENTS_PER_LOOP: Final[int] = 64
"""Clients kept per event loop; the least recently used one is dropped beyond that."""

NO_API_KEY: Final[str] = "no-key"
"""Sent when an entry has no API key (local gateways), so the SDK never falls back to the
``ANTHROPIC_API_KEY`` environment variable or a credentials profile and leaks it to another
base URL."""

DEFAULT_MAX_OUTPUT_TOKENS: Final[int] = 4096
"""``max_tokens`` sent when neither the entry nor the caller caps the output (the Messages
API requires the parameter)."""

FINISH_REASONS: Final[Mapping[str, str]] = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "tool_use": "tool_calls",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "refusal": "content_filter",
}
"""Anthropic ``stop_reason`` → canonical (OpenAI) ``finish_reason``; others pass through
unchanged (e.g. ``pause_turn``)."""

_TOOL_ID_RE: Final[re.Pattern[str]] = re.compile(r"^[a-zA-Z0-9_-]+$")
_TOOL_ID_BAD_CHARS: Final[re.Pattern[str]] = re.compile(r"[^a-zA-Z0-9_-]+")
_MAX_MESSAGE_CHARS: Final[int] = 500

_QUOTA_CODES: Final[frozenset[str]] = frozenset(
    {
        "enforced_spend_limit_reached",
        "contract_spend_limit_reached",
        "linked_organization_spend_limit_reached",
        "linked_organization_billing_unavailable",
    }
)
"""``error.details.error_code`` values that mean "no more spending", whatever the status."""

_QUOTA_MARKERS: Final[tuple[str, ...]] = (
    "credit balance is too low",
    "api usage limits",
    "spend limit",
    "billing",
)
_CONTEXT_WINDOW_MARKERS: Final[tuple[str, ...]] = (
    "prompt is too long",
    "context window",
    "context length",
    "context limit",
    "input is too long",
    "too many input tokens",
)
_CONTENT_POLICY_MARKERS: Final[tuple[str, ...]] = (
    "content filtering policy",
    "content policy",
    "usage policy",
    "usage policies",
)
_ERROR_TYPES: Final[Mapping[str, ErrorClass]] = {
    "rate_limit_error": "rate_limit",
    "overloaded_error": "overloaded",
    "api_error": "server",
    "timeout_error": "timeout",
    "authentication_error": "auth",
    "permission_error": "auth",
    "not_found_error": "not_found",
    "request_too_large": "context_window",
    "billing_error": "quota_exhausted",
    "invalid_request_error": "bad_request",
}
"""Anthropic ``error.type`` → error class, after the quota/context/policy markers."""

_WORDING_STATUSES: Final[frozenset[int | None]] = frozenset({None, 400, 403, 422, 429})
"""Statuses whose error message is matched against the quota/context/policy wording (None:
an ``error`` event inside a stream)."""

_RETRY_AFTER_CLASSES: Final[frozenset[str]] = frozenset({"rate_limit", "overloaded", "server", "quota_exhausted"})


# --- Clients (one pool per event loop) -------------------------------------------------------

def api_root_url(base_url: str) -> str:
    """The provider root the SDK expects as ``base_url``.

    The SDK appends ``/v1/messages`` to its ``base_url``, so an entry's ``base_url`` is the
    provider root (``https://api.anthropic.com``, ``http://127.0.0.1:PORT``). A trailing
    ``/v1`` (the OpenAI habit) and trailing slashes are stripped, so ``…/v1`` works too.
    """
    url = base_url.rstrip("/")
    if url.endswith("/v1"):
        url = url[: -len("/v1")]
    return url


def client_new(key: tuple[str, str, float, float]) -> anthropic.AsyncAnthropic:
    """A new ``anthropic.AsyncAnthropic`` for ``(base_url, api_key, connect_timeout_s, read_timeout_s)``.

    No retries; every connect checked against the outbound address rules.
    """
    base_url, api_key, connect_timeout, read_timeout = key
    return anthropic.AsyncAnthropic(
        # An explicit credential: the SDK then reads no credential environment variable or
        # profile (its documented resolution order).
        api_key=api_key or NO_API_KEY,
        base_url=base_url,
        max_retries=0,
        # The 2.x SDK runs on httpx2 and rejects ``httpx`` objects: this is ``httpx2.Timeout``.
        timeout=httpx2.Timeout(read_timeout, connect=connect_timeout),
        # The SDK's defaults (limits, redirects, keep-alive) without the finaliser of its
        # internal wrapper, which would close the pool on whatever loop runs at collection.
        # Every connect checked against the outbound address rules (capabilities.netsafe).
        http_client=anthropic.DefaultAsyncHttpxClient(transport=checked_httpx_transport()),
    )


_clients: LoopClientCache[anthropic.AsyncAnthropic] = LoopClientCache(client_new, max_per_loop=MAX_CLIENTS_PER_LOOP)


def _client_for(entry: RouteEntryConfig) -> anthropic.AsyncAnthropic:
    """The pooled client for ``entry``'s (root URL, api_key, timeouts) in the running loop."""
    return _clients.get((
        api_root_url(entry.base_url), entry.api_key,
        float(entry.connect_timeout_seconds), float(entry.read_timeout_seconds),
    ))


async def aclose_clients() -> None:
    """Close every pooled Anthropic client of the running event loop (worker shutdown, test
    teardown). Streams still open on them fail with a network error."""
    await _clients.aclose()


# --- Request translation -------------------------------------------------------------------


def tool_use_id_for(call_id: str) -> str:
    """The Anthropic ``tool_use`` id for a canonical tool-call id.

    Ids matching ``^[a-zA-Z0-9_-]+$`` (OpenAI ``call_…``, Anthropic ``toolu_…``, our minted
    ``call_<hex>``) are kept. Others (``functions.get_time:0``, ids with spaces, ``""``) become
    ``<id with invalid runs replaced by "_", at most 40 chars>_<10 hex of sha256(id)>``: pure
    and deterministic, so the ``tool_use`` and its ``tool_result`` always agree, and distinct
    ids stay distinct.
    """
    if _TOOL_ID_RE.match(call_id):
        return call_id
    stem = _TOOL_ID_BAD_CHARS.sub("_", call_id).strip("_")[:40] or "call"
    return f"{stem}_{hashlib.sha256(call_id.encode()).hexdigest()[:10]}"


def _tool_input(arguments: str) -> dict[str, Any]:
    """``tool_use.input`` from the JSON argument text: a JSON object as is, ``{}`` for blank
    text, ``{"_raw": text}`` for anything else (invalid JSON, arrays, scalars)."""
    if not arguments.strip():
        return {}
    try:
        value = json.loads(arguments)
    except ValueError:
        return {"_raw": arguments}
    return value if isinstance(value, dict) else {"_raw": arguments}


def _blocks_of(message: ChatMessage, *, with_images: bool = False) -> tuple[str, list[dict[str, Any]]]:
    """``(anthropic_role, content_blocks)`` of one non-system canonical message; a user
    message's images first (``with_images``), then its text."""
    if message.role == "tool":
        block: dict[str, Any] = {"type": "tool_result", "tool_use_id": tool_use_id_for(message.tool_call_id or "")}
        if message.content:
            block["content"] = message.content
        return "user", [block]
    blocks: list[dict[str, Any]] = []
    if with_images and message.role == "user":
        blocks.extend(
            {"type": "image", "source": {"type": "base64", "media_type": image.mime_type, "data": image.data}}
            for image in message.images
        )
    if message.content:
        blocks.append({"type": "text", "text": message.content})
    if message.role == "assistant":
        for call in message.tool_calls:
            blocks.append(
                {
                    "type": "tool_use",
                    "id": tool_use_id_for(call.id),
                    "name": call.name,
                    "input": _tool_input(call.arguments),
                }
            )
        return "assistant", blocks
    return "user", blocks


def translate_messages(
    messages: Sequence[ChatMessage], *, with_images: bool = False
) -> tuple[str, list[dict[str, Any]]]:
    """The canonical history as Messages API ``(system, messages)``.

    Args:
        messages: Canonical (OpenAI chat shaped) history.
        with_images: Send user messages' images as ``image`` blocks (an entry with
            ``supports_images``); False: their text alone.

    Returns:
        ``(system, messages)``: the system prompts joined by ``"\\n\\n"`` (``""`` when none),
        and the ``[{"role": "user"|"assistant", "content": [block, …]}, …]`` list with
        consecutive same-role messages merged (``tool_result`` blocks first in a user
        message). Pure; see the module docstring for the rules.
    """
    system_parts: list[str] = []
    out: list[dict[str, Any]] = []
    for message in messages:
        if message.role == "system":
            if message.content:
                system_parts.append(message.content)
            continue
        role, blocks = _blocks_of(message, with_images=with_images)
        if not blocks:
            continue
        if out and out[-1]["role"] == role:
            out[-1]["content"].extend(blocks)
        else:
            out.append({"role": role, "content": blocks})
    for message in out:
        if message["role"] == "user":
            # Tool results must open the user message that answers a tool_use (stable order).
            message["content"].sort(key=lambda b: b["type"] != "tool_result")
    return "\n\n".join(system_parts), out


def _tool_param(tool: ToolSpec) -> dict[str, Any]:
    schema = dict(tool.parameters)
    schema.setdefault("type", "object")
    return {"name": tool.name, "description": tool.description, "input_schema": schema}


def _stub_tools(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Declarations for the tool names used in the history, for requests offering no tools."""
    names: dict[str, None] = {}
    has_results = False
    for message in messages:
        for block in message["content"]:
            if block["type"] == "tool_use":
                names.setdefault(block["name"], None)
            elif block["type"] == "tool_result":
                has_results = True
    if not names and not has_results:
        return []
    return [
        {
            "name": name,
            "description": "Used earlier in this conversation; not available now.",
            "input_schema": {"type": "object"},
        }
        for name in names
    ] or [
        {
            "name": "unavailable_tool",
            "description": "Not available in this conversation.",
            "input_schema": {"type": "object"},
        }
    ]


def output_limit(entry: RouteEntryConfig, max_output_tokens: int | None) -> int:
    """``max_tokens`` to send: the smaller of the entry's and the caller's positive caps,
    else :data:`DEFAULT_MAX_OUTPUT_TOKENS` (the API requires the parameter)."""
    caps = [c for c in (entry.max_output_tokens, max_output_tokens) if c is not None and c > 0]
    return min(caps) if caps else DEFAULT_MAX_OUTPUT_TOKENS


def build_request(
    entry: RouteEntryConfig,
    messages: Sequence[ChatMessage],
    tools: Sequence[ToolSpec],
    *,
    max_output_tokens: int | None = None,
    tool_choice: str = "auto",
) -> dict[str, Any]:
    """The ``messages.create`` keyword arguments (= the JSON body) for one streaming call.

    Args:
        entry: The route entry (model, output limit, image input).
        messages: Canonical history (user messages' images sent when ``entry.supports_images``).
        tools: Offered tools; sent as ``tools`` when non-empty.
        max_output_tokens: Caller's cap; the entry's ``max_output_tokens`` still applies.
        tool_choice: A :attr:`~llm.model.ModelSettings.tool_choice`, sent as the Messages
            API's ``tool_choice``: ``{"type": "any"}`` for ``"required"``, ``{"type": "tool",
            "name": …}`` for a tool's name, ``{"type": "none"}`` for ``"none"``; nothing for
            ``"auto"`` (the API's default).

    Returns:
        ``{"model", "max_tokens", "messages", "stream": True}`` plus ``system`` (when there
        are system prompts) and ``tools`` (and ``tool_choice``: the caller's, or ``none`` for
        stub tools).

    Raises:
        ModelCallError: ``bad_request`` for a ``tool_choice`` the offered tools cannot meet
            (:func:`~llm.model.tool_choice_resolve`).
    """
    choice = tool_choice_resolve(tool_choice, tools)
    system, translated = translate_messages(messages, with_images=entry.supports_images)
    params: dict[str, Any] = {
        "model": entry.model,
        "max_tokens": output_limit(entry, max_output_tokens),
        "messages": translated,
        "stream": True,
    }
    if system:
        params["system"] = system
    if entry.temperature is not None:
        params["temperature"] = min(entry.temperature, 1.0)  # the Messages API takes 0–1
    if tools:
        params["tools"] = [_tool_param(t) for t in tools]
        if choice != "auto":
            params["tool_choice"] = ({"type": "any"} if choice == "required" else {"type": "none"} if choice == "none"
                                     else {"type": "tool", "name": choice.name})
    else:
        stubs = _stub_tools(translated)
        if stubs:
            params["tools"] = stubs
            params["tool_choice"] = {"type": "none"}
    return params


# --- Error classification ------------------------------------------------------------------


def _truncate(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _MAX_MESSAGE_CHARS else text[: _MAX_MESSAGE_CHARS - 1] + "…"


def _error_fields(body: object) -> tuple[str, str, str]:
    """``(error.type, error.message, error.details.error_code)`` of an Anthropic error body
    (``{"type": "error", "error": {...}}``), ``""`` for what is missing."""
    if not isinstance(body, Mapping):
        return "", body if isinstance(body, str) else "", ""
    error = body.get("error")
    if not isinstance(error, Mapping):
        message = body.get("message")
        return "", message if isinstance(message, str) else "", ""
    kind = error.get("type")
    message = error.get("message")
    details = error.get("details")
    code = details.get("error_code") if isinstance(details, Mapping) else None
    return (
        kind if isinstance(kind, str) else "",
        message if isinstance(message, str) else "",
        code if isinstance(code, str) else "",
    )


_STATUS_CLASSES: Final[Mapping[int, ErrorClass]] = {
    429: "rate_limit", 529: "overloaded", 408: "timeout", 504: "timeout",
    401: "auth", 403: "auth", 404: "not_found", 400: "bad_request", 422: "bad_request",
}
"""HTTP statuses with a class of their own (other 5xx: ``server``; anything else: ``other``)."""


def _class_of(status: int | None, kind: str, message: str, code: str) -> ErrorClass:
    """The class of an error response or event: its wording and ``error_code`` first
    (:func:`_class_from_wording`), then ``error.type``, then the HTTP status."""
    # Wording is only trusted on the statuses that carry it (and inside a stream), never on
    # e.g. a gateway's 404/5xx HTML page.
    lowered = message.lower() if status in _WORDING_STATUSES else ""
    by_wording = _class_from_wording(status, kind, lowered, code)
    if by_wording is not None:
        return by_wording
    if kind in _ERROR_TYPES:
        return _ERROR_TYPES[kind]
    if status is None:
        return "other"
    by_status = _STATUS_CLASSES.get(status)
    if by_status is not None:
        return by_status
    return "server" if status >= 500 else "other"


def _class_from_wording(status: int | None, kind: str, lowered: str, code: str) -> ErrorClass | None:
    """``quota_exhausted``, ``context_window`` or ``content_policy`` when the status (402, 413),
    ``billing_error``, the ``error_code`` or the lower-cased message (``""`` when not trusted)
    says so; else None."""
    if status == 402 or kind == "billing_error" or code in _QUOTA_CODES:
        return "quota_exhausted"
    if kind in ("", "invalid_request_error", "rate_limit_error", "permission_error") and any(
        marker in lowered for marker in _QUOTA_MARKERS
    ):
        return "quota_exhausted"
    if status == 413 or (
        kind in ("", "invalid_request_error") and any(marker in lowered for marker in _CONTEXT_WINDOW_MARKERS)
    ):
        return "context_window"
    if kind in ("", "invalid_request_error", "permission_error") and any(
        marker in lowered for marker in _CONTENT_POLICY_MARKERS
    ):
        return "content_policy"
    return None


def classify_anthropic_error(exc: BaseException) -> ModelCallError:
    """Map an exception raised while calling the Messages API to a :class:`ModelCallError`.

    Pure: looks only at the exception's type, ``status_code``, response headers and body
    (``{"type": "error", "error": {"type", "message", "details": {"error_code"}}}``).

    Rules, first match wins:

    * ``APITimeoutError``, ``TimeoutError``, httpx/httpx2 timeouts → ``timeout``;
      ``APIConnectionError`` and transport errors → ``network``.
    * HTTP 402, ``billing_error``, spend-limit ``error_code``\\ s, "credit balance is too
      low" / "API usage limits" / "spend limit" → ``quota_exhausted``.
    * HTTP 413 or "prompt is too long" (and other context-window wording) → ``context_window``.
    * "content filtering policy" / "usage policy" → ``content_policy``.
    * ``error.type``: ``rate_limit_error`` → ``rate_limit``, ``overloaded_error`` →
      ``overloaded``, ``api_error`` → ``server``, ``timeout_error`` → ``timeout``,
      ``authentication_error``/``permission_error`` → ``auth``, ``not_found_error`` →
      ``not_found``, ``invalid_request_error`` → ``bad_request``.
    * Status: 429 → ``rate_limit``, 529 → ``overloaded``, 408/504 → ``timeout``, other 5xx →
      ``server``, 401/403 → ``auth``, 404 → ``not_found``, 400/422 → ``bad_request``.
    * Anything else → ``other``.

    An ``error`` event inside an open stream reaches us as an ``APIStatusError`` carrying the
    stream's own 2xx status (the SDK raises it that way); it is classified by its body alone
    and gets ``status_code=None``.

    Args:
        exc: An ``anthropic.APIError`` subclass, an ``httpx2``/``httpx`` transport exception,
            ``ConnectionError``, ``TimeoutError`` or ``ValueError`` (undecodable event data,
            → ``other``). A ``ModelCallError`` is returned as is.

    Returns:
        The classified error (a new object; raise it ``from exc``). ``retry_after_seconds``
        is set from ``retry-after-ms``/``Retry-After`` for rate-limit, overload, server and
        quota errors when the response had one.
    """
    if isinstance(exc, ModelCallError):
        return exc
    if isinstance(exc, anthropic.APITimeoutError):
        return ModelCallError("timeout", _truncate(exc.message or "request timed out"))
    if isinstance(exc, anthropic.APIConnectionError):
        cause = exc.__cause__ or exc.__context__
        detail = f": {type(cause).__name__}: {cause}" if cause is not None and str(cause) else ""
        return ModelCallError("network", _truncate(f"{exc.message or 'connection error'}{detail}"))
    if isinstance(exc, anthropic.APIStatusError):
        return _classify_status_error(exc)
    if isinstance(exc, anthropic.APIResponseValidationError):  # pragma: no cover - strict validation is off
        return ModelCallError("other", _truncate(f"invalid response: {exc.message}"), status_code=exc.status_code)
    if isinstance(exc, anthropic.APIError):
        kind, message, code = _error_fields(exc.body)
        return ModelCallError(_class_of(None, kind, message, code), _truncate(message or exc.message))
    return _classify_other(exc)


def _classify_status_error(exc: anthropic.APIStatusError) -> ModelCallError:
    """An HTTP error response, or an ``error`` event inside an open stream (its 2xx status:
    classified by the body alone, ``status_code=None``); see :func:`classify_anthropic_error`."""
    kind, message, code = _error_fields(exc.body)
    in_stream = exc.status_code < 400
    status = None if in_stream else exc.status_code
    error_class = _class_of(status, kind, message, code)
    text = _truncate(message or exc.message or f"HTTP {exc.status_code}")
    if in_stream:
        text = _truncate(f"error event in the stream ({kind or 'unknown'}): {text}")
    retry_after = (
        parse_retry_after(exc.response.headers)
        if status is not None and error_class in _RETRY_AFTER_CLASSES
        else None
    )
    return ModelCallError(error_class, text, status_code=status, retry_after_seconds=retry_after)


def _classify_other(exc: BaseException) -> ModelCallError:
    """An exception that is not the SDK's: timeouts → ``timeout``, transport errors →
    ``network``, anything else (e.g. undecodable event data) → ``other``."""
    described = _truncate(f"{type(exc).__name__}: {exc}")
    if isinstance(exc, TimeoutError):
        return ModelCallError("timeout", _truncate(str(exc) or "no data from the provider within the read timeout"))
    # Raw transport errors escape the SDK while the body is read (a dropped connection mid-
    # stream is an ``httpx2.RemoteProtocolError``); ``StreamError``: the response was closed
    # under us (e.g. ``aclose_clients()`` during a stream).
    if isinstance(exc, (httpx2.TimeoutException, httpx.TimeoutException)):
        return ModelCallError("timeout", described)
    if isinstance(exc, (httpx2.TransportError, httpx2.StreamError, httpx.TransportError, ConnectionError)):
        return ModelCallError("network", described)
    return ModelCallError("other", described)


# --- Streaming -----------------------------------------------------------------------------


@dataclass(slots=True)
class _ToolBlock:
    id: str
    name: str
    initial_input: Any
    fragments: list[str] = field(default_factory=list)

    def request(self) -> ToolCallRequest:
        arguments = "".join(self.fragments)
        if not arguments.strip():
            initial = self.initial_input if isinstance(self.initial_input, dict) else {}
            arguments = json.dumps(initial, ensure_ascii=False)
        return ToolCallRequest(id=self.id, name=self.name, arguments=arguments)


async def _next_event(stream: anthropic.AsyncStream[Any], timeout_seconds: float) -> Any | None:
    """The next stream event, or None at the end of the stream.

    Raises:
        ModelCallError: ``timeout`` when no event arrives within ``timeout_seconds`` (``ping``
            events do not count: the SDK skips them); any other failure classified.
    """
    try:
        async with asyncio.timeout(timeout_seconds):
            return await anext(stream)
    except StopAsyncIteration:
        return None
    except TimeoutError as exc:
        raise ModelCallError(
            "timeout", f"no event from the provider within {timeout_seconds:g} s"
        ) from exc
    except (anthropic.AnthropicError, httpx2.HTTPError, httpx2.StreamError, ConnectionError, ValueError) as exc:
        raise classify_anthropic_error(exc) from exc


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


@dataclass(slots=True)
class _UsageState:
    input_tokens: int | None = None
    cache_tokens: int = 0
    output_tokens: int | None = None

    def update(self, usage: Any) -> None:
        """Take the counters an event's ``usage`` reports (``message_delta`` values are
        cumulative, so a later value replaces an earlier one)."""
        if usage is None:
            return
        value = _int_or_none(getattr(usage, "input_tokens", None))
        if value is not None:
            self.input_tokens = value
        cache = sum(
            _int_or_none(getattr(usage, name, None)) or 0
            for name in ("cache_creation_input_tokens", "cache_read_input_tokens")
        )
        if cache:
            self.cache_tokens = cache
        value = _int_or_none(getattr(usage, "output_tokens", None))
        if value is not None:
            self.output_tokens = value

    def result(
        self, messages: Sequence[ChatMessage], tools: Sequence[ToolSpec], message: ChatMessage, reasoning: str
    ) -> Usage:
        """Prompt tokens = ``input_tokens`` + cache creation + cache read (Anthropic's total
        input); estimates (``estimated=True``) replace what the provider did not report."""
        return usage_or_estimate(
            prompt_tokens=None if self.input_tokens is None else self.input_tokens + self.cache_tokens,
            completion_tokens=self.output_tokens,
            messages=messages, tools=tools, message=message, reasoning=reasoning,
        )


class _MessageState:
    """What one streamed Messages API answer has gathered so far: text, thinking, ``tool_use``
    blocks by index, usage, stop reason and whether ``message_stop`` came, with the first-token
    hook fired once.

    :meth:`take` handles one stream event and returns the delta to yield for it, if any;
    :meth:`completion` builds the ``Completion``.
    """

    __slots__ = ("text_parts", "reasoning_parts", "tool_blocks", "usage", "stop_reason", "stopped",
                 "started", "on_first_token")

    def __init__(self, on_first_token: Callable[[], None] | None) -> None:
        self.text_parts: list[str] = []
        self.reasoning_parts: list[str] = []
        self.tool_blocks: dict[int, _ToolBlock] = {}
        self.usage = _UsageState()
        self.stop_reason: str | None = None
        self.stopped = False
        self.started = False
        self.on_first_token = on_first_token

    def _first_fragment(self) -> None:
        if not self.started:
            self.started = True
            if self.on_first_token is not None:
                self.on_first_token()

    def take(self, event: Any) -> TextDelta | ReasoningDelta | None:
        """Handle one stream event; the ``TextDelta``/``ReasoningDelta`` to yield for it, or None.

        ``message_stop`` sets :attr:`stopped` (the caller stops reading there).
        """
        kind = getattr(event, "type", None)
        if kind == "content_block_delta":
            delta = event.delta
            delta_kind = getattr(delta, "type", None)
            if delta_kind == "text_delta" and delta.text:
                self._first_fragment()
                self.text_parts.append(delta.text)
                return TextDelta(delta.text)
            if delta_kind == "thinking_delta" and delta.thinking:
                self._first_fragment()
                self.reasoning_parts.append(delta.thinking)
                return ReasoningDelta(delta.thinking)
            if delta_kind == "input_json_delta":
                block = self.tool_blocks.get(event.index)
                if block is not None and delta.partial_json:
                    block.fragments.append(delta.partial_json)
            # signature_delta, citations_delta: nothing to surface.
        elif kind == "content_block_start":
            return self._block_start(event)
        elif kind == "message_start":
            self.usage.update(getattr(event.message, "usage", None))
        elif kind == "message_delta":
            self._message_delta(event)
        elif kind == "message_stop":
            self.stopped = True
        # content_block_stop and unknown event types: nothing to do.
        return None

    def _block_start(self, event: Any) -> TextDelta | ReasoningDelta | None:
        """A ``content_block_start``: a ``tool_use`` block is opened; a text or thinking block's
        initial text (if any) is the delta returned."""
        content = event.content_block
        block_kind = getattr(content, "type", None)
        if block_kind == "tool_use":
            self._first_fragment()
            self.tool_blocks[event.index] = _ToolBlock(
                id=content.id, name=content.name, initial_input=getattr(content, "input", None)
            )
        elif block_kind == "text" and getattr(content, "text", ""):
            self._first_fragment()
            self.text_parts.append(content.text)
            return TextDelta(content.text)
        elif block_kind == "thinking" and getattr(content, "thinking", ""):
            self._first_fragment()
            self.reasoning_parts.append(content.thinking)
            return ReasoningDelta(content.thinking)
        # redacted_thinking and server-tool blocks: not part of the canonical message.
        return None

    def _message_delta(self, event: Any) -> None:
        reason = getattr(event.delta, "stop_reason", None)
        if reason:
            self.stop_reason = reason
        self.usage.update(getattr(event, "usage", None))

    def completion(
        self, entry: RouteEntryConfig, messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]
    ) -> Completion:
        """The whole answer (tool calls in block order; finish reason mapped by :data:`FINISH_REASONS`).

        Raises:
            ModelCallError: ``network`` when the stream ended before ``message_stop``.
        """
        if not self.stopped:
            raise ModelCallError("network", "the provider stream ended before message_stop")
        calls = tuple(self.tool_blocks[index].request() for index in sorted(self.tool_blocks))
        message = ChatMessage(role="assistant", content="".join(self.text_parts), tool_calls=calls)
        reasoning = "".join(self.reasoning_parts)
        stop_reason = self.stop_reason
        return Completion(
            message=message,
            usage=self.usage.result(messages, tools, message, reasoning),
            finish_reason=FINISH_REASONS.get(stop_reason, stop_reason) if stop_reason else None,
            entry_index=entry.index,
            model=entry.model,
        )

    def assembled(self, completion: Completion) -> dict[str, Any]:
        """The streamed answer as the ``message`` object a non-streamed call returns:
        ``{"type": "message", "role": "assistant", "model", "content": [thinking?, text?,
        tool_use…], "stop_reason", "usage": {"input_tokens", "output_tokens",
        "cache_tokens"?}}`` (the provider's counters as streamed; None where it sent none)."""
        content: list[dict[str, Any]] = []
        if self.reasoning_parts:
            content.append({"type": "thinking", "thinking": "".join(self.reasoning_parts)})
        if completion.message.content:
            content.append({"type": "text", "text": completion.message.content})
        for call in completion.message.tool_calls:
            content.append({"type": "tool_use", "id": call.id, "name": call.name, "input": _tool_input(call.arguments)})
        usage: dict[str, Any] = {"input_tokens": self.usage.input_tokens, "output_tokens": self.usage.output_tokens}
        if self.usage.cache_tokens:
            usage["cache_tokens"] = self.usage.cache_tokens
        return {"type": "message", "role": "assistant", "model": completion.model, "content": content,
                "stop_reason": self.stop_reason, "usage": usage}


async def stream_chat(
    entry: RouteEntryConfig,
    messages: Sequence[ChatMessage],
    tools: Sequence[ToolSpec],
    *,
    max_output_tokens: int | None = None,
    on_first_token: Callable[[], None] | None = None,
    tool_choice: str = "auto",
    capture: BodyCapture | None = None,
) -> AsyncIterator[TextDelta | ReasoningDelta | Completion]:
    """Stream one answer from an Anthropic Messages API endpoint.

    Same contract as :func:`llm.providers.openai_compat.stream_chat`. ``entry.base_url`` is
    the provider root (``https://api.anthropic.com``; see :func:`api_root_url`).
    ``read_timeout_seconds`` bounds the wait for the response headers (httpx2), for the first
    event and between events (our timer, so a provider trickling bytes or pings cannot stall
    us); ``connect_timeout_seconds`` bounds TCP/TLS connect.

    Args:
        entry: The route entry to call (``api == "anthropic"``).
        messages: Canonical history (translated by :func:`build_request`).
        tools: Offered tools (may be empty).
        max_output_tokens: Optional cap below the entry's own ``max_output_tokens``.
        on_first_token: Called once, synchronously, when the first text, thinking or
            ``tool_use`` fragment arrives (before anything is yielded for it). The router uses
            it to stop falling back.
        tool_choice: A :attr:`~llm.model.ModelSettings.tool_choice` (see :func:`build_request`).
        capture: Filled with the bodies when given: ``request``, the parameters the SDK sends
            as the JSON body; ``response``, the stream assembled as a Messages API ``message``
            object (:meth:`_MessageState.assembled`) once ``message_stop`` came.

    Yields:
        ``TextDelta`` and ``ReasoningDelta`` fragments, then exactly one ``Completion`` (the
        whole assistant message with its tool calls, arguments as JSON text; usage from the
        provider, else estimated with ``Usage.estimated=True``; ``finish_reason`` mapped by
        :data:`FINISH_REASONS`; ``entry_index``/``model`` from ``entry``).

    Raises:
        ModelCallError: connection, HTTP status, timeout, ``error`` event, undecodable event
            data, or a stream that ended before ``message_stop`` (``network``); ``bad_request``
            for a ``tool_choice`` the offered tools cannot meet (before any request).
    """
    params = build_request(entry, messages, tools, max_output_tokens=max_output_tokens, tool_choice=tool_choice)
    if capture is not None:
        capture.request = params
    client = _client_for(entry)
    try:
        stream = await client.messages.create(**params)
    except anthropic.AnthropicError as exc:
        raise classify_anthropic_error(exc) from exc

    state = _MessageState(on_first_token)
    async with stream:
        while True:
            event = await _next_event(stream, entry.read_timeout_seconds)
            if event is None:
                break
            delta = state.take(event)
            if delta is not None:
                yield delta
            elif state.stopped:
                break
    completion = state.completion(entry, messages, tools)
    if capture is not None:
        capture.response = state.assembled(completion)
    yield completion


class AnthropicModel:
    """The :class:`~llm.model.Model` of one route entry on an Anthropic Messages API endpoint.

    ``stream(messages, tools, settings)`` is :func:`stream_chat` on ``entry`` with the
    settings' output cap, temperature and tool choice; it returns that generator itself (no extra layer
    per streamed event). Events and errors: :func:`stream_chat`.
    """

    __slots__ = ("entry",)

    def __init__(self, entry: RouteEntryConfig) -> None:
        self.entry = entry

    def stream(
        self,
        messages: Sequence[ChatMessage],
        tools: Sequence[ToolSpec],
        settings: ModelSettings | None = None,
        *,
        on_first_token: FirstTokenHook | None = None,
        capture: BodyCapture | None = None,
    ) -> AsyncIterator[TextDelta | ReasoningDelta | Completion]:
        """One streamed call on this entry (see :func:`stream_chat`; ``capture``: its bodies)."""
        settings = settings or DEFAULT_SETTINGS
        return stream_chat(
            settings.applied_to(self.entry), messages, tools,
            max_output_tokens=settings.max_output_tokens, on_first_token=on_first_token,
            tool_choice=settings.tool_choice, capture=capture,
        )


__all__ = [
    "AnthropicModel",
    "DEFAULT_MAX_OUTPUT_TOKENS",
    "FINISH_REASONS",
    "aclose_clients",
    "api_root_url",
    "build_request",
    "classify_anthropic_error",
    "output_limit",
    "stream_chat",
    "tool_use_id_for",
    "translate_messages",
]
