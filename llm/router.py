"""The model router: one streamed model call over an ordered route of provider entries.

A route is a list of :class:`RouteEntryConfig` tried in order. For one call the router:

* streams from the first entry; on a failure **before the first token** (connect failure,
  timeout, no first chunk within ``read_timeout_seconds``, HTTP 429/5xx, auth/not-found,
  context window, anything but a bad request) it records the attempt and falls back to the
  next entry;
* surfaces a ``bad_request`` (:class:`~llm.errors.ModelCallError`) at once: it would fail the
  same way everywhere;
* never falls back once a text, reasoning or tool-call fragment has arrived: a later failure
  raises :class:`~llm.errors.StreamInterrupted` (retryable by the runner);
* raises :class:`~llm.errors.AllEntriesFailed` when every entry failed before its first token.

Every attempt is reported exactly once through the ``record`` callback as an
:class:`AttemptRecord` (the future ``LLMCall`` row), successful ones right before their
``Completion`` is yielded. Retries of the same entry with backoff and shared cooldowns are
a later step; this module has no Django imports.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from llm.errors import AllEntriesFailed, ModelCallError, StreamInterrupted
from llm.providers import openai_compat
from llm.tokens import CHARS_PER_TOKEN, estimate_tokens
from llm.types import ChatMessage, Completion, ReasoningDelta, StreamEvent, TextDelta, ToolSpec, Usage

ToolCallMode = Literal["native", "text"]


@dataclass(frozen=True, slots=True)
class RouteEntryConfig:
    """One provider/model entry of a route, with its credentials and limits resolved."""

    index: int
    """Position in the route, 0-based."""
    provider_name: str
    """Provider's display name (``openai``, ``local``, …); recorded, not interpreted."""
    base_url: str
    """OpenAI-compatible base URL, e.g. ``http://127.0.0.1:8081/v1``."""
    api_key: str = field(repr=False)
    """Secret; may be ``""`` for local servers. Never shown in ``repr``."""
    model: str
    """Model name as the provider expects it."""
    max_input_tokens: int
    """Context window for the prompt, tokens."""
    max_output_tokens: int
    """Cap on generated tokens, sent as ``max_tokens``; 0 sends no cap."""
    connect_timeout_seconds: float
    """TCP/TLS connect timeout; positive."""
    read_timeout_seconds: float
    """Wait for the response headers, for the first chunk and between chunks; positive."""
    tool_calls: ToolCallMode = "native"
    """``native``: provider tool-call API. ``text``: tools prompt + calls parsed from text."""

    def __post_init__(self) -> None:
        if self.index < 0:
            raise ValueError(f"index must be >= 0, got {self.index!r}")
        for name in ("connect_timeout_seconds", "read_timeout_seconds"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be positive finite seconds, got {value!r}")
        if self.tool_calls not in ("native", "text"):
            raise ValueError(f"tool_calls must be 'native' or 'text', got {self.tool_calls!r}")
        if self.max_output_tokens < 0 or self.max_input_tokens < 0:
            raise ValueError("token limits must be >= 0")


@dataclass(slots=True)
class AttemptRecord:
    """One attempt of one model call (the data of an ``LLMCall`` row)."""

    entry_index: int
    """Route entry tried (0-based)."""
    provider_name: str
    model: str
    attempt: int
    """1-based, counted across the whole call (fallbacks included)."""
    latency_ms: int
    """From request start to the Completion (or the failure)."""
    first_token_ms: int | None
    """From request start to the first content/reasoning/tool-call fragment; None if none came."""
    prompt_tokens: int
    completion_tokens: int
    usage_estimated: bool
    """True when the tokens are :mod:`llm.tokens` estimates (no provider usage)."""
    status: Literal["succeeded", "failed"]
    error_class: str | None
    """A :data:`llm.errors.ERROR_CLASSES` value, ``"cancelled"`` when the caller cancelled or
    closed the stream mid-attempt; None when succeeded."""
    error: str
    """Error message; ``""`` when succeeded."""


RecordCallback = Callable[[AttemptRecord], Awaitable[None]]
StreamFunction = Callable[..., AsyncGenerator[TextDelta | ReasoningDelta | Completion, None]]


class _Attempt:
    """Timing and counters of one attempt in progress."""

    __slots__ = ("entry", "number", "started_at", "first_token_at", "output_chars", "recorded")

    def __init__(self, entry: RouteEntryConfig, number: int) -> None:
        self.entry = entry
        self.number = number
        self.started_at = time.monotonic()
        self.first_token_at: float | None = None
        self.output_chars = 0
        self.recorded = False

    def mark_first_token(self) -> None:
        if self.first_token_at is None:
            self.first_token_at = time.monotonic()

    def _ms(self, at: float | None) -> int | None:
        return None if at is None else int((at - self.started_at) * 1000)

    def record(
        self,
        *,
        status: Literal["succeeded", "failed"],
        usage: Usage,
        error_class: str | None = None,
        error: str = "",
    ) -> AttemptRecord:
        return AttemptRecord(
            entry_index=self.entry.index,
            provider_name=self.entry.provider_name,
            model=self.entry.model,
            attempt=self.number,
            latency_ms=self._ms(time.monotonic()) or 0,
            first_token_ms=self._ms(self.first_token_at),
            prompt_tokens=usage.prompt_tokens,
            completion_tokens=usage.completion_tokens,
            usage_estimated=usage.estimated,
            status=status,
            error_class=error_class,
            error=error,
        )

    def failure_usage(self, messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> Usage:
        """Nothing before the first token (providers do not bill those); estimates after."""
        if self.first_token_at is None:
            return Usage()
        return Usage(
            prompt_tokens=estimate_tokens(messages, tools),
            completion_tokens=math.ceil(self.output_chars / CHARS_PER_TOKEN),
            estimated=True,
        )


def _adapter_for(entry: RouteEntryConfig) -> StreamFunction:
    """The provider adapter for an entry (only the OpenAI-compatible one so far)."""
    return openai_compat.stream_chat


class Router:
    """Streams model calls over an ordered route with fallback before the first token.

    Args:
        entries: The route, in order; ``entries[i].index`` must be ``i``.
        record: Awaited once per attempt with its :class:`AttemptRecord` (success, failure or
            cancellation). An exception it raises propagates to the caller of
            :meth:`stream`.

    Raises:
        ValueError: empty route or indexes that do not match positions.
    """

    def __init__(self, entries: Sequence[RouteEntryConfig], *, record: RecordCallback | None = None) -> None:
        self._entries: tuple[RouteEntryConfig, ...] = tuple(entries)
        if not self._entries:
            raise ValueError("a route needs at least one entry")
        for position, entry in enumerate(self._entries):
            if entry.index != position:
                raise ValueError(f"route entry at position {position} has index {entry.index!r}")
        self._record = record

    @property
    def entries(self) -> tuple[RouteEntryConfig, ...]:
        return self._entries

    async def _emit(self, attempt: _Attempt, record: AttemptRecord) -> None:
        attempt.recorded = True
        if self._record is not None:
            await self._record(record)

    async def stream(
        self,
        messages: Sequence[ChatMessage],
        tools: Sequence[ToolSpec],
        *,
        max_output_tokens: int | None = None,
    ) -> AsyncIterator[StreamEvent]:
        """Stream one model call, falling back across the route before the first token.

        Args:
            messages: Canonical history (OpenAI chat shape).
            tools: Tools offered to the model (may be empty).
            max_output_tokens: Optional cap; each entry's own ``max_output_tokens`` still applies.

        Yields:
            ``TextDelta``/``ReasoningDelta`` fragments of one entry's answer, then one
            ``Completion`` (with ``entry_index`` and ``model``); nothing after it.

        Raises:
            ModelCallError: ``bad_request`` from an entry (recorded; no fallback).
            StreamInterrupted: an entry failed after its first fragment (recorded; no fallback).
            AllEntriesFailed: every entry failed before its first fragment; carries the records.
            asyncio.CancelledError: propagates at once; the HTTP stream is closed and the
                attempt recorded with ``error_class="cancelled"``.
        """
        failures: list[AttemptRecord] = []
        last_error: ModelCallError | None = None
        for number, entry in enumerate(self._entries, start=1):
            attempt = _Attempt(entry, number)
            events = _adapter_for(entry)(
                entry, messages, tools, max_output_tokens=max_output_tokens, on_first_token=attempt.mark_first_token
            )
            cancelled = False
            try:
                async for event in events:
                    if isinstance(event, Completion):
                        await self._emit(attempt, attempt.record(status="succeeded", usage=event.usage))
                        yield event
                        return
                    attempt.output_chars += len(event.text)
                    yield event
                raise ModelCallError("other", "the provider stream ended without a completion")
            except ModelCallError as err:
                failed = attempt.record(
                    status="failed",
                    usage=attempt.failure_usage(messages, tools),
                    error_class=err.error_class,
                    error=err.message if err.status_code is None else f"HTTP {err.status_code}: {err.message}",
                )
                await self._emit(attempt, failed)
                if attempt.first_token_at is not None:
                    raise StreamInterrupted(
                        err, entry_index=entry.index, provider_name=entry.provider_name, model=entry.model
                    ) from err
                if not err.falls_back:
                    raise
                failures.append(failed)
                last_error = err
            except (asyncio.CancelledError, GeneratorExit):
                cancelled = True
                raise
            finally:
                await events.aclose()
                if not attempt.recorded:
                    await self._emit(
                        attempt,
                        attempt.record(
                            status="failed",
                            usage=attempt.failure_usage(messages, tools),
                            error_class="cancelled" if cancelled else "other",
                            error="cancelled by the caller" if cancelled else "unexpected error in the model layer",
                        ),
                    )
        raise AllEntriesFailed(failures, last_error=last_error)

    async def complete(
        self,
        messages: Sequence[ChatMessage],
        tools: Sequence[ToolSpec],
        *,
        max_output_tokens: int | None = None,
    ) -> Completion:
        """:meth:`stream` consumed to its ``Completion`` (same fallback, records and errors)."""
        stream = self.stream(messages, tools, max_output_tokens=max_output_tokens)
        try:
            async for event in stream:
                if isinstance(event, Completion):
                    return event
        finally:
            await stream.aclose()
        raise ModelCallError("other", "the router stream ended without a completion")  # pragma: no cover


__all__ = ["AttemptRecord", "RecordCallback", "RouteEntryConfig", "Router"]
