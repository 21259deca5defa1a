"""Adapter for OpenAI-compatible chat-completions APIs (OpenAI, vLLM, llama.cpp, Ollama, …).

One streaming call per :func:`stream_chat`, over a pooled ``openai.AsyncOpenAI`` client with
SDK retries off (the router is the only retry loop). Everything provider-specific about this
wire format stays in this module: request building, chunk parsing, tool-call reassembly,
text-mode tool calls, usage.

The streamed request is sent on the SDK client's own HTTP pool, with the SDK's headers and
timeouts, but its server-sent events are parsed here into plain dicts
(:func:`_sse_payloads`): the SDK's per-request option transforms and per-chunk model
construction were half of a worker's event-loop CPU with 200 runs streaming at once
(bench/concurrent_runs.py, bench/README.md). HTTP errors are still turned into the SDK's
exceptions (``_make_status_error_from_response``), transport failures into
``APIConnectionError``/``APITimeoutError`` and in-stream ``{"error": …}`` objects into
``APIError``, exactly as the SDK's stream would, so :func:`llm.errors.classify_error` sees
the same exceptions as before.

Errors: every failure leaves as :class:`llm.errors.ModelCallError` (classified by
:func:`llm.errors.classify_error`; a stream that finishes with ``finish_reason:
"content_filter"`` is a ``content_policy`` failure); ``asyncio.CancelledError`` propagates
untouched and the HTTP response is closed on the way out.

Timeouts: connect (httpx, ``connect_timeout_seconds``) and idle (``read_timeout_seconds``:
httpx's read timeout for the headers, and this module's asyncio timer between chunks) are
enforced here; the first-token and whole-stream timers are the router's, so they apply to
every adapter alike.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import ssl
import weakref
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any, Final

import httpx
import httpx2
import openai

from llm.errors import ModelCallError, classify_error, classify_finish_reason
from llm.model import DEFAULT_SETTINGS, FirstTokenHook, ModelSettings, tool_call_schema, tool_choice_resolve
from llm.providers._clients import LoopClientCache, checked_aiohttp_transport, checked_httpx_transport
from llm.providers.aiohttp_transport import aiohttp_reader, mapped_error
from llm.records import BodyCapture
from llm.tokens import usage_or_estimate
from llm.toolcall_parsing import ToolCallHoldback, messages_for_text_mode, mint_call_id
from llm.types import ChatMessage, Completion, ReasoningDelta, TextDelta, ToolCallRequest, ToolSpec, Usage

if TYPE_CHECKING:
    from llm.config import RouteEntryConfig

MAX_CLIENTS_PER_LOOP: Final[int] = 64
"""Clients kept per event loop; the least recently used one is dropped beyond that."""

NO_API_KEY: Final[str] = "no-key"
"""Sent when an entry has no API key (local servers), so the SDK never falls back to the
``OPENAI_API_KEY`` environment variable and leaks it to another base URL."""

def client_new(key: tuple[str, str, float, float]) -> openai.AsyncOpenAI:
    """A new ``openai.AsyncOpenAI`` for ``(base_url, api_key, connect_timeout_s, read_timeout_s)``.

    No retries; every connect checked against the outbound address rules.
    """
    base_url, api_key, connect_timeout, read_timeout = key
    return openai.AsyncOpenAI(
        base_url=base_url,
        api_key=api_key or NO_API_KEY,
        max_retries=0,
        timeout=httpx.Timeout(read_timeout, connect=connect_timeout),
        # The SDK's defaults (limits, redirects) without its finaliser, which would try to
        # close the pool on whatever loop runs when it is collected; every connect checked
        # against the outbound address rules.
        http_client=openai.DefaultAsyncHttpxClient(transport=checked_httpx_transport(verify=_ssl_context())),
    )


_clients: LoopClientCache[openai.AsyncOpenAI] = LoopClientCache(client_new, max_per_loop=MAX_CLIENTS_PER_LOOP)


def _client_for(entry: RouteEntryConfig) -> openai.AsyncOpenAI:
    """The pooled client for ``entry``'s (base_url, api_key, timeouts) in the running loop."""
    return _clients.get(
        (entry.base_url, entry.api_key, float(entry.connect_timeout_seconds), float(entry.read_timeout_seconds))
    )


HTTP_SHARDS: Final[int] = 16
"""Connection pools per client and event loop that streamed requests are spread over."""
STREAMS_PER_SHARD: Final[int] = 12
"""A pool takes new streams until this many are open on it; then the next pool is used.

Why shards: httpcore's pool walks all its connections on every request start and end and
probes every idle one's socket (``has_expired``), so with 200 runs on one pool a worker spent
~4 ms of event-loop CPU per model call there (py-spy, bench/concurrent_runs.py). Small pools
keep that walk short. Calls one after another all go to the first pool (one connection)."""


_shared_ssl_context: ssl.SSLContext | None = None


