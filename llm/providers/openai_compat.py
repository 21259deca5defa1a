"""Adapter for OpenAI-compatible chat-completions APIs (OpenAI, vLLM, llama.cpp, Ollama, …).

One streaming call per :func:`stream_chat`, over a pooled ``openai.AsyncOpenAI`` client with
SDK retries off (the router is the only retry loop). Everything provider-specific about this
wire format stays in this module: request building, chunk parsing, tool-call reassembly,
text-mode tool calls, usage.

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
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

import httpx
import openai

from llm.errors import ModelCallError, classify_error, classify_finish_reason
from llm.providers._clients import LoopClientCache
from llm.tokens import usage_or_estimate
from llm.toolcall_parsing import ToolCallHoldback, messages_for_text_mode, mint_call_id
from llm.types import ChatMessage, Completion, ReasoningDelta, TextDelta, ToolCallRequest, ToolSpec, Usage

if TYPE_CHECKING:
    from llm.router import RouteEntryConfig

MAX_CLIENTS_PER_LOOP: Final[int] = 64
"""Clients kept per event loop; the least recently used one is dropped beyond that."""

NO_API_KEY: Final[str] = "no-key"
"""Sent when an entry has no API key (local servers), so the SDK never falls back to the
``OPENAI_API_KEY`` environment variable and leaks it to another base URL."""

def _new_client(key: tuple[str, str, float, float]) -> openai.AsyncOpenAI:
    base_url, api_key, connect_timeout, read_timeout = key
    return openai.AsyncOpenAI(
        base_url=base_url,
        api_key=api_key or NO_API_KEY,
        max_retries=0,
        timeout=httpx.Timeout(read_timeout, connect=connect_timeout),
        # The SDK's defaults (limits, redirects) without its finaliser, which would try to
        # close the pool on whatever loop runs when it is collected.
        http_client=openai.DefaultAsyncHttpxClient(),
    )


_clients: LoopClientCache[openai.AsyncOpenAI] = LoopClientCache(_new_client, max_per_loop=MAX_CLIENTS_PER_LOOP)


def _client_for(entry: RouteEntryConfig) -> openai.AsyncOpenAI:
    """The pooled client for ``entry``'s (base_url, api_key, timeouts) in the running loop."""
    return _clients.get(
        (entry.base_url, entry.api_key, float(entry.connect_timeout_seconds), float(entry.read_timeout_seconds))
    )


async def aclose_clients() -> None:
    """Close every pooled client of the running event loop (e.g. at worker shutdown or in
    test teardown). Streams still open on them fail with a network error."""
    await _clients.aclose()


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
        index = getattr(fragment, "index", None)
        call_id = getattr(fragment, "id", None) or ""
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
        if call_id and not call.id:
            call.id = call_id
        function = getattr(fragment, "function", None)
        if function is not None:
            name = getattr(function, "name", None)
            if name and name != call.name:
                call.name += name
            arguments = getattr(function, "arguments", None)
            if arguments:
                call.arguments.append(arguments)

    def result(self) -> list[ToolCallRequest]:
        return [
            ToolCallRequest(id=c.id or mint_call_id(), name=c.name, arguments="".join(c.arguments) or "{}")
            for c in self._calls
            if c.name
        ]


def _reasoning_text(delta: Any) -> str:
    """``reasoning_content`` (DeepSeek, vLLM, llama.cpp) or ``reasoning`` (OpenRouter, newer vLLM)."""
    for attr in ("reasoning_content", "reasoning"):
        value = getattr(delta, attr, None)
        if isinstance(value, str) and value:
            return value
    return ""


