"""An httpx2 transport that takes malformed tools out of ``tools/list`` answers
(:class:`ToolListFilter`), so one bad tool does not take a whole MCP server away: the SDK
validates a page at once. Each tool left out is reported in the connection's
:attr:`HttpStatusLog.skipped_tools <capabilities.mcp.http_log.HttpStatusLog.skipped_tools>`.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import httpx2
import mcp_types
from pydantic import ValidationError

from capabilities.mcp.http_log import HttpStatusLog

logger = logging.getLogger(__name__)

_MAX_FILTERED_JSON_BYTES = 8_000_000
"""A JSON answer longer than this is passed on unfiltered (the SDK then judges it whole)."""


def _filter_tool_list(message: Any, log: HttpStatusLog) -> Any | None:
    """The JSON-RPC message (or batch) with malformed ``result.tools`` entries removed, or None
    when nothing had to change."""
    if isinstance(message, list):
        out = [_filter_tool_list(item, log) for item in message]
        return None if all(o is None for o in out) else [o if o is not None else m for o, m in zip(out, message, strict=False)]
    if not isinstance(message, dict):
        return None
    result = message.get("result")
    tools = result.get("tools") if isinstance(result, dict) else None
    if not isinstance(tools, list):
        return None
    kept = [raw for index, raw in enumerate(tools) if _tool_valid(raw, index, log)]
    if len(kept) == len(tools):
        return None
    return {**message, "result": {**result, "tools": kept}}


def _tool_valid(raw: Any, index: int, log: HttpStatusLog) -> bool:
    """Whether ``raw`` (the ``index``-th tool of a listing) is a valid MCP tool; a malformed one
    is recorded in ``log.skipped_tools`` and logged."""
    try:
        mcp_types.Tool.model_validate(raw, by_name=False)
    except ValidationError as exc:
        name = raw.get("name") if isinstance(raw, dict) else None
        label = repr(name[:80]) if isinstance(name, str) else f"#{index + 1}"
        errors = exc.errors()
        problem = errors[0]["msg"] if errors else "invalid"
        where = ".".join(str(p) for p in errors[0]["loc"]) if errors else ""
        log.skipped_tools.append(f"tool {label} skipped: {where + ': ' if where else ''}{problem}")
        logger.warning("MCP server answer: skipping malformed tool %s: %s", label, problem)
        return False
    return True


class _SseToolListFilter(httpx2.AsyncByteStream):
    """An SSE byte stream whose ``tools/list`` results lose their malformed tools (each event
    is passed on when complete; other events unchanged)."""

    def __init__(self, inner: Any, log: HttpStatusLog) -> None:
        self._inner = inner
        self._log = log

    async def __aiter__(self) -> Any:
        buffer = b""
        async for chunk in self._inner:
            buffer += chunk
            while True:
                ends = [i for i in (buffer.find(b"\n\n"), buffer.find(b"\r\n\r\n")) if i >= 0]
                if not ends:
                    break
                end = min(ends)
                size = 4 if buffer[end:end + 4] == b"\r\n\r\n" else 2
                block, buffer = buffer[: end + size], buffer[end + size:]
                yield self._event(block)
        if buffer:
            yield buffer

    def _event(self, block: bytes) -> bytes:
        if b'"tools"' not in block:
            return block
        lines = block.decode("utf-8", errors="replace").splitlines()
        data = [line[5:].lstrip(" ") if line.startswith("data:") else None for line in lines]
        payload = "\n".join(d for d in data if d is not None)
        try:
            filtered = _filter_tool_list(json.loads(payload), self._log)
        except ValueError:
            return block
        if filtered is None:
            return block
        others = [line for line, d in zip(lines, data, strict=False) if d is None and line]
        return ("\n".join([*others, "data: " + json.dumps(filtered)]) + "\n\n").encode()

    async def aclose(self) -> None:
        await self._inner.aclose()


class ToolListFilter(httpx2.AsyncBaseTransport):
    """An httpx2 transport around another that takes malformed tools out of ``tools/list``
    answers (JSON and SSE), recording them in ``log.skipped_tools``: the SDK validates a
    whole page at once, so one malformed tool would otherwise fail the whole listing (and
    the server). Compressed answers are passed on as they are."""

    def __init__(self, inner: httpx2.AsyncBaseTransport, log: HttpStatusLog) -> None:
        self._inner = inner
        self._log = log

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        response = await self._inner.handle_async_request(request)
        if response.headers.get("content-encoding", "identity").lower() not in ("", "identity"):
            return response
        kind = response.headers.get("content-type", "").split(";")[0].strip().lower()
        if kind == "text/event-stream":
            return httpx2.Response(response.status_code, headers=response.headers,
                                   stream=_SseToolListFilter(response.stream, self._log),
                                   extensions=response.extensions, request=request)
        if kind != "application/json":
            return response
        body = b""
        async for chunk in response.stream:
            body += chunk
            if len(body) > _MAX_FILTERED_JSON_BYTES:
                break
        else:
            await response.aclose()
            filtered = None
            if b'"tools"' in body:
                try:
                    filtered = _filter_tool_list(json.loads(body), self._log)
                except ValueError:
                    filtered = None
            if filtered is not None:
                body = json.dumps(filtered).encode()
            headers = [(k, v) for k, v in response.headers.multi_items() if k.lower() != "content-length"]
            return httpx2.Response(response.status_code, headers=[*headers, ("content-length", str(len(body)))],
                                   content=body, extensions=response.extensions, request=request)
        # Too long to filter: pass on what was read and the rest.
        rest = response.stream

        async def replay() -> Any:
            yield body
            async for chunk in rest:
                yield chunk

        return httpx2.Response(response.status_code, headers=response.headers, stream=_Replay(replay(), rest),
                               extensions=response.extensions, request=request)

    async def aclose(self) -> None:
        await self._inner.aclose()


class _Replay(httpx2.AsyncByteStream):
    def __init__(self, chunks: Any, inner: Any) -> None:
        self._chunks = chunks
        self._inner = inner

    async def __aiter__(self) -> Any:
        async for chunk in self._chunks:
            yield chunk

    async def aclose(self) -> None:
        await self._inner.aclose()