def _ssl_context() -> ssl.SSLContext:
    """One TLS context for every pool of this process: what httpx builds by default
    (``httpx2.create_ssl_context()``: certifi's CAs, ``SSL_CERT_FILE``/``SSL_CERT_DIR`` honoured),
    built once, as building it costs ~25 ms of CPU (the CA bundle is parsed each time)."""
    global _shared_ssl_context
    if _shared_ssl_context is None:
        _shared_ssl_context = httpx2.create_ssl_context()
    return _shared_ssl_context


def _is_timeout(exc: httpx2.TransportError) -> bool:
    """Whether a transport error is a timeout. httpx2's own timeouts are; but the SDK's
    aiohttp transport maps every ``aiohttp.ClientConnectionError`` (connection refused, reset,
    server disconnected) to ``httpx2.ConnectTimeout``, so its cause decides there: only
    aiohttp's ``ServerTimeoutError`` family is a timeout."""
    if not isinstance(exc, httpx2.TimeoutException):
        return False
    try:
        import aiohttp
    except ImportError:
        return True
    cause = exc.__cause__
    return not (isinstance(cause, aiohttp.ClientConnectionError) and not isinstance(cause, aiohttp.ServerTimeoutError))


def _new_stream_http_client() -> httpx2.AsyncClient:
    """An HTTP pool for model streams, on the transport ``LLM_HTTP_TRANSPORT`` names; every
    connect is checked against the outbound address rules (``capabilities.netsafe``)."""
    from django.conf import settings

    if getattr(settings, "LLM_HTTP_TRANSPORT", "httpx") == "aiohttp":
        return openai.DefaultAioHttpClient(transport=checked_aiohttp_transport(verify=_ssl_context()))
    return openai.DefaultAsyncHttpxClient(transport=checked_httpx_transport(verify=_ssl_context()))


class _HttpShard:
    """One ``httpx2.AsyncClient`` pool and the number of streams open on it."""

    __slots__ = ("http", "open_streams")

    def __init__(self, key: Any) -> None:
        self.http = _new_stream_http_client()
        self.open_streams = 0

    async def close(self) -> None:
        await self.http.aclose()


_shards: LoopClientCache[_HttpShard] = LoopClientCache(_HttpShard, max_per_loop=MAX_CLIENTS_PER_LOOP * HTTP_SHARDS)


def _shard_for(entry: RouteEntryConfig) -> _HttpShard:
    """The pool for a new stream to ``entry``: the first with fewer than
    :data:`STREAMS_PER_SHARD` open streams, else the least busy one."""
    key = (entry.base_url, entry.api_key, float(entry.connect_timeout_seconds), float(entry.read_timeout_seconds))
    best: _HttpShard | None = None
    for index in range(HTTP_SHARDS):
        shard = _shards.get((key, index))
        if shard.open_streams < STREAMS_PER_SHARD:
            return shard
        if best is None or shard.open_streams < best.open_streams:
            best = shard
    assert best is not None
    return best


async def aclose_clients() -> None:
    """Close every pooled client of the running event loop (e.g. at worker shutdown or in
    test teardown). Streams still open on them fail with a network error."""
    await _clients.aclose()
    await _shards.aclose()


# --- Streaming -----------------------------------------------------------------------------


@dataclass(slots=True)
class _PartialCall:
    id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)


class _ToolCallAssembler:
    """Reassembles streamed ``delta.tool_calls`` fragments into whole calls, by ``index``.

    Tolerates providers that omit ``index`` (matched by id, else the last call), repeat the
    full name in every fragment, or reuse an index for a call with a new id.
    """

    __slots__ = ("_calls", "_by_index")

    def __init__(self) -> None:
        self._calls: list[_PartialCall] = []
        self._by_index: dict[int, _PartialCall] = {}

    def add(self, fragment: Any) -> None:
        """Add one ``delta.tool_calls[i]`` object (a parsed JSON dict; anything else is ignored)."""
        if not isinstance(fragment, dict):
            return
        index = fragment.get("index")
        call_id = fragment.get("id") or ""
        call = self._call_for(index, call_id)
        if call_id and not call.id:
            call.id = call_id
        function = fragment.get("function")
        if isinstance(function, dict):
            name = function.get("name")
            if name and isinstance(name, str) and name != call.name:
                call.name += name
            arguments = function.get("arguments")
            if arguments and isinstance(arguments, str):
                call.arguments.append(arguments)

    def _call_for(self, index: Any, call_id: str) -> _PartialCall:
        """The call a fragment with this ``index`` (an int, or missing) and id (``""`` if none)
        continues, or a new one (registered under ``index`` when it is an int)."""
        call: _PartialCall | None = None
        if isinstance(index, int):
            call = self._by_index.get(index)
            if call is not None and call_id and call.id and call_id != call.id:
                call = None
        elif call_id:
            call = next((c for c in self._calls if c.id == call_id), None)
        elif self._calls:
            call = self._calls[-1]
        if call is None:
            call = _PartialCall()
            self._calls.append(call)
            if isinstance(index, int):
                self._by_index[index] = call
        return call

    def result(self) -> list[ToolCallRequest]:
        return [
            ToolCallRequest(id=c.id or mint_call_id(), name=c.name, arguments="".join(c.arguments) or "{}")
            for c in self._calls
            if c.name
        ]