async def _next_chunk(stream: openai.AsyncStream[Any], timeout_seconds: float) -> Any | None:
    """The next chunk, or None at the end of the stream.

    Args:
        stream: The SDK's chunk stream.
        timeout_seconds: Idle timeout, seconds (``read_timeout_seconds``).

    Raises:
        ModelCallError: ``timeout`` when no chunk arrives within ``timeout_seconds``; any
            other failure classified.
    """
    try:
        async with asyncio.timeout(timeout_seconds):
            return await anext(stream)
    except StopAsyncIteration:
        return None
    except TimeoutError as exc:
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
) -> tuple[dict[str, Any], list[ChatMessage]]:
    """The ``chat.completions.create`` keyword arguments for one streaming call.

    Args:
        entry: The route entry (model, output limit, tool-call mode).
        messages: Canonical history.
        tools: Offered tools; sent as ``tools`` in native mode (only when non-empty), as a
            system-prompt section in text mode.
        max_output_tokens: Caller's cap; the entry's ``max_output_tokens`` still applies.

    Returns:
        ``(params, sent_messages)``: the request parameters and the canonical messages they
        were built from (rewritten ones in text mode).
    """
    text_mode = entry.tool_calls == "text"
    sent = messages_for_text_mode(messages, tools) if text_mode else list(messages)
    params: dict[str, Any] = {
        "model": entry.model,
        "messages": [m.to_openai() for m in sent],
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
    if tools and not text_mode:
        params["tools"] = [t.to_openai() for t in tools]
    return params, sent


async def stream_chat(
    entry: RouteEntryConfig,
    messages: Sequence[ChatMessage],
    tools: Sequence[ToolSpec],
    *,
    max_output_tokens: int | None = None,
    on_first_token: Callable[[], None] | None = None,
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

    Yields:
        ``TextDelta`` and ``ReasoningDelta`` fragments, then exactly one ``Completion`` (the
        whole assistant message; usage from the provider, else estimated with
        ``Usage.estimated=True``; ``entry_index``/``model`` from ``entry``).

    Raises:
        ModelCallError: connection, HTTP status, idle timeout or stream-decoding failure;
            ``content_policy`` when the stream finishes with ``finish_reason:
            "content_filter"`` (raised instead of the ``Completion``).
    """
    params, sent = build_request(entry, messages, tools, max_output_tokens=max_output_tokens)
    text_mode = entry.tool_calls == "text"
    client = _client_for(entry)
    try:
        stream = await client.chat.completions.create(**params)
    except openai.OpenAIError as exc:
        raise classify_error(exc) from exc

    holdback = ToolCallHoldback() if text_mode else None
    assembler = _ToolCallAssembler()
    text_parts: list[str] = []
    reasoning_parts: list[str] = []
    usage: Any = None
    finish_reason: str | None = None
    started = False

    async with stream:
        while True:
            chunk = await _next_chunk(stream, entry.read_timeout_seconds)
            if chunk is None:
                break
            chunk_usage = getattr(chunk, "usage", None)
            if chunk_usage is not None:
                usage = chunk_usage
            for choice in chunk.choices or ():
                if choice.index != 0:
                    continue
                if choice.finish_reason:
                    finish_reason = choice.finish_reason
                delta = choice.delta
                if delta is None:
                    continue
                reasoning = _reasoning_text(delta)
                content = delta.content
                tool_fragments = delta.tool_calls
                if not started and (reasoning or content or tool_fragments):
                    started = True
                    if on_first_token is not None:
                        on_first_token()
                if reasoning:
                    reasoning_parts.append(reasoning)
                    yield ReasoningDelta(reasoning)
                if content:
                    if holdback is not None:
                        content = holdback.feed(content)
                    if content:
                        text_parts.append(content)
                        yield TextDelta(content)
                if tool_fragments:
                    for fragment in tool_fragments:
                        assembler.add(fragment)

    policy_failure = classify_finish_reason(finish_reason)
    if policy_failure is not None:
        raise policy_failure
    calls = assembler.result()
    if holdback is not None:
        tail, text_calls = holdback.finish()
        if tail:
            text_parts.append(tail)
            yield TextDelta(tail)
        calls = calls + text_calls
        if text_calls and finish_reason in (None, "stop"):
            finish_reason = "tool_calls"
    message = ChatMessage(role="assistant", content="".join(text_parts), tool_calls=tuple(calls))
    yield Completion(
        message=message,
        usage=_usage(usage, sent, () if text_mode else tools, message, "".join(reasoning_parts)),
        finish_reason=finish_reason,
        entry_index=entry.index,
        model=entry.model,
    )


def _usage(
    reported: Any, sent: Sequence[ChatMessage], tools: Sequence[ToolSpec], message: ChatMessage, reasoning: str
) -> Usage:
    def count(name: str) -> int | None:
        value = getattr(reported, name, None) if reported is not None else None
        return value if isinstance(value, int) else None

    return usage_or_estimate(
        prompt_tokens=count("prompt_tokens"), completion_tokens=count("completion_tokens"),
        messages=sent, tools=tools, message=message, reasoning=reasoning,
    )


__all__ = ["aclose_clients", "build_request", "stream_chat"]
