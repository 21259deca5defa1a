"""``FakeLLMServer``: a real OpenAI-compatible HTTP server for tests and benchmarks.

It listens on ``127.0.0.1`` (random free port) and runs its own event loop in a background
thread, so sync tests, async tests and other processes (a Celery worker subprocess) can all
talk to it over real sockets. Responses are scripted::

    with FakeLLMServer() as server:
        server.script(Reply("Hello there"), ToolCalls([("get_time", {"tz": "UTC"})]), Fail(503))
        ... point a route entry at server.base_url ("http://127.0.0.1:PORT/v1") ...
        assert server.requests[0]["model"] == "m"

Each ``POST …/chat/completions`` consumes one step, first in first out; with no step left
(and no :meth:`FakeLLMServer.respond` hook) it answers HTTP 500 with the body
``FakeLLMServer: no scripted step left`` so the test fails loudly. ``GET …/models`` lists one
model. Streaming requests get Server-Sent Events (with a final usage chunk when
``stream_options.include_usage`` is set); ``stream=false`` requests get a JSON completion.
``POST …/rerank`` (the rerank API, :func:`llm.embeddings.arerank`) is answered by the
function set with :meth:`FakeLLMServer.rerank_with`.

The server is a small asyncio HTTP/1.1 implementation (keep-alive, chunked responses), using
uvloop when installed, so hundreds of concurrent streams cost little. Pure Python, no Django.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import json
import math
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Final, Self

NO_STEP_LEFT: Final[str] = "FakeLLMServer: no scripted step left"
DEFAULT_MODEL: Final[str] = "fake-model"
_STOP_TIMEOUT_SECONDS: Final[float] = 5.0


# --- Steps ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Reply:
    """Answer with text, streamed as several SSE chunks."""

    text: str = ""
    chunk_size: int = 4
    """Characters per content chunk (positive)."""
    reasoning: str = ""
    """Streamed first as ``reasoning_content`` chunks (non-streaming: a message field)."""
    finish_reason: str = "stop"
    include_usage: bool = True
    """False: never report usage, even when the client asks (tests the estimate)."""
    usage: tuple[int, int] | None = None
    """``(prompt_tokens, completion_tokens)`` to report; default: a chars/4 count."""
    chunk_interval_seconds: float = 0.0
    """Pause between chunks (simulated generation speed for benchmarks)."""


@dataclass(frozen=True, slots=True)
class ToolCalls:
    """Answer with native tool calls; arguments are split across several chunks."""

    calls: Sequence[tuple[str, Mapping[str, Any]]]
    """``[(name, arguments_dict), …]``."""
    text: str = ""
    """Content streamed before the calls."""
    chunk_size: int = 8
    """Characters of argument JSON (and of text) per chunk."""
    include_usage: bool = True
    usage: tuple[int, int] | None = None
    chunk_interval_seconds: float = 0.0


@dataclass(frozen=True, slots=True)
class Fail:
    """Answer with an HTTP error (e.g. 500, 503, 429 with ``Retry-After``, 400, 401)."""

    status: int
    body: Mapping[str, Any] | None = None
    """JSON body; default ``{"error": {"message": ..., "type": ..., "code": null}}``."""
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Hang:
    """Accept the request and send nothing until ``seconds`` pass (then drop the connection),
    the client goes away or the server stops."""

    seconds: float = 3600.0


@dataclass(frozen=True, slots=True)
class CutAfter:
    """Stream ``n_chunks`` content chunks of ``text`` then drop the connection mid-stream."""

    text: str
    n_chunks: int
    chunk_size: int = 4


@dataclass(frozen=True, slots=True)
class Stall:
    """Stream the first ``n_chunks`` chunks of ``step`` (after the initial role chunk), then
    send nothing until ``seconds`` pass (then drop the connection), the client goes away or
    the server stops: a provider that hangs between chunks. Streaming requests only
    (non-streaming ones get a plain :class:`Hang`)."""

    step: Reply | ToolCalls
    n_chunks: int
    seconds: float = 3600.0


@dataclass(frozen=True, slots=True)
class Delay:
    """Wait ``seconds`` before performing ``step``."""

    seconds: float
    step: Step


Step = Reply | ToolCalls | Fail | Hang | CutAfter | Stall | Delay
Responder = Callable[[dict[str, Any]], "Step | None | Awaitable[Step | None]"]
Reranker = Callable[[str, list[str]], "Sequence[float] | Fail"]
"""``fn(query, documents) -> one score per document`` (or a :class:`Fail`), for ``POST …/rerank``."""


# --- HTTP plumbing -------------------------------------------------------------------------

_REASONS: Final[dict[int, str]] = {
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    408: "Request Timeout",
    413: "Payload Too Large",
    422: "Unprocessable Entity",
    429: "Too Many Requests",
    500: "Internal Server Error",
    502: "Bad Gateway",
    503: "Service Unavailable",
    504: "Gateway Timeout",
}


class _ClientGone(Exception):
    """The client closed the connection while we were answering."""


def _chunks(text: str, size: int) -> list[str]:
    size = max(1, size)
    return [text[i : i + size] for i in range(0, len(text), size)]


def _sse_frame(payload: str) -> bytes:
    data = f"data: {payload}\n\n".encode()
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


_SSE_HEAD: Final[bytes] = (
    b"HTTP/1.1 200 OK\r\n"
    b"content-type: text/event-stream; charset=utf-8\r\n"
    b"cache-control: no-cache\r\n"
    b"transfer-encoding: chunked\r\n"
    b"\r\n"
)
_SSE_END: Final[bytes] = _sse_frame("[DONE]") + b"0\r\n\r\n"


class FakeLLMServer:
    """A scripted OpenAI-compatible chat-completions server on 127.0.0.1 (see module doc).

    Args:
        model: Model id listed by ``GET /v1/models`` and echoed when a request has none.

    Thread-safe: :meth:`script`, :meth:`respond`, :attr:`requests` and the ``wait_for_*``
    methods may be called from any thread while the server runs.
    """

    def __init__(self, *, model: str = DEFAULT_MODEL) -> None:
        self.model = model
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._steps: deque[Step] = deque()
        self._responder: Responder | None = None
        self._requests: list[dict[str, Any]] = []
        self._reranker: Reranker | None = None
        self._rerank_requests: list[dict[str, Any]] = []
        self._disconnects = 0
        self._connections = 0
        self._ids = itertools.count(1)
        self._port: int | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.AbstractServer | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._ready = threading.Event()
        self._start_error: BaseException | None = None

    # -- lifecycle --

    def start(self) -> Self:
        """Start listening (idempotent). Returns self.

        Raises:
            RuntimeError: the server thread could not bind a port within 5 s.
        """
        if self._thread is not None:
            return self
        self._thread = threading.Thread(target=self._run, name="FakeLLMServer", daemon=True)
        self._thread.start()
        if not self._ready.wait(_STOP_TIMEOUT_SECONDS) or self._start_error is not None:
            raise RuntimeError(f"FakeLLMServer failed to start: {self._start_error!r}")
        return self

    def stop(self) -> None:
        """Stop: cancel every open request (hanging ones too), close the port, join the thread."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        if loop.is_running():
            future = asyncio.run_coroutine_threadsafe(self._shutdown(), loop)
            try:
                future.result(_STOP_TIMEOUT_SECONDS)
            except TimeoutError:
                future.cancel()
            loop.call_soon_threadsafe(loop.stop)
        thread.join(_STOP_TIMEOUT_SECONDS)
        self._thread = None
        self._loop = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("FakeLLMServer is not started")
        return self._port

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT/v1``."""
        return f"http://127.0.0.1:{self.port}/v1"

    # -- scripting --

    def script(self, *steps: Step) -> None:
        """Queue steps, consumed one per chat-completions request, first in first out."""
        for step in steps:
            if not isinstance(step, (Reply, ToolCalls, Fail, Hang, CutAfter, Stall, Delay)):
                raise TypeError(f"not a FakeLLMServer step: {step!r}")
        with self._lock:
            self._steps.extend(steps)

    def respond(self, fn: Responder | None) -> None:
        """Answer requests with ``fn(body)`` when no scripted step is left.

        ``fn`` runs on the server's thread with the request's JSON body and returns a step
        (or an awaitable of one; None answers the "no scripted step left" 500). For load
        tests where many concurrent runs share one server. ``None`` removes the hook.
        """
        with self._lock:
            self._responder = fn

    def rerank_with(self, fn: Reranker | None) -> None:
        """Answer ``POST …/rerank`` with ``fn(query, documents)``: one score per document, or a
        :class:`Fail` for an error status. The answer lists the ``top_n`` best first, as rerank
        servers do (a client maps them back by ``index``). ``fn`` runs on the server's thread;
        None (the default) answers 404."""
        with self._lock:
            self._reranker = fn

    @property
    def rerank_requests(self) -> list[dict[str, Any]]:
        """JSON bodies of the rerank requests received so far (a copy), in order."""
        with self._lock:
            return list(self._rerank_requests)

    def clear(self) -> None:
        """Forget queued steps, the hooks, received requests and the counters."""
        with self._lock:
            self._steps.clear()
            self._responder = None
            self._reranker = None
            self._rerank_requests.clear()
            self._requests.clear()
            self._disconnects = 0
            self._connections = 0

    @property
    def pending_steps(self) -> int:
        with self._lock:
            return len(self._steps)

    @property
    def requests(self) -> list[dict[str, Any]]:
        """JSON bodies of the chat-completions requests received so far (a copy), in order."""
        with self._lock:
            return list(self._requests)

    @property
    def connections_accepted(self) -> int:
        """TCP connections accepted so far (fewer than requests when clients pool connections)."""
        with self._lock:
            return self._connections

    @property
    def client_disconnects(self) -> int:
        """How many answers were abandoned because the client closed the connection."""
        with self._lock:
            return self._disconnects

    def wait_for_requests(self, count: int, *, timeout_seconds: float = 5.0) -> bool:
        """Block until at least ``count`` requests arrived; False on timeout."""
        with self._changed:
            return self._changed.wait_for(lambda: len(self._requests) >= count, timeout_seconds)

    def wait_for_disconnects(self, count: int, *, timeout_seconds: float = 5.0) -> bool:
        """Block until at least ``count`` client disconnects were seen; False on timeout."""
        with self._changed:
            return self._changed.wait_for(lambda: self._disconnects >= count, timeout_seconds)

    async def await_requests(self, count: int, *, timeout_seconds: float = 5.0) -> bool:
        """:meth:`wait_for_requests` for async code (waits in a worker thread)."""
        return await asyncio.to_thread(self.wait_for_requests, count, timeout_seconds=timeout_seconds)

    async def await_disconnects(self, count: int, *, timeout_seconds: float = 5.0) -> bool:
        """:meth:`wait_for_disconnects` for async code (waits in a worker thread)."""
        return await asyncio.to_thread(self.wait_for_disconnects, count, timeout_seconds=timeout_seconds)

    # -- server thread --

    def _run(self) -> None:
        try:
            import uvloop

            loop = uvloop.new_event_loop()
        except ImportError:  # pragma: no cover - uvloop comes with uvicorn[standard]
            loop = asyncio.new_event_loop()
        self._loop = loop
        asyncio.set_event_loop(loop)
        try:
            self._server = loop.run_until_complete(
                asyncio.start_server(self._handle, "127.0.0.1", 0, backlog=2048, limit=2**20)
            )
            self._port = self._server.sockets[0].getsockname()[1]
        except OSError as exc:
            self._start_error = exc
            self._ready.set()
            loop.close()
            return
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _note_disconnect(self) -> None:
        with self._changed:
            self._disconnects += 1
            self._changed.notify_all()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)  # type: ignore[arg-type]
        with self._lock:
            self._connections += 1
        try:
            while True:
                request = await self._read_request(reader)
                if request is None:
                    break
                method, path, headers, body = request
                keep_alive = await self._dispatch(method, path, body, reader, writer)
                if not keep_alive or headers.get("connection", "").lower() == "close":
                    break
        except _ClientGone:
            self._note_disconnect()
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        except asyncio.CancelledError:
            # Only stop() cancels handlers; ending quietly keeps asyncio's stream callback
            # from logging the cancellation as an error.
            pass
        finally:
            writer.close()
            if task is not None:
                self._tasks.discard(task)  # type: ignore[arg-type]

    @staticmethod
    async def _read_request(
        reader: asyncio.StreamReader,
    ) -> tuple[str, str, dict[str, str], bytes] | None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError:
            return None
        lines = head.decode("latin-1").split("\r\n")
        method, _, rest = lines[0].partition(" ")
        path = rest.partition(" ")[0].partition("?")[0]
        headers: dict[str, str] = {}
        for line in lines[1:]:
            if line:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
        if headers.get("transfer-encoding", "").lower() == "chunked":
            parts = []
            while True:
                size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
                if size == 0:
                    await reader.readuntil(b"\r\n")
                    break
                parts.append(await reader.readexactly(size))
                await reader.readexactly(2)
            body = b"".join(parts)
        else:
            length = int(headers.get("content-length") or 0)
            body = await reader.readexactly(length) if length else b""
        return method.upper(), path, headers, body

    async def _dispatch(
        self, method: str, path: str, raw: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        if method == "GET" and path.rstrip("/").endswith("/models"):
            data = {
                "object": "list",
                "data": [{"id": self.model, "object": "model", "created": 0, "owned_by": "fake-llm-server"}],
            }
            await self._send_json(writer, 200, data)
            return True
        if method == "POST" and path.rstrip("/").endswith("/rerank"):
            await self._rerank(raw, writer)
            return True
        if method != "POST" or not path.rstrip("/").endswith("/chat/completions"):
            await self._send_json(writer, 404, {"error": {"message": f"FakeLLMServer: no route {method} {path}"}})
            return True
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            await self._send_json(writer, 400, {"error": {"message": "FakeLLMServer: body is not JSON"}})
            return True
        if not isinstance(body, dict):
            body = {"_raw": body}
        with self._changed:
            self._requests.append(body)
            step: Step | None = self._steps.popleft() if self._steps else None
            responder = self._responder
            self._changed.notify_all()
        if step is None and responder is not None:
            produced = responder(body)
            step = await produced if inspect.isawaitable(produced) else produced
        if step is None:
            await self._send_json(
                writer, 500, {"error": {"message": NO_STEP_LEFT, "type": "fake_llm_server_error", "code": None}}
            )
            return True
        return await self._perform(step, body, reader, writer)

    async def _rerank(self, raw: bytes, writer: asyncio.StreamWriter) -> None:
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            await self._send_json(writer, 400, {"error": {"message": "FakeLLMServer: body is not JSON"}})
            return
        body = body if isinstance(body, dict) else {"_raw": body}
        with self._changed:
            self._rerank_requests.append(body)
            reranker = self._reranker
            self._changed.notify_all()
        if reranker is None:
            await self._send_json(writer, 404, {"error": {"message": "FakeLLMServer: no reranker set"}})
            return
        answer = reranker(str(body.get("query", "")), [str(d) for d in body.get("documents") or []])
        if isinstance(answer, Fail):
            await self._send_json(writer, answer.status, answer.body or _error_body(answer.status),
                                  headers=answer.headers)
            return
        results = sorted(({"index": i, "relevance_score": float(s)} for i, s in enumerate(answer)),
                         key=lambda r: -r["relevance_score"])
        top_n = body.get("top_n")
        if isinstance(top_n, int) and not isinstance(top_n, bool):
            results = results[:top_n]
        await self._send_json(writer, 200, {"model": body.get("model"), "results": results})

    async def _perform(
        self, step: Step, body: dict[str, Any], reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        while isinstance(step, Delay):
            await asyncio.sleep(step.seconds)
            step = step.step
        if isinstance(step, Fail):
            data = step.body if step.body is not None else _error_body(step.status)
            await self._send_json(writer, step.status, data, headers=step.headers)
            return True
        streaming = bool(body.get("stream"))
        if isinstance(step, Stall) and not streaming:
            step = Hang(step.seconds)
        if isinstance(step, Hang):
            await self._hang(step.seconds, reader)
            return False
        model = str(body.get("model") or self.model)
        completion_id = f"chatcmpl-fake{next(self._ids)}"
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        if isinstance(step, Stall):
            payloads = self._payloads(step.step, body, model, completion_id, include_usage)
            writer.write(_SSE_HEAD + b"".join(_sse_frame(p) for p in payloads[: 1 + max(0, step.n_chunks)]))
            await writer.drain()
            await self._hang(step.seconds, reader)
            return False  # the handler closes the connection (FIN after the buffered chunks)
        if isinstance(step, CutAfter):
            if streaming:
                chunks = _chunks(step.text, step.chunk_size)[: max(0, step.n_chunks)]
                frames = [_sse_frame(_chunk_json(completion_id, model, {"role": "assistant", "content": ""}))]
                frames += [_sse_frame(_chunk_json(completion_id, model, {"content": c})) for c in chunks]
                writer.write(_SSE_HEAD + b"".join(frames))
            else:
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 100000\r\n\r\n"
                    + b'{"id": "' + completion_id.encode()
                )
            await writer.drain()
            return False  # the handler closes the connection (FIN after the buffered chunks)
        if streaming:
            payloads = self._payloads(step, body, model, completion_id, include_usage)
            await self._stream(payloads, step.chunk_interval_seconds, reader, writer)
        else:
            await self._send_json(writer, 200, _completion_json(step, body, model, completion_id))
        return True

    @staticmethod
    async def _hang(seconds: float, reader: asyncio.StreamReader) -> None:
        """Wait ``seconds`` or until the client goes away (raises ``_ClientGone``)."""
        try:
            async with asyncio.timeout(seconds):
                got = await reader.read(1)
        except TimeoutError:
            return
        if not got:
            raise _ClientGone()

    def _payloads(
        self, step: Reply | ToolCalls, body: dict[str, Any], model: str, completion_id: str, include_usage: bool
    ) -> list[str]:
        """The JSON payloads of the SSE events for ``step`` (without ``[DONE]``)."""
        usage_null = include_usage and step.include_usage
        deltas: list[dict[str, Any]] = [{"role": "assistant", "content": ""}]
        if isinstance(step, Reply):
            deltas += [{"reasoning_content": c} for c in _chunks(step.reasoning, step.chunk_size)]
            deltas += [{"content": c} for c in _chunks(step.text, step.chunk_size)]
            finish = step.finish_reason
        else:
            deltas += [{"content": c} for c in _chunks(step.text, step.chunk_size)]
            for index, (name, arguments) in enumerate(step.calls):
                deltas.append(
                    {
                        "tool_calls": [
                            {
                                "index": index,
                                "id": f"call_fake{next(self._ids)}",
                                "type": "function",
                                "function": {"name": name, "arguments": ""},
                            }
                        ]
                    }
                )
                for piece in _chunks(json.dumps(dict(arguments)), step.chunk_size):
                    deltas.append({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
            finish = "tool_calls"
        payloads = [_chunk_json(completion_id, model, d, usage_null=usage_null) for d in deltas]
        payloads.append(_chunk_json(completion_id, model, {}, finish_reason=finish, usage_null=usage_null))
        if include_usage and step.include_usage:
            prompt, completion = _usage_numbers(step, body)
            payloads.append(
                json.dumps(
                    {
                        "id": completion_id,
                        "object": "chat.completion.chunk",
                        "created": int(time.time()),
                        "model": model,
                        "choices": [],
                        "usage": {
                            "prompt_tokens": prompt,
                            "completion_tokens": completion,
                            "total_tokens": prompt + completion,
                        },
                    }
                )
            )
        return payloads

    @staticmethod
    async def _stream(
        payloads: list[str], interval: float, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        if interval <= 0:
            writer.write(_SSE_HEAD + b"".join(_sse_frame(p) for p in payloads) + _SSE_END)
            await writer.drain()
            return
        writer.write(_SSE_HEAD)
        for payload in payloads:
            if reader.at_eof() or writer.transport.is_closing():
                raise _ClientGone()
            writer.write(_sse_frame(payload))
            try:
                await writer.drain()
            except ConnectionError as exc:
                raise _ClientGone() from exc
            await asyncio.sleep(interval)
        writer.write(_SSE_END)
        await writer.drain()

    @staticmethod
    async def _send_json(
        writer: asyncio.StreamWriter, status: int, data: Any, *, headers: Mapping[str, str] | None = None
    ) -> None:
        payload = json.dumps(data).encode()
        head = [f"HTTP/1.1 {status} {_REASONS.get(status, 'Status')}", "content-type: application/json"]
        head.append(f"content-length: {len(payload)}")
        for name, value in (headers or {}).items():
            head.append(f"{name}: {value}")
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + payload)
        await writer.drain()


def _error_body(status: int) -> dict[str, Any]:
    kind = "rate_limit_error" if status == 429 else "server_error" if status >= 500 else "invalid_request_error"
    return {"error": {"message": f"FakeLLMServer scripted failure (HTTP {status})", "type": kind, "code": None}}


def _chunk_json(
    completion_id: str,
    model: str,
    delta: dict[str, Any],
    *,
    finish_reason: str | None = None,
    usage_null: bool = False,
) -> str:
    chunk: dict[str, Any] = {
        "id": completion_id,
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
    }
    if usage_null:
        chunk["usage"] = None
    return json.dumps(chunk)


def _usage_numbers(step: Reply | ToolCalls, body: dict[str, Any]) -> tuple[int, int]:
    if step.usage is not None:
        return step.usage
    prompt = max(1, math.ceil(len(json.dumps(body.get("messages", []))) / 4))
    generated = len(step.text)
    if isinstance(step, Reply):
        generated += len(step.reasoning)
    else:
        generated += sum(len(name) + len(json.dumps(dict(args))) for name, args in step.calls)
    return prompt, max(1, math.ceil(generated / 4))


def _completion_json(step: Reply | ToolCalls, body: dict[str, Any], model: str, completion_id: str) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": step.text}
    if isinstance(step, Reply):
        finish = step.finish_reason
        if step.reasoning:
            message["reasoning_content"] = step.reasoning
    else:
        finish = "tool_calls"
        message["content"] = step.text or None
        message["tool_calls"] = [
            {
                "id": f"call_fake{i}",
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(dict(args))},
            }
            for i, (name, args) in enumerate(step.calls)
        ]
    out: dict[str, Any] = {
        "id": completion_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
    }
    if step.include_usage:
        prompt, completion = _usage_numbers(step, body)
        out["usage"] = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
    return out


__all__ = [
    "NO_STEP_LEFT",
    "CutAfter",
    "Delay",
    "Fail",
    "FakeLLMServer",
    "Hang",
    "Reply",
    "Stall",
    "Step",
    "ToolCalls",
]


def fake_dns(monkeypatch: Any, answers: Mapping[str, str | Exception]) -> None:
    """Make ``socket.getaddrinfo`` answer the names in ``answers`` (a name -> an IP address, or an
    exception to raise, e.g. ``socket.gaierror``) and resolve every other name as usual.

    Only the names a test is about are faked: a global fake would also send the test's own
    connections (Redis, PostgreSQL) to the fake address, a public one in some tests.
    """
    import socket

    real = socket.getaddrinfo

    def getaddrinfo(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        name = host.decode() if isinstance(host, bytes) else host
        answer = answers.get(str(name).rstrip(".").lower()) if name is not None else None
        if answer is None:
            return real(host, port, *args, **kwargs)
        if isinstance(answer, Exception):
            raise answer
        family = socket.AF_INET6 if ":" in answer else socket.AF_INET
        sockaddr = (answer, int(port or 0), 0, 0) if family == socket.AF_INET6 else (answer, int(port or 0))
        return [(family, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", sockaddr)]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