def _reasoning_text(delta: dict[str, Any]) -> str:
    """``reasoning_content`` (DeepSeek, vLLM, llama.cpp) or ``reasoning`` (OpenRouter, newer vLLM)."""
    for key in ("reasoning_content", "reasoning"):
        value = delta.get(key)
        if isinstance(value, str) and value:
            return value
    return ""


@dataclass(frozen=True, slots=True)
class _Wire:
    """What a streamed request needs from an SDK client, computed once per client."""

    url: str
    headers: dict[str, str]
    timeout: httpx2.Timeout


_wires: weakref.WeakKeyDictionary[openai.AsyncOpenAI, _Wire] = weakref.WeakKeyDictionary()


def _wire(client: openai.AsyncOpenAI) -> _Wire:
    """The chat-completions URL, the SDK's default and auth headers and its timeouts."""
    wire = _wires.get(client)
    if wire is None:
        headers = {**client.default_headers, **client.auth_headers}
        timeout = client.timeout
        wire = _Wire(
            url=f"{str(client.base_url).rstrip('/')}/chat/completions",
            headers={k: v for k, v in headers.items() if isinstance(v, str)},  # drops the SDK's Omit markers
            timeout=httpx2.Timeout(connect=timeout.connect, read=timeout.read, write=timeout.write, pool=timeout.pool)
            if isinstance(timeout, (httpx.Timeout, httpx2.Timeout)) else httpx2.Timeout(timeout),
        )
        _wires[client] = wire
    return wire


_STATUS_ERRORS: Final[dict[int, type[openai.APIStatusError]]] = {
    400: openai.BadRequestError, 401: openai.AuthenticationError, 403: openai.PermissionDeniedError,
    404: openai.NotFoundError, 409: openai.ConflictError, 422: openai.UnprocessableEntityError,
    429: openai.RateLimitError,
}


def status_error_from_response(response: httpx2.Response) -> openai.APIStatusError:
    """The SDK's exception for an HTTP error ``response`` whose body was read, built with the
    SDK's public exception classes as its client builds it (``BadRequestError`` for 400, …,
    ``InternalServerError`` for 5xx, else ``APIStatusError``; message ``"Error code: <status>"``
    plus ``" - <error.message>"`` when the JSON body has one; ``body``: the body's ``error``
    object, else the parsed JSON or the text). ``test_status_errors_match_the_sdk`` keeps it
    equal to the SDK's own."""
    status = response.status_code
    message = f"Error code: {status}"
    text = response.text.strip()
    body: Any = text
    try:
        body = json.loads(text)
    except ValueError:
        pass
    else:
        error = body.get("error", body) if isinstance(body, Mapping) else None
        detail = error.get("message") if isinstance(error, Mapping) else None
        if isinstance(detail, str) and detail:
            message += f" - {detail}"
    data = body.get("error", body) if isinstance(body, Mapping) else body
    kind = _STATUS_ERRORS.get(status) or (openai.InternalServerError if status >= 500 else openai.APIStatusError)
    return kind(message, response=response, body=data)


def _sdk_error(error: Exception, cause: BaseException) -> Exception:
    error.__cause__ = cause
    return error


async def _open_stream(
    client: openai.AsyncOpenAI, http: httpx2.AsyncClient, params: dict[str, Any], body: bytes | None = None,
) -> httpx2.Response:
    """POST the streaming request on ``http`` with ``client``'s headers and timeouts; the
    open 2xx response. ``body``: ``params`` already encoded (``json.dumps(params).encode()``,
    the bytes a :class:`~llm.records.BodyCapture` keeps); None: encoded here.

    Raises:
        ModelCallError: classified from the SDK's ``APIStatusError`` for an HTTP error status
            (body read), ``APITimeoutError`` for a transport timeout, ``APIConnectionError``
            for any other failure to send (as the SDK raises them with retries off).
    """
    wire = _wire(client)
    request = http.build_request("POST", wire.url, content=json.dumps(params).encode() if body is None else body,
                                 headers=wire.headers, timeout=wire.timeout)
    try:
        response = await http.send(request, stream=True)
    except httpx2.TransportError as exc:
        error = openai.APITimeoutError if _is_timeout(exc) else openai.APIConnectionError
        raise classify_error(_sdk_error(error(request=request), exc)) from exc
    except Exception as exc:
        raise classify_error(_sdk_error(openai.APIConnectionError(request=request), exc)) from exc
    if response.status_code >= 400:
        try:
            await response.aread()
            status_error = status_error_from_response(response)
        except Exception as exc:  # the error body broke off: still a failed request
            status_error = _sdk_error(openai.APIConnectionError(request=request), exc)
        finally:
            await response.aclose()
        raise classify_error(status_error) from status_error
    return response


