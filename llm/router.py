"""The model router: one streamed model call over an ordered route of provider entries.

A route is a list of :class:`RouteEntryConfig` tried in order. For one call the router:

1. **Selects** entries that can take the request: it skips (without an attempt) an entry
   whose context window is too small (``estimate_tokens(messages, tools) + output cap >
   max_input_tokens``), one that cannot take native tools when tools are offered
   (``supports_tools=False`` in ``native`` mode), and one whose shared breaker is open
   (:mod:`llm.health`). If *every* suitable entry is in cooldown, it still tries the one
   whose cooldown ends first rather than failing without trying.
2. **Retries** the same entry on transient failures (:data:`~llm.errors.RETRYABLE_CLASSES`:
   ``rate_limit``, ``overloaded``, ``server``, ``timeout``, ``network``) up to its
   ``max_retries``. The wait honours the provider's ``Retry-After`` / ``retry-after-ms``
   when it is at most :attr:`BackoffPolicy.max_retry_after_seconds` (30 s); otherwise it is
   exponential backoff with full jitter, ``uniform(0, min(8 s, 0.5 s × 2**n))`` for the
   ``n``-th retry (0-based), the "Full Jitter" rule of the AWS Architecture Blog, "Exponential
   Backoff And Jitter" (Marc Brooker, 2015,
   https://aws.amazon.com/blogs/architecture/exponential-backoff-and-jitter/). A Retry-After
   longer than 30 s is not waited for: the entry cools down that long and the router falls
   back at once.
3. **Falls back** to the next entry after the retries, or at once on ``quota_exhausted``,
   ``auth``, ``not_found`` (long cooldown), ``content_policy`` and ``other``.
   ``context_window`` falls back only to entries with a *larger* ``max_input_tokens``; when
   none is left it raises :class:`~llm.errors.ContextWindowExceeded` (the caller compacts).
4. **Surfaces** ``bad_request`` at once (it would fail the same way everywhere).
5. **Never falls back after the first token**: a text, reasoning or tool-call fragment commits
   the attempt; a later failure raises :class:`~llm.errors.StreamInterrupted`.

Attempts per call never exceed ``len(entries) + Σ max_retries`` (one first try per entry,
its retries; the "every entry is cooling down" rescue only happens when nothing else was
tried). Timeouts per attempt: connect (httpx), first token (``first_token_timeout_seconds``,
a router timer), idle between chunks (``read_timeout_seconds``, the adapter's timer) and the
whole stream (``stream_timeout_seconds``, a router timer). All waits between attempts go
through an injectable :class:`~llm.clock.Clock`, jitter through an injectable
``random.Random``.

Every attempt is reported exactly once through ``record`` as an :class:`AttemptRecord` (the
``LLMCall`` row), with its cost and the backoff waited before it. ``on_event`` receives
``model_retry`` and ``model_fallback`` events. Health bookkeeping happens in the router's
own error path; a health store that is down never fails a call. No Django imports.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from llm.clock import Clock, SystemClock
from llm.errors import (
    RETRYABLE_CLASSES,
    AllEntriesFailed,
    ContextWindowExceeded,
    ModelCallError,
    StreamInterrupted,
    classify_error,
)
from llm.health import EntryHealth, HealthStateUnavailable
from llm.providers import openai_compat
from llm.tokens import CHARS_PER_TOKEN, estimate_tokens
from llm.types import ChatMessage, Completion, ReasoningDelta, StreamEvent, TextDelta, ToolSpec, Usage

logger = logging.getLogger(__name__)

ToolCallMode = Literal["native", "text"]
ApiKind = Literal["openai", "anthropic"]
SkipReason = Literal["cooldown", "context_window", "no_tool_support"]


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
    """Context window, tokens: the router skips the entry when the estimated prompt plus the
    output cap exceeds it. 0 = unknown (never skipped for size)."""
    max_output_tokens: int
    """Cap on generated tokens, sent as ``max_tokens``; 0 sends no cap."""
    connect_timeout_seconds: float
    """TCP/TLS connect timeout; positive."""
    read_timeout_seconds: float
    """Idle timeout: longest wait for the response headers and between two chunks (the
    adapter's asyncio timer, and httpx's read timeout); positive."""
    tool_calls: ToolCallMode = "native"
    """``native``: provider tool-call API. ``text``: tools prompt + calls parsed from text."""
    api: ApiKind = "openai"
    """Wire protocol: ``openai`` (chat completions, :mod:`llm.providers.openai_compat`) or
    ``anthropic`` (Messages API, :mod:`llm.providers.anthropic`)."""
    first_token_timeout_seconds: float | None = None
    """Longest wait from request start to the first streamed fragment, seconds; None →
    ``read_timeout_seconds``."""
    stream_timeout_seconds: float | None = None
    """Total wall time of one attempt's stream, seconds; None → no cap."""
    max_retries: int = 2
    """Same-entry retries for retryable error classes (rate_limit, overloaded, server, timeout,
    network) before falling back; 0 disables retries."""
    input_price_per_mtok: float = 0.0
    """Price of prompt tokens, USD per million tokens."""
    output_price_per_mtok: float = 0.0
    """Price of completion tokens, USD per million tokens."""
    supports_tools: bool = True
    """False when the model cannot take native tool definitions (only checked in ``native``
    mode; ``text`` mode always supports tools)."""
    entry_key: str = ""
    """Stable identity for shared health state (e.g. ``"entry:42"``); ``""`` → derived from
    ``base_url`` and ``model`` (see :attr:`health_key`)."""
    temperature: float | None = None
    """Sampling temperature sent with every request (0–2); None leaves the provider's default."""

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
        if self.api not in ("openai", "anthropic"):
            raise ValueError(f"api must be 'openai' or 'anthropic', got {self.api!r}")
        for name in ("first_token_timeout_seconds", "stream_timeout_seconds"):
            value = getattr(self, name)
            if value is not None and not (
                isinstance(value, (int, float)) and math.isfinite(value) and value > 0
            ):
                raise ValueError(f"{name} must be None or positive finite seconds, got {value!r}")
        if isinstance(self.max_retries, bool) or not isinstance(self.max_retries, int) or self.max_retries < 0:
            raise ValueError(f"max_retries must be an int >= 0, got {self.max_retries!r}")
        for name in ("input_price_per_mtok", "output_price_per_mtok"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be finite USD >= 0, got {value!r}")
        if not isinstance(self.supports_tools, bool):
            raise ValueError(f"supports_tools must be a bool, got {self.supports_tools!r}")
        if self.temperature is not None and not (
            isinstance(self.temperature, (int, float)) and 0 <= self.temperature <= 2
        ):
            raise ValueError(f"temperature must be None or within [0, 2], got {self.temperature!r}")
        if not isinstance(self.entry_key, str):
            raise ValueError(f"entry_key must be a str, got {self.entry_key!r}")

    @property
    def health_key(self) -> str:
        """Identity of this entry in shared health state: ``entry_key``, or
        ``"<base_url without trailing slash>|<model>"`` when it is empty."""
        return self.entry_key or f"{self.base_url.rstrip('/')}|{self.model}"

    @property
    def effective_first_token_timeout_seconds(self) -> float:
        """``first_token_timeout_seconds``, or ``read_timeout_seconds`` when None; seconds."""
        if self.first_token_timeout_seconds is None:
            return self.read_timeout_seconds
        return self.first_token_timeout_seconds

    def cost_usd_micros(self, *, prompt_tokens: int, completion_tokens: int) -> int:
        """Cost of an attempt, micro-USD (integer).

        USD per million tokens × tokens = micro-USD, so this is
        ``round(prompt_tokens × input_price_per_mtok + completion_tokens × output_price_per_mtok)``.
        """
        return round(prompt_tokens * self.input_price_per_mtok + completion_tokens * self.output_price_per_mtok)


@dataclass(frozen=True, slots=True)
class BackoffPolicy:
    """How long to wait before retrying the same entry.

    Full jitter (AWS Architecture Blog, "Exponential Backoff And Jitter", 2015,
    https://aws.amazon.com/blogs/architecture/exponential-backoff-and-jitter/): the ``n``-th
    retry (0-based) waits ``uniform(0, min(cap_seconds, base_seconds × 2**n))``. A provider's
    Retry-After up to ``max_retry_after_seconds`` replaces it; a longer one is not waited for.
    """

    base_seconds: float = 0.5
    cap_seconds: float = 8.0
    max_retry_after_seconds: float = 30.0

    def __post_init__(self) -> None:
        for name in ("base_seconds", "cap_seconds", "max_retry_after_seconds"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be finite seconds >= 0, got {value!r}")

    def ceiling(self, retry_number: int) -> float:
        """Upper bound of the ``retry_number``-th (0-based) jittered wait, seconds."""
        return min(self.cap_seconds, self.base_seconds * (2 ** min(retry_number, 62)))

    def delay(self, *, retry_number: int, rng: random.Random) -> float:
        """A full-jitter wait for the ``retry_number``-th (0-based) retry, seconds."""
        return rng.uniform(0.0, self.ceiling(retry_number))


DEFAULT_BACKOFF: Final[BackoffPolicy] = BackoffPolicy()


@dataclass(slots=True)
class AttemptRecord:
    """One attempt of one model call (the data of an ``LLMCall`` row)."""

    entry_index: int
    """Route entry tried (0-based)."""
    provider_name: str
    model: str
    attempt: int
    """1-based, counted across the whole call (retries and fallbacks included)."""
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
    cost_usd_micros: int = 0
    """``round(prompt_tokens × input_price_per_mtok + completion_tokens ×
    output_price_per_mtok)``: USD per million tokens × tokens = micro-USD."""
    retry_wait_ms: int = 0
    """Backoff waited before this attempt (same-entry retry), milliseconds; 0 otherwise."""


RecordCallback = Callable[[AttemptRecord], Awaitable[None]]
EventCallback = Callable[[str, dict[str, Any]], Awaitable[None]]
StreamFunction = Callable[..., AsyncGenerator[TextDelta | ReasoningDelta | Completion, None]]


class _Attempt:
    """Timing, deadlines and counters of one attempt in progress (event-loop time)."""

    __slots__ = (
        "entry", "number", "retry_wait_ms", "started_at", "first_token_at", "output_chars", "recorded",
        "first_token_deadline", "total_deadline", "timer",
    )

    def __init__(self, entry: RouteEntryConfig, number: int, *, now: float, retry_wait_ms: int) -> None:
        self.entry = entry
        self.number = number
        self.retry_wait_ms = retry_wait_ms
        self.started_at = now
        self.first_token_at: float | None = None
        self.output_chars = 0
        self.recorded = False
        self.first_token_deadline = now + entry.effective_first_token_timeout_seconds
        self.total_deadline = None if entry.stream_timeout_seconds is None else now + entry.stream_timeout_seconds
        self.timer: asyncio.Timeout | None = None

    def deadline(self) -> float | None:
        """When the current wait must end (loop time): first token and total before the first
        token, total only after it."""
        if self.first_token_at is not None:
            return self.total_deadline
        if self.total_deadline is None:
            return self.first_token_deadline
        return min(self.first_token_deadline, self.total_deadline)

    def mark_first_token(self) -> None:
        """Called by the adapter (synchronously) on the first fragment: stops the first-token
        timer, keeps the total one."""
        if self.first_token_at is None:
            self.first_token_at = asyncio.get_running_loop().time()
            if self.timer is not None:
                self.timer.reschedule(self.total_deadline)

    def timeout_error(self, fired_at: float | None) -> ModelCallError:
        entry = self.entry
        if self.total_deadline is not None and fired_at == self.total_deadline:
            return ModelCallError(
                "timeout", f"the stream exceeded its total time limit of {entry.stream_timeout_seconds:g} s"
            )
        return ModelCallError(
            "timeout", f"no first token within {entry.effective_first_token_timeout_seconds:g} s"
        )

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
        now = asyncio.get_running_loop().time()
        return AttemptRecord(
            entry_index=self.entry.index,
            provider_name=self.entry.provider_name,
            model=self.entry.model,
            attempt=self.number,
            latency_ms=self._ms(now) or 0,
            first_token_ms=self._ms(self.first_token_at),
            prompt_tokens=usage.prompt_tokens,
            completion_tokens=usage.completion_tokens,
            usage_estimated=usage.estimated,
            status=status,
            error_class=error_class,
            error=error,
            cost_usd_micros=self.entry.cost_usd_micros(
                prompt_tokens=usage.prompt_tokens, completion_tokens=usage.completion_tokens
            ),
            retry_wait_ms=self.retry_wait_ms,
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
    """The provider adapter for an entry, by ``entry.api``.

    ``anthropic`` → :func:`llm.providers.anthropic.stream_chat` (imported lazily, so the
    module and its SDK are only needed by routes that use it); otherwise
    :func:`llm.providers.openai_compat.stream_chat`. Both share one signature.
    """
    if entry.api == "anthropic":
        try:
            from llm.providers import anthropic as anthropic_adapter  # noqa: PLC0415 - lazy on purpose
        except ImportError as exc:
            return _unavailable_adapter(f"the anthropic adapter cannot be loaded: {exc}")
        return anthropic_adapter.stream_chat
    return openai_compat.stream_chat


def _unavailable_adapter(reason: str) -> StreamFunction:
    """A stream function that fails at once with an ``other`` error (recorded, falls back)."""

    async def fail(*args: Any, **kwargs: Any) -> AsyncGenerator[TextDelta | ReasoningDelta | Completion, None]:
        raise ModelCallError("other", reason)
        yield  # pragma: no cover - makes this an async generator

    return fail


def output_reserve_tokens(entry: RouteEntryConfig, max_output_tokens: int | None) -> int:
    """Output tokens the request asks room for on ``entry`` (the ``max_tokens`` it would
    send: the entry's cap, lowered by the caller's; 0 when neither caps it)."""
    limit = entry.max_output_tokens
    if max_output_tokens is not None:
        limit = min(limit, max_output_tokens) if limit > 0 else max_output_tokens
    return max(0, limit)


def unsuitable_reason(
    entry: RouteEntryConfig,
    *,
    prompt_tokens: int,
    tools: Sequence[ToolSpec],
    max_output_tokens: int | None = None,
) -> SkipReason | None:
    """Why ``entry`` cannot take a request, or None when it can. Pure.

    Args:
        entry: The route entry.
        prompt_tokens: Estimated prompt size (:func:`llm.tokens.estimate_tokens`), tokens.
        tools: Tools offered with the request.
        max_output_tokens: The caller's output cap, if any.

    Returns:
        ``"context_window"`` when ``prompt_tokens + output reserve > max_input_tokens`` (an
        entry with ``max_input_tokens == 0`` is never too small); ``"no_tool_support"`` when
        tools are offered to a ``native``-mode entry with ``supports_tools=False``; else None.
    """
    if tools and entry.tool_calls == "native" and not entry.supports_tools:
        return "no_tool_support"
    needed = prompt_tokens + output_reserve_tokens(entry, max_output_tokens)
    if entry.max_input_tokens > 0 and needed > entry.max_input_tokens:
        return "context_window"
    return None


@dataclass(slots=True)
class _CallState:
    """Book-keeping of one :meth:`Router.stream` call."""

    attempts: int = 0
    failures: list[AttemptRecord] = field(default_factory=list)
    last_error: ModelCallError | None = None
    skipped: list[tuple[int, str]] = field(default_factory=list)
    size_limited: bool = False
    """Some entry was skipped for size or rejected the request with ``context_window``."""
    failed_otherwise: bool = False
    """Some attempt failed for another reason (then the answer is AllEntriesFailed)."""
    tools_unsupported: bool = False
    window_floor: int = -1
    """After a ``context_window`` rejection: only entries with a larger window are tried."""


class Router:
    """Streams model calls over an ordered route with retries, cooldowns and fallback.

    Args:
        entries: The route, in order; ``entries[i].index`` must be ``i``.
        record: Awaited once per attempt with its :class:`AttemptRecord` (success, failure or
            cancellation). An exception it raises propagates to the caller of :meth:`stream`.
        health: Shared per-entry health (:class:`~llm.health.RedisEntryHealth` across
            workers); None keeps no state between calls.
        on_event: Awaited with ``("model_retry", {...})`` before each same-entry retry and
            ``("model_fallback", {...})`` whenever the call moves on from an entry (see
            :meth:`stream`). An exception it raises propagates.
        clock: Sleeps between retries (default :class:`~llm.clock.SystemClock`).
        rng: Source of backoff jitter (default: a fresh ``random.Random()``).
        backoff: The retry wait rule (default :data:`DEFAULT_BACKOFF`).

    Raises:
        ValueError: empty route or indexes that do not match positions.
    """

    def __init__(
        self,
        entries: Sequence[RouteEntryConfig],
        *,
        record: RecordCallback | None = None,
        health: EntryHealth | None = None,
        on_event: EventCallback | None = None,
        clock: Clock | None = None,
        rng: random.Random | None = None,
        backoff: BackoffPolicy = DEFAULT_BACKOFF,
    ) -> None:
        self._entries: tuple[RouteEntryConfig, ...] = tuple(entries)
        if not self._entries:
            raise ValueError("a route needs at least one entry")
        for position, entry in enumerate(self._entries):
            if entry.index != position:
                raise ValueError(f"route entry at position {position} has index {entry.index!r}")
        self._record = record
        self._health = health
        self._on_event = on_event
        self._clock = clock or SystemClock()
        self._rng = rng or random.Random()
        self._backoff = backoff

    @property
    def entries(self) -> tuple[RouteEntryConfig, ...]:
        return self._entries

    @property
    def max_attempts(self) -> int:
        """Upper bound of attempts per call: ``len(entries) + Σ max_retries``."""
        return len(self._entries) + sum(e.max_retries for e in self._entries)

    # -- callbacks and health (failures of the health store never fail a call) --

    async def _emit(self, attempt: _Attempt, record: AttemptRecord) -> None:
        attempt.recorded = True
        if self._record is not None:
            await self._record(record)

    async def _event(self, name: str, data: dict[str, Any]) -> None:
        if self._on_event is not None:
            await self._on_event(name, data)

    async def _fallback_event(
        self, leaving: tuple[RouteEntryConfig, str] | None, to_entry: RouteEntryConfig
    ) -> None:
        if leaving is None or leaving[0] is to_entry:
            return
        from_entry, error_class = leaving
        await self._event(
            "model_fallback",
            {
                "from_entry_index": from_entry.index,
                "from_model": from_entry.model,
                "to_entry_index": to_entry.index,
                "to_model": to_entry.model,
                "error_class": error_class,
            },
        )

    async def _available(self, entry: RouteEntryConfig) -> bool:
        if self._health is None:
            return True
        try:
            return await self._health.available(entry.health_key)
        except HealthStateUnavailable as exc:
            logger.warning("entry health unavailable, trying %s anyway: %s", entry.health_key, exc)
            return True

    async def _health_success(self, entry: RouteEntryConfig) -> None:
        if self._health is None:
            return
        try:
            await self._health.record_success(entry.health_key)
        except HealthStateUnavailable as exc:
            logger.warning("could not record success of %s: %s", entry.health_key, exc)

    async def _health_failure(
        self, entry: RouteEntryConfig, err: ModelCallError, *, retries_exhausted: bool
    ) -> None:
        if self._health is None:
            return
        try:
            await self._health.record_failure(
                entry.health_key,
                err.error_class,
                retry_after_seconds=err.retry_after_seconds,
                retries_exhausted=retries_exhausted,
            )
        except HealthStateUnavailable as exc:
            logger.warning("could not record failure of %s: %s", entry.health_key, exc)

    async def _soonest_available(self, candidates: Sequence[RouteEntryConfig]) -> RouteEntryConfig:
        """Of entries in cooldown, the one whose cooldown ends first (route order on ties)."""
        best, best_until = candidates[0], math.inf
        if self._health is None:
            return best
        for entry in candidates:
            try:
                until = (await self._health.snapshot(entry.health_key)).cooldown_until
            except HealthStateUnavailable:
                return best
            until = 0.0 if until is None else until
            if until < best_until:
                best, best_until = entry, until
        return best

    # -- one attempt's next event, under the first-token / total timers --

    @staticmethod
    async def _next_event(
        events: AsyncGenerator[TextDelta | ReasoningDelta | Completion, None], attempt: _Attempt
    ) -> TextDelta | ReasoningDelta | Completion:
        """The attempt's next event, under its deadline (:meth:`_Attempt.deadline`).

        Without a deadline (after the first token, on an entry with no
        ``stream_timeout_seconds``; it cannot get one back) no timer is entered: an
        ``asyncio.timeout`` per event cost ~2 µs of the loop's CPU per streamed read.
        """
        deadline = attempt.deadline()
        timer = None if deadline is None else asyncio.timeout_at(deadline)
        try:
            if timer is None:
                return await anext(events)
            async with timer:
                attempt.timer = timer
                try:
                    return await anext(events)
                finally:
                    attempt.timer = None
        except StopAsyncIteration:
            raise ModelCallError("other", "the provider stream ended without a completion") from None
        except TimeoutError as exc:
            if timer is not None and timer.expired():
                raise attempt.timeout_error(timer.when()) from exc
            raise classify_error(exc) from exc

    # -- the call --

    async def stream(
        self,
        messages: Sequence[ChatMessage],
        tools: Sequence[ToolSpec],
        *,
        max_output_tokens: int | None = None,
        compact_first: bool = False,
    ) -> AsyncIterator[StreamEvent]:
        """Stream one model call with retries and fallback before the first token.

        Args:
            messages: Canonical history (OpenAI chat shape).
            tools: Tools offered to the model (may be empty).
            max_output_tokens: Optional cap; each entry's own ``max_output_tokens`` still applies.
            compact_first: On a ``context_window`` rejection raise
                :class:`~llm.errors.ContextWindowExceeded` at once instead of falling back to
                a larger entry, so the caller can compact the conversation first.

        Yields:
            ``TextDelta``/``ReasoningDelta`` fragments of one entry's answer, then one
            ``Completion`` (with ``entry_index`` and ``model``); nothing after it.

        Events (``on_event``):
            ``model_retry`` ``{entry_index, provider_name, model, error_class, attempt,
            wait_seconds}`` before a same-entry retry (``attempt``: the number the retry will
            have, 1-based across the call; ``wait_seconds``: the wait about to start).
            ``model_fallback`` ``{from_entry_index, from_model, to_entry_index, to_model,
            error_class}`` each time the call leaves an entry for the next one it considers:
            ``error_class`` is the failure that ended the entry, or ``"cooldown"`` /
            ``"context_window"`` / ``"no_tool_support"`` when the entry was skipped without
            an attempt.

        Raises:
            ModelCallError: ``bad_request`` from an entry (recorded; no fallback); also
                ``bad_request`` when tools are offered and no entry can take them.
            StreamInterrupted: an entry failed after its first fragment (recorded; no fallback).
            ContextWindowExceeded: the request is too large for every entry (all skipped for
                size or rejected with ``context_window``); the caller should compact.
            AllEntriesFailed: every entry failed (or cooled down) before its first fragment;
                carries the failed attempts and the skips.
            asyncio.CancelledError: propagates at once; the HTTP stream is closed and an
                attempt in flight is recorded with ``error_class="cancelled"``.
        """
        loop = asyncio.get_running_loop()
        prompt_tokens = estimate_tokens(messages, tools)
        call = _CallState()
        order: list[RouteEntryConfig] = list(self._entries)
        cooling: list[RouteEntryConfig] = []
        leaving: tuple[RouteEntryConfig, str] | None = None
        rescue = False
        position = 0
        while True:
            if position >= len(order):
                if call.attempts == 0 and cooling and not rescue:
                    # Every suitable entry is cooling down: try the one that recovers first
                    # rather than failing without a single attempt.
                    order.append(await self._soonest_available(cooling))
                    rescue = True
                else:
                    break
            entry = order[position]
            position += 1
            if not rescue:
                reason = unsuitable_reason(
                    entry, prompt_tokens=prompt_tokens, tools=tools, max_output_tokens=max_output_tokens
                )
                if reason is None and 0 < entry.max_input_tokens <= call.window_floor:
                    reason = "context_window"
                if reason is None and not await self._available(entry):
                    reason = "cooldown"
                    cooling.append(entry)
                if reason is not None:
                    await self._fallback_event(leaving, entry)
                    leaving = (entry, reason)
                    call.skipped.append((entry.index, reason))
                    call.size_limited |= reason == "context_window"
                    call.tools_unsupported |= reason == "no_tool_support"
                    continue
            await self._fallback_event(leaving, entry)
            leaving = None

            retries = 0
            wait_seconds = 0.0
            while True:  # attempts on this entry
                call.attempts += 1
                attempt = _Attempt(entry, call.attempts, now=loop.time(), retry_wait_ms=round(wait_seconds * 1000))
                events = _adapter_for(entry)(
                    entry,
                    messages,
                    tools,
                    max_output_tokens=max_output_tokens,
                    on_first_token=attempt.mark_first_token,
                )
                failure: ModelCallError | None = None
                cancelled = False
                try:
                    while True:
                        event = await self._next_event(events, attempt)
                        if isinstance(event, Completion):
                            await self._emit(attempt, attempt.record(status="succeeded", usage=event.usage))
                            await self._health_success(entry)
                            yield event
                            return
                        attempt.output_chars += len(event.text)
                        yield event
                except ModelCallError as err:
                    failure = err.redact((entry.api_key,))  # a provider may echo the key back
                    failed = attempt.record(
                        status="failed",
                        usage=attempt.failure_usage(messages, tools),
                        error_class=err.error_class,
                        error=err.message if err.status_code is None else f"HTTP {err.status_code}: {err.message}",
                    )
                    call.failures.append(failed)
                    await self._emit(attempt, failed)
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
                if failure is None:  # pragma: no cover - the loop above ends by return or exception
                    raise RuntimeError("attempt ended without an outcome")
                if attempt.first_token_at is not None:
                    await self._health_failure(entry, failure, retries_exhausted=True)
                    raise StreamInterrupted(
                        failure, entry_index=entry.index, provider_name=entry.provider_name, model=entry.model
                    ) from failure
                wait_seconds = await self._after_failure(
                    entry, failure, retries=retries, next_attempt=call.attempts + 1
                )
                if wait_seconds is None:
                    break
                await self._clock.sleep(wait_seconds)
                retries += 1

            call.last_error = failure
            leaving = (entry, failure.error_class)
            if failure.error_class == "context_window":
                call.size_limited = True
                call.window_floor = max(call.window_floor, entry.max_input_tokens)
                if compact_first:
                    raise ContextWindowExceeded(
                        estimated_prompt_tokens=prompt_tokens,
                        largest_window_tokens=max(e.max_input_tokens for e in self._entries),
                        attempts=call.failures, last_error=failure, skipped=call.skipped,
                    )
            else:
                call.failed_otherwise = True

        raise self._exhausted(call, prompt_tokens)

    async def _after_failure(
        self, entry: RouteEntryConfig, err: ModelCallError, *, retries: int, next_attempt: int
    ) -> float | None:
        """Decide what follows a failure before the first token; does the health bookkeeping.

        Returns:
            The wait before retrying the same entry, seconds (after emitting
            ``model_retry``), or None to leave the entry.

        Raises:
            ModelCallError: ``err`` itself when it is a ``bad_request``.
        """
        error_class = err.error_class
        if error_class in ("bad_request", "context_window"):
            await self._health_success(entry)  # the entry answered; the request is at fault
            if error_class == "bad_request":
                raise err
            return None
        if error_class not in RETRYABLE_CLASSES:
            await self._health_failure(entry, err, retries_exhausted=True)
            return None
        retry_after = err.retry_after_seconds
        if retry_after is not None and retry_after > self._backoff.max_retry_after_seconds:
            await self._health_failure(entry, err, retries_exhausted=True)  # cools down that long
            return None
        if retries >= entry.max_retries:
            await self._health_failure(entry, err, retries_exhausted=True)
            return None
        await self._health_failure(entry, err, retries_exhausted=False)
        wait = retry_after if retry_after is not None else self._backoff.delay(retry_number=retries, rng=self._rng)
        await self._event(
            "model_retry",
            {
                "entry_index": entry.index,
                "provider_name": entry.provider_name,
                "model": entry.model,
                "error_class": error_class,
                "attempt": next_attempt,
                "wait_seconds": wait,
            },
        )
        return wait

    def _exhausted(self, call: _CallState, prompt_tokens: int) -> Exception:
        """The error to raise when no entry answered."""
        if not call.failed_otherwise and call.size_limited:
            return ContextWindowExceeded(
                estimated_prompt_tokens=prompt_tokens,
                largest_window_tokens=max(e.max_input_tokens for e in self._entries),
                attempts=call.failures,
                last_error=call.last_error,
                skipped=call.skipped,
            )
        if call.attempts == 0 and call.tools_unsupported:
            return ModelCallError(
                "bad_request",
                "tools were offered but no route entry takes native tool calls "
                "(set supports_tools, or tool_calls='text' on an entry)",
            )
        return AllEntriesFailed(call.failures, last_error=call.last_error, skipped=call.skipped)

    async def complete(
        self,
        messages: Sequence[ChatMessage],
        tools: Sequence[ToolSpec],
        *,
        max_output_tokens: int | None = None,
    ) -> Completion:
        """:meth:`stream` consumed to its ``Completion`` (same retries, fallback, records and errors)."""
        stream = self.stream(messages, tools, max_output_tokens=max_output_tokens)
        try:
            async for event in stream:
                if isinstance(event, Completion):
                    return event
        finally:
            await stream.aclose()  # type: ignore[attr-defined]
        raise ModelCallError("other", "the router stream ended without a completion")  # pragma: no cover


__all__ = [
    "DEFAULT_BACKOFF",
    "AttemptRecord",
    "BackoffPolicy",
    "EventCallback",
    "RecordCallback",
    "RouteEntryConfig",
    "Router",
    "SkipReason",
    "output_reserve_tokens",
    "unsuitable_reason",
]