def _aiohttp_body(response: httpx2.Response) -> Any:
    """The ``aiohttp.StreamReader`` under ``response`` when our aiohttp transport
    (:mod:`llm.providers.aiohttp_transport`, ``LLM_HTTP_TRANSPORT=aiohttp``) made it and the
    body is not content-encoded; else None.

    Reading it directly skips five async-generator steps per read (httpx2's ``aiter_bytes``,
    ``aiter_raw``, its timing wrapper, the transport's stream, aiohttp's chunk iterator), and a
    read takes everything buffered: ~4 µs of the loop's CPU per streamed token, about a tenth
    of the adapter's (``bench/stream_floor.py``; bench/README.md, session 10). A
    content-encoded body needs httpx2's decoder, so it takes the ordinary path.
    ``test_stream_transports.py`` checks that the aiohttp transport's responses are
    recognised, so a change that breaks it fails a test instead of silently slowing streams.
    """
    reader = aiohttp_reader(response)
    if reader is None:
        return None
    if response.headers.get("content-encoding", "identity").strip().lower() not in ("", "identity"):
        return None
    return reader


def _transport_error(exc: Exception) -> httpx2.TransportError | None:
    """``exc`` as the httpx2 transport error the aiohttp transport raises for it
    (:func:`llm.providers.aiohttp_transport.mapped_error`), or None when it is not a
    transport failure."""
    return mapped_error(exc)


async def _sse_payloads(response: httpx2.Response, idle_timeout_seconds: float | None = None) -> AsyncIterator[list[Any]]:
    """The JSON payloads of a chat-completions SSE stream, parsed, until ``[DONE]``: a list
    per read from the connection (every event it completed; never empty).

    ``idle_timeout_seconds``: a read that has brought bytes but no complete event (comments,
    keep-alives, an event trickling in) for this long since this generator was last resumed
    raises ``TimeoutError``. Silence is the transport's to notice: its read timeout has the
    same length (see :func:`_next_payloads`).

    One list per read rather than one payload at a time: when the loop is busy, a stream's
    reads carry several events, and the layers above then pay their per-step cost once for
    all of them (bench/README.md, "streams running together"). On the aiohttp transport a
    read takes everything the connection has buffered (:func:`_aiohttp_body`).

    Server-sent events as the SDK's decoder reads them: ``data:`` lines of one event are
    joined with newlines; ``event:``/``id:``/``retry:`` fields and ``:`` comments are
    ignored; lines end with ``\n`` or ``\r\n``. After ``[DONE]`` the rest of the body is
    read (at most :data:`DRAIN_SECONDS`) so the connection goes back to the pool.

    Raises:
        openai.APIError: a payload that is an ``{"error": …}`` object (the SDK's in-stream
            error, same message and body).
        openai.APITimeoutError, openai.APIConnectionError: the transport failed mid-stream.
        ValueError: a payload that is not JSON.
    """
    decoder = _SseDecoder()
    body = _aiohttp_body(response)
    # ``read()``: the next bytes of the body, b"" at its end (httpx2 never yields empty chunks).
    read: Callable[[], Any] = body.readany if body is not None else partial(anext, response.aiter_bytes(), b"")
    clock = asyncio.get_running_loop().time
    waiting_since = clock()
    try:
        while True:
            try:
                chunk = await read()
            except Exception as exc:
                failure = _transport_error(exc)
                if failure is None:
                    raise
                error = openai.APITimeoutError if _is_timeout(failure) else openai.APIConnectionError
                raise _sdk_error(error(request=response.request), failure) from failure
            try:
                ready = decoder.feed(chunk)
            except _BadEvent as bad:
                if bad.ready:  # what came before the bad event is delivered first, as it arrived
                    yield bad.ready
                raise bad.error(response.request) from None
            if ready:
                yield ready
                waiting_since = clock()
            if decoder.done:
                await _drain(read)
                return
            if not ready and idle_timeout_seconds is not None and clock() - waiting_since >= idle_timeout_seconds:
                raise TimeoutError(f"bytes but no event for {idle_timeout_seconds:g} s")
            if not chunk:
                return
    finally:
        await response.aclose()


class _BadEvent(Exception):
    """An event :class:`_SseDecoder` cannot pass on: a payload that is not JSON (the
    ``ValueError`` is the ``__cause__``; ``payload`` None) or an ``{"error": …}`` object
    (``payload``). ``ready``: the payloads of the same read before it."""

    def __init__(self, ready: list[Any], payload: Any = None) -> None:
        super().__init__("bad event")
        self.ready = ready
        self.payload = payload

    def error(self, request: Any) -> Exception:
        """What the stream raises for it: the SDK's in-stream ``APIError`` for an error
        object, else the ``ValueError`` of the JSON parse."""
        if self.payload is not None:
            return _stream_error(self.payload, request)
        return self.__cause__ if isinstance(self.__cause__, ValueError) else ValueError("an event is not JSON")


class _SseDecoder:
    """Server-sent events as the SDK's decoder reads them, a read at a time: ``data:`` lines
    of one event are joined with newlines; ``event:``/``id:``/``retry:`` fields and ``:``
    comments are ignored; lines end with ``\n`` or ``\r\n``; a blank line ends an event.
    ``done`` once ``[DONE]`` was read (what follows it is not parsed)."""

    __slots__ = ("buffer", "data", "done")

    def __init__(self) -> None:
        self.buffer = b""
        self.data: list[bytes] = []
        self.done = False

    def feed(self, chunk: bytes) -> list[Any]:
        """The JSON payloads of the events ``chunk`` completes, in order (``b""``: the end of
        the body, which ends its last line).

        Raises:
            _BadEvent: an event that is not JSON, or an ``{"error": …}`` object.
        """
        if chunk:
            lines = (self.buffer + chunk).split(b"\n")
            self.buffer = lines.pop()
        else:
            lines, self.buffer = [self.buffer, b""], b""
        ready: list[Any] = []
        data = self.data
        for line in lines:
            if line.endswith(b"\r"):
                line = line[:-1]
            if line.startswith(b"data:"):
                data.append(line[6:] if line[5:6] == b" " else line[5:])
            elif not line and data:
                text = b"\n".join(data).decode()
                data.clear()
                if text.startswith("[DONE]"):
                    self.done = True
                    break
                try:
                    payload = json.loads(text)
                except ValueError as exc:
                    raise _BadEvent(ready) from exc
                if isinstance(payload, dict) and payload.get("error"):
                    raise _BadEvent(ready, payload)
                ready.append(payload)
        return ready


def _stream_error(payload: dict[str, Any], request: Any) -> openai.APIError:
    """The SDK's in-stream error for an ``{"error": …}`` payload (same message and body)."""
    error = payload["error"]
    message = error.get("message") if isinstance(error, dict) else None
    return openai.APIError(
        message=message if isinstance(message, str) and message else "An error occurred during streaming",
        request=request, body=error,
    )


DRAIN_SECONDS: Final[float] = 0.1
"""How long the rest of a body after ``[DONE]`` is read so its HTTP/1.1 connection can be
reused (the SDK's value); a server that keeps sending past it loses the connection."""


async def _drain(read: Callable[[], Any]) -> None:
    """Read the body to its end (``read()`` gives b"" there), for at most :data:`DRAIN_SECONDS`."""
    try:
        async with asyncio.timeout(DRAIN_SECONDS):
            while await read():
                pass
    except Exception:  # a failing or slow rest only costs the connection
        pass


async def _next_payloads(payloads: AsyncIterator[list[Any]], timeout_seconds: float) -> list[Any] | None:
    """The next parsed chunks (one read's), or None at the end of the stream.

    The idle timeout needs no timer of its own here: the transport's read timeout is
    ``read_timeout_seconds`` (the SDK client's ``timeout.read``; aiohttp's ``sock_read``),
    so a silent server fails the read, and :func:`_sse_payloads` fails a stream whose bytes
    complete no event for as long. A timer per read (``asyncio.timeout``) cost ~12 % of the
    loop's CPU per streamed chunk with 200 streams (py-spy, bench/README.md).

    Args:
        payloads: :func:`_sse_payloads` of the response, given ``timeout_seconds``.
        timeout_seconds: Idle timeout, seconds (``read_timeout_seconds``): for the message.

    Raises:
        ModelCallError: ``timeout`` when no chunk arrives within ``timeout_seconds``; any
            other failure classified.
    """
    try:
        return await anext(payloads)
    except StopAsyncIteration:
        return None
    except (TimeoutError, openai.APITimeoutError) as exc:
        raise ModelCallError(
            "timeout", f"no chunk from the provider within {timeout_seconds:g} s (idle timeout)"
        ) from exc
    except (openai.OpenAIError, ValueError) as exc:
        raise classify_error(exc) from exc


def build_request(
    entry: RouteEntryConfig,
    messages: Sequence[ChatMessage],
    tools: Sequence[ToolSpec],
    *,
    max_output_tokens: int | None = None,
    tool_choice: str = "auto",
    response_format: dict[str, Any] | None = None,
) -> tuple[dict[str, Any], list[ChatMessage]]:
    """The ``chat.completions.create`` keyword arguments for one streaming call.

    Args:
        entry: The route entry (model, output limit, tool-call mode, image input).
        messages: Canonical history. A user message's images become ``image_url`` content
            parts with a ``data:`` URL when ``entry.supports_images``; else the entry gets the
            text alone (its ``[image: artifact:N …]`` reference).
        tools: Offered tools; sent as ``tools`` in native mode (only when non-empty), as a
            system-prompt section in text mode.
        max_output_tokens: Caller's cap; the entry's ``max_output_tokens`` still applies.
        tool_choice: A :attr:`~llm.model.ModelSettings.tool_choice`. Native mode sends it as
            ``tool_choice`` (``"required"``, ``"none"``, or ``{"type": "function", "function":
            {"name": …}}``; nothing for ``"auto"``). Text mode (the server parses no tool
            calls) enforces a call by constrained decoding instead: ``response_format``
            ``{"type": "json_object", "schema": …}`` with the JSON Schema of the call
            (:func:`~llm.model.tool_call_schema`, required arguments only; ``anyOf`` the
            offered tools' for ``"required"``), which llama.cpp's servers (llama-cpp-python's
            and ``llama-server``) turn into a grammar, and says so in the system message
            (:func:`~llm.toolcall_parsing.render_tool_choice_note`); ``"none"`` leaves the
            tools out of the prompt. Why required arguments only: given the whole schema, the
            embedded 0.5B model filled every optional argument with invented values
            (``knowledge_search``'s ``filters.document_ids: [1, 2]``, which matched no
            document); the tool's defaults are better.
        response_format: The answer's JSON format (:attr:`~llm.model.ModelSettings.response_format`),
            sent as ``response_format`` only when ``entry.json_schema_mode`` and it cannot stop
            a tool call: native mode, or text mode with no tools offered (a text-mode model
            writes its calls as text, which a schema would forbid); a forced call's own
            constrained decoding (text mode) wins.

    Returns:
        ``(params, sent_messages)``: the request parameters and the canonical messages they
        were built from (rewritten ones in text mode).

    Raises:
        ModelCallError: ``bad_request`` for a ``tool_choice`` the offered tools cannot meet
            (:func:`~llm.model.tool_choice_resolve`).
    """
    text_mode = entry.tool_calls == "text"
    choice = tool_choice_resolve(tool_choice, tools)
    if text_mode:
        forced = choice.name if isinstance(choice, ToolSpec) else choice if choice == "required" else "auto"
        sent = messages_for_text_mode(messages, () if choice == "none" else tools, tool_choice=forced)
    else:
        sent = list(messages)
    params: dict[str, Any] = {
        "model": entry.model,
        "messages": [m.to_openai(with_images=entry.supports_images) for m in sent],
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    limit = entry.max_output_tokens
    if max_output_tokens is not None:
        limit = min(limit, max_output_tokens) if limit > 0 else max_output_tokens
    if limit > 0:
        params["max_tokens"] = limit
    if entry.temperature is not None:
        params["temperature"] = entry.temperature
    _add_tool_params(params, tools, choice, text_mode)
    if response_format is not None and entry.json_schema_mode:
        _add_response_format(params, response_format, tools_as_text=text_mode and bool(tools) and choice != "none")
    return params, sent


def _add_response_format(params: dict[str, Any], response_format: dict[str, Any], *, tools_as_text: bool) -> None:
    """Add the answer's JSON format (an entry with native JSON-schema mode) to ``params``, unless
    a forced text-mode call's own format is there or the model writes its tool calls as text
    (``tools_as_text``: a schema would forbid them); see :func:`build_request`."""
    if "response_format" not in params and not tools_as_text:
        params["response_format"] = response_format


def _add_tool_params(params: dict[str, Any], tools: Sequence[ToolSpec], choice: str | ToolSpec, text_mode: bool) -> None:
    """Add ``tools`` and ``tool_choice`` (native mode, tools offered) or the constrained-decoding
    ``response_format`` (text mode, a call forced) to ``params``; see :func:`build_request`.
    ``choice``: :func:`~llm.model.tool_choice_resolve`'s result."""
    if tools and not text_mode:
        params["tools"] = [t.to_openai() for t in tools]
        if isinstance(choice, ToolSpec):
            params["tool_choice"] = {"type": "function", "function": {"name": choice.name}}
        elif choice != "auto":
            params["tool_choice"] = choice
    elif text_mode and choice != "auto" and choice != "none":
        schema = (tool_call_schema(choice, required_only=True) if isinstance(choice, ToolSpec)
                  else {"anyOf": [tool_call_schema(t, required_only=True) for t in tools]})
        params["response_format"] = {"type": "json_object", "schema": schema}


async def stream_chat(
    entry: RouteEntryConfig,
    messages: Sequence[ChatMessage],
    tools: Sequence[ToolSpec],
    *,
    max_output_tokens: int | None = None,
    on_first_token: Callable[[], None] | None = None,
    tool_choice: str = "auto",
    response_format: dict[str, Any] | None = None,
    capture: BodyCapture | None = None,
) -> AsyncIterator[TextDelta | ReasoningDelta | Completion]:
    """Stream one chat completion from an OpenAI-compatible endpoint.

    Native mode (``entry.tool_calls == "native"``): ``tools`` are sent as such and streamed
    ``tool_calls`` fragments are reassembled by index. Text mode (``"text"``): no ``tools``
    parameter; the tools prompt goes into the system message, the history's tool calls and
    results are rewritten as text, and calls are parsed out of the reply while a
    :class:`~llm.toolcall_parsing.ToolCallHoldback` keeps them out of the streamed text.

    ``read_timeout_seconds`` bounds the wait for the response headers (httpx) and for every
    chunk (our asyncio timer, so a provider that keeps the connection open but sends nothing
    cannot stall us). The router adds the first-token and whole-stream timers around this
    generator.

    Args:
        entry: The route entry to call.
        messages: Canonical history.
        tools: Offered tools (may be empty).
        max_output_tokens: Optional cap below the entry's own ``max_output_tokens``.
        on_first_token: Called once, synchronously, when the first content, reasoning or
            tool-call fragment arrives (before anything is yielded for it). The router uses it
            to stop falling back.
        tool_choice: A :attr:`~llm.model.ModelSettings.tool_choice` (see
            :func:`build_request`); with ``"none"``, calls a text-mode model writes anyway are
            dropped (kept out of the text all the same).
        response_format: The answer's JSON format for entries with native JSON-schema mode
            (see :func:`build_request`).
        capture: Filled with the bodies when given: ``request``, the JSON text posted (exactly
            the bytes sent); ``response``, the stream assembled as a ``chat.completion``
            object (:func:`assembled_response`) once it ended with a completion.

    Yields:
        ``TextDelta`` and ``ReasoningDelta`` fragments, then exactly one ``Completion`` (the
        whole assistant message; usage from the provider, else estimated with
        ``Usage.estimated=True``; ``entry_index``/``model`` from ``entry``).

    Raises:
        ModelCallError: connection, HTTP status, idle timeout or stream-decoding failure;
            ``content_policy`` when the stream finishes with ``finish_reason:
            "content_filter"`` (raised instead of the ``Completion``); ``bad_request`` for a
            ``tool_choice`` the offered tools cannot meet (before any request).
    """
    params, sent = build_request(entry, messages, tools, max_output_tokens=max_output_tokens, tool_choice=tool_choice,
                                 response_format=response_format)
    text_mode = entry.tool_calls == "text"
    shard = _shard_for(entry)
    shard.open_streams += 1
    try:
        async for event in _stream(entry, shard.http, params, sent, tools, text_mode, on_first_token,
                                   drop_text_calls=tool_choice == "none", capture=capture):
            yield event
    finally:
        shard.open_streams -= 1


class _StreamState:
    """What one streamed completion has gathered so far: text, reasoning, tool-call fragments,
    usage and finish reason, with the first-token hook fired once.

    :meth:`read` takes one read's payloads and returns that read's deltas; :meth:`end` turns the
    whole into the tail delta and the ``Completion``.
    """

    __slots__ = ("holdback", "assembler", "text_parts", "reasoning_parts", "usage", "finish_reason",
                 "started", "on_first_token")

    def __init__(self, text_mode: bool, on_first_token: Callable[[], None] | None) -> None:
        self.holdback = ToolCallHoldback() if text_mode else None
        self.assembler = _ToolCallAssembler()
        self.text_parts: list[str] = []
        self.reasoning_parts: list[str] = []
        self.usage: Any = None
        self.finish_reason: str | None = None
        self.started = False
        self.on_first_token = on_first_token

    def read(self, chunks: list[Any]) -> list[tuple[type[TextDelta] | type[ReasoningDelta], str]]:
        """This read's ``(delta class, text)`` pieces, in order, from its parsed payloads.

        Raises:
            ModelCallError: ``other`` for a payload that is not a JSON object.
        """
        pieces: list[tuple[type[TextDelta] | type[ReasoningDelta], str]] = []
        for chunk in chunks:
            if not isinstance(chunk, dict):
                raise ModelCallError("other", f"unexpected stream chunk: {str(chunk)[:200]}")
            chunk_usage = chunk.get("usage")
            if chunk_usage is not None:
                self.usage = chunk_usage
            for choice in chunk.get("choices") or ():
                if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                    continue
                if choice.get("finish_reason"):
                    self.finish_reason = choice["finish_reason"]
                delta = choice.get("delta")
                if isinstance(delta, dict):
                    self._delta(delta, pieces)
        return pieces

    def _delta(self, delta: dict[str, Any], pieces: list[tuple[type[TextDelta] | type[ReasoningDelta], str]]) -> None:
        """Take one choice's ``delta``: reasoning and text appended to ``pieces`` (text after the
        text-mode holdback), tool-call fragments to the assembler."""
        reasoning = _reasoning_text(delta)
        content = delta.get("content")
        if not isinstance(content, str):
            content = None
        tool_fragments = delta.get("tool_calls")
        if not self.started and (reasoning or content or tool_fragments):
            self.started = True
            if self.on_first_token is not None:
                self.on_first_token()
        if reasoning:
            self.reasoning_parts.append(reasoning)
            pieces.append((ReasoningDelta, reasoning))
        if content:
            if self.holdback is not None:
                content = self.holdback.feed(content)
            if content:
                self.text_parts.append(content)
                pieces.append((TextDelta, content))
        if tool_fragments and isinstance(tool_fragments, list):
            for fragment in tool_fragments:
                self.assembler.add(fragment)

    def end(
        self, entry: RouteEntryConfig, sent: list[ChatMessage], tools: Sequence[ToolSpec], *, drop_text_calls: bool
    ) -> tuple[TextDelta | None, Completion]:
        """The text the holdback still held (``None`` if none) and the ``Completion``.

        Text-mode calls join the native ones (none with ``drop_text_calls``) and turn a
        ``stop`` (or missing) finish reason into ``tool_calls``.

        Raises:
            ModelCallError: ``content_policy`` when the finish reason says so.
        """
        finish_reason = self.finish_reason
        policy_failure = classify_finish_reason(finish_reason)
        if policy_failure is not None:
            raise policy_failure
        calls = self.assembler.result()
        tail_delta: TextDelta | None = None
        if self.holdback is not None:
            tail, text_calls = self.holdback.finish()
            if tail:
                self.text_parts.append(tail)
                tail_delta = TextDelta(tail)
            if drop_text_calls:
                text_calls = []
            calls = calls + text_calls
            if text_calls and finish_reason in (None, "stop"):
                finish_reason = "tool_calls"
        message = ChatMessage(role="assistant", content="".join(self.text_parts), tool_calls=tuple(calls))
        completion = Completion(
            message=message,
            usage=_usage(self.usage, sent, () if self.holdback is not None else tools, message,
                         "".join(self.reasoning_parts)),
            finish_reason=finish_reason,
            entry_index=entry.index,
            model=entry.model,
        )
        return tail_delta, completion


async def _stream(
    entry: RouteEntryConfig, http: httpx2.AsyncClient, params: dict[str, Any], sent: list[ChatMessage],
    tools: Sequence[ToolSpec], text_mode: bool, on_first_token: Callable[[], None] | None, *,
    drop_text_calls: bool = False, capture: BodyCapture | None = None,
) -> AsyncIterator[TextDelta | ReasoningDelta | Completion]:
    if capture is None:
        response = await _open_stream(_client_for(entry), http, params)
    else:  # the very bytes posted are the record's request
        body = json.dumps(params).encode()
        capture.request = body.decode()
        response = await _open_stream(_client_for(entry), http, params, body)
    payloads = _sse_payloads(response, entry.read_timeout_seconds)
    state = _StreamState(text_mode, on_first_token)
    try:
        while True:
            chunks = await _next_payloads(payloads, entry.read_timeout_seconds)
            if chunks is None:
                break
            pieces = state.read(chunks)
            # One delta per run of the same kind in this read (most reads bring one piece).
            if len(pieces) == 1:
                kind, text = pieces[0]
                yield kind(text)
            else:
                for kind, run in itertools.groupby(pieces, key=lambda piece: piece[0]):
                    yield kind("".join(text for _, text in run))
    finally:
        await payloads.aclose()  # closes the response (its connection goes back to the pool or is closed)
        await response.aclose()  # in case the parser never started

    tail, completion = state.end(entry, sent, tools, drop_text_calls=drop_text_calls)
    if capture is not None:
        capture.response = assembled_response(completion, usage=state.usage,
                                              reasoning="".join(state.reasoning_parts))
    if tail is not None:
        yield tail
    yield completion


def assembled_response(completion: Completion, *, usage: Any, reasoning: str = "") -> dict[str, Any]:
    """A streamed answer as the ``chat.completion`` object a non-streamed call would have
    returned: ``{"object": "chat.completion", "model", "choices": [{"index": 0, "message":
    {"role": "assistant", "content", "tool_calls"?, "reasoning_content"?}, "finish_reason"}],
    "usage"}``. ``usage``: the provider's own usage object as streamed (None when it sent
    none); ``tool_calls``: the reassembled calls (``{"id", "type": "function", "function":
    {"name", "arguments"}}``; in text mode, the calls parsed out of the text, which
    ``content`` then lacks, as the model's reader saw it)."""
    message: dict[str, Any] = {"role": "assistant", "content": completion.message.content}
    if completion.message.tool_calls:
        message["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in completion.message.tool_calls
        ]
    if reasoning:
        message["reasoning_content"] = reasoning
    return {
        "object": "chat.completion", "model": completion.model,
        "choices": [{"index": 0, "message": message, "finish_reason": completion.finish_reason}],
        "usage": usage,
    }


def _usage(
    reported: Any, sent: Sequence[ChatMessage], tools: Sequence[ToolSpec], message: ChatMessage, reasoning: str
) -> Usage:
    def count(name: str) -> int | None:
        value = reported.get(name) if isinstance(reported, dict) else None
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    return usage_or_estimate(
        prompt_tokens=count("prompt_tokens"), completion_tokens=count("completion_tokens"),
        messages=sent, tools=tools, message=message, reasoning=reasoning,
    )


class OpenAICompatModel:
    """The :class:`~llm.model.Model` of one route entry on an OpenAI-compatible chat-completions endpoint.

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
            tool_choice=settings.tool_choice, response_format=settings.response_format, capture=capture,
        )


__all__ = ["OpenAICompatModel", "aclose_clients", "assembled_response", "build_request", "stream_chat"]
