"""The fallback router: a :class:`~llm.model.Model` over an ordered route of provider entries.

:class:`FallbackModel` (also exported as ``Router``) implements the model protocol
(:mod:`llm.model`) over a route: a list of :class:`~llm.config.RouteEntryConfig`, each
answered by its API's adapter model (:func:`llm.providers.model_for`), tried in order. For
one call the router:

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

The call is split by step: :meth:`FallbackModel._next_entry` (selection, skip reasons,
``model_fallback`` events), :meth:`FallbackModel._start_attempt` / ``_next_event`` (one
attempt under its timers), :meth:`FallbackModel._failed` / ``_record_unfinished`` (attempt
records), :meth:`FallbackModel._after_attempt` / ``_after_failure`` (retry or leave; health) and
:meth:`FallbackModel._leave_entry` (what a failed entry means for the rest of the call);
:meth:`FallbackModel.stream` only dispatches, and yields the events itself (no extra
generator layer per streamed event).

Every attempt is reported exactly once through ``record`` as an :class:`~llm.records.AttemptRecord` (the
``LLMCall`` row), with its cost and the backoff waited before it. ``on_event`` receives
``model_retry`` and ``model_fallback`` events. Health bookkeeping happens in the router's
own error path; a health store that is down never fails a call. No Django imports.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from llm.clock import Clock, SystemClock
from llm.config import DEFAULT_BACKOFF, BackoffPolicy, RouteEntryConfig
from llm.errors import (
    RETRYABLE_CLASSES,
    AllEntriesFailed,
    ContextWindowExceeded,
    ModelCallError,
    StreamInterrupted,
    classify_error,
)
from llm.health import EntryHealth, HealthStateUnavailable
from llm.model import DEFAULT_SETTINGS, FirstTokenHook, Model, ModelSettings
from llm.providers import model_for
from llm.records import AttemptRecord, BodyCapture, EventCallback, RecordCallback, SkipReason
from llm.tokens import CHARS_PER_TOKEN, estimate_tokens
from llm.types import ChatMessage, Completion, StreamEvent, ToolSpec, Usage

logger = logging.getLogger(__name__)


class _Attempt:
    """Timing, deadlines and counters of one attempt in progress (event-loop time)."""

    __slots__ = (
        "entry", "number", "retry_wait_ms", "started_at", "first_token_at", "output_chars", "recorded",
        "first_token_deadline", "total_deadline", "timer", "notify", "cancelled", "bodies",
    )

    def __init__(
        self, entry: RouteEntryConfig, number: int, *, now: float, retry_wait_ms: int,
        notify: FirstTokenHook | None = None,
    ) -> None:
        self.entry = entry
        self.notify = notify
        """The caller's own first-token hook (a FallbackModel nested in another), or None."""
        self.cancelled = False
        self.number = number
        self.retry_wait_ms = retry_wait_ms
        self.started_at = now
        self.first_token_at: float | None = None
        self.output_chars = 0
        self.recorded = False
        self.first_token_deadline = now + entry.effective_first_token_timeout_seconds
        self.total_deadline = None if entry.stream_timeout_seconds is None else now + entry.stream_timeout_seconds
        self.timer: asyncio.Timeout | None = None
        self.bodies: BodyCapture | None = None
        """The attempt's request and response bodies, when the router captures them."""

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
            if self.notify is not None:
                self.notify()

    def timeout_error(self, fired_at: float | None) -> ModelCallError:
        """The ``timeout`` error for a router timer that fired at ``fired_at`` (loop time)."""
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
        completion: Completion | None = None,
    ) -> AttemptRecord:
        """This attempt's :class:`~llm.records.AttemptRecord`, timed now (``completion``: a
        succeeded attempt's answer, whose finish reason and model it keeps)."""
        now = asyncio.get_running_loop().time()
        record = AttemptRecord(
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
        if self.bodies is not None:
            record.bodies = self.bodies
        if completion is not None:
            record.finish_reason, record.response_model = completion.finish_reason or "", completion.model
        return record

    def failure_usage(self, messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> Usage:
        """Nothing before the first token (providers do not bill those); estimates after."""
        if self.first_token_at is None:
            return Usage()
        return Usage(
            prompt_tokens=estimate_tokens(messages, tools),
            completion_tokens=math.ceil(self.output_chars / CHARS_PER_TOKEN),
            estimated=True,
        )


def _adapter_for(entry: RouteEntryConfig) -> Model:
    """The adapter model of one entry (:func:`llm.providers.model_for`), looked up per attempt."""
    return model_for(entry)


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
    """Book-keeping of one :meth:`FallbackModel.stream` call."""

    messages: Sequence[ChatMessage]
    tools: Sequence[ToolSpec]
    settings: ModelSettings
    prompt_tokens: int
    order: list[RouteEntryConfig]
    """Entries to consider, in route order (the cooldown rescue appends one)."""
    notify: FirstTokenHook | None = None
    position: int = 0
    """Next index into ``order``."""
    cooling: list[RouteEntryConfig] = field(default_factory=list)
    """Entries skipped because their breaker is open."""
    rescue: bool = False
    """The "every entry is cooling down" rescue entry was appended."""
    leaving: tuple[RouteEntryConfig, str] | None = None
    """The entry the call is moving away from and why (for the next ``model_fallback``)."""
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

    def skip(self, entry: RouteEntryConfig, reason: SkipReason) -> None:
        """Note that ``entry`` was passed over without an attempt."""
        self.leaving = (entry, reason)
        self.skipped.append((entry.index, reason))
        self.size_limited |= reason == "context_window"
        self.tools_unsupported |= reason == "no_tool_support"
        if reason == "cooldown":
            self.cooling.append(entry)


def _skip_reason(call: _CallState, entry: RouteEntryConfig) -> SkipReason | None:
    """Why ``entry`` is passed over for this call before its health is asked (size, tools, a
    window already known to be too small), or None. Pure."""
    reason = unsuitable_reason(
        entry, prompt_tokens=call.prompt_tokens, tools=call.tools, max_output_tokens=call.settings.max_output_tokens,
    )
    if reason is None and 0 < entry.max_input_tokens <= call.window_floor:
        reason = "context_window"
    return reason


def _call_settings(
    settings: ModelSettings | None, max_output_tokens: int | None, compact_first: bool, tool_choice: str = "auto",
    response_format: dict[str, Any] | None = None,
) -> ModelSettings:
    """The call's settings: ``settings``, or one built from the keyword shortcuts.

    Raises:
        TypeError: both ``settings`` and a keyword shortcut were given.
        ValueError: a ``tool_choice`` that is neither a mode nor a tool name.
    """
    if settings is not None:
        if max_output_tokens is not None or compact_first or tool_choice != "auto" or response_format is not None:
            raise TypeError("pass max_output_tokens/compact_first/tool_choice/response_format inside settings, "
                            "not beside it")
        return settings
    if max_output_tokens is None and not compact_first and tool_choice == "auto" and response_format is None:
        return DEFAULT_SETTINGS
    return ModelSettings(max_output_tokens=max_output_tokens, compact_first=compact_first, tool_choice=tool_choice,
                         response_format=response_format)


class FallbackModel:
    """A :class:`~llm.model.Model` over an ordered route: retries, cooldowns and fallback.

    Args:
        entries: The route, in order; ``entries[i].index`` must be ``i``.
        record: Awaited once per attempt with its :class:`~llm.records.AttemptRecord`
            (success, failure or cancellation). An exception it raises propagates to the
            caller of :meth:`stream`.
        health: Shared per-entry health (:class:`~llm.health.RedisEntryHealth` across
            workers); None keeps no state between calls.
        on_event: Awaited with ``("model_retry", {...})`` before each same-entry retry and
            ``("model_fallback", {...})`` whenever the call moves on from an entry (see
            :meth:`stream`). An exception it raises propagates.
        clock: Sleeps between retries (default :class:`~llm.clock.SystemClock`).
        rng: Source of backoff jitter (default: a fresh ``random.Random()``).
        backoff: The retry wait rule (default :data:`~llm.config.DEFAULT_BACKOFF`).
        capture_bodies: Record each attempt's exact request and response bodies
            (:class:`~llm.records.BodyCapture`, handed to the adapter and kept on the record's
            ``bodies``; the entry's API key redacted when they are written out). False (the
            default): the adapters are called exactly as without it.

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
        capture_bodies: bool = False,
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
        self._capture_bodies = capture_bodies

    @property
    def entries(self) -> tuple[RouteEntryConfig, ...]:
        """The route, in order."""
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
        events: AsyncIterator[StreamEvent], attempt: _Attempt
    ) -> StreamEvent:
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
        settings: ModelSettings | None = None,
        *,
        max_output_tokens: int | None = None,
        compact_first: bool = False,
        tool_choice: str = "auto",
        response_format: dict[str, Any] | None = None,
        on_first_token: FirstTokenHook | None = None,
    ) -> AsyncIterator[StreamEvent]:
        """Stream one model call with retries and fallback before the first token.

        Args:
            messages: Canonical history (OpenAI chat shape).
            tools: Tools offered to the model (may be empty).
            settings: Per-call settings (:class:`~llm.model.ModelSettings`); each entry's own
                ``max_output_tokens`` still applies.
            max_output_tokens: Shortcut for ``settings.max_output_tokens`` (not with ``settings``).
            compact_first: Shortcut for ``settings.compact_first`` (not with ``settings``): on a
                ``context_window`` rejection raise :class:`~llm.errors.ContextWindowExceeded`
                at once instead of falling back to a larger entry, so the caller can compact
                the conversation first.
            tool_choice: Shortcut for ``settings.tool_choice`` (not with ``settings``): ``"auto"``,
                ``"required"``, ``"none"`` or an offered tool's name; every entry gets it in its
                API's form (a text-mode entry by constrained decoding).
            response_format: Shortcut for ``settings.response_format`` (not with ``settings``):
                the answer's JSON format, sent to entries with native JSON-schema mode.
            on_first_token: Called once when the committed attempt's first fragment arrives.

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
            TypeError: ``settings`` given together with a keyword shortcut.
            asyncio.CancelledError: propagates at once; the HTTP stream is closed and an
                attempt in flight is recorded with ``error_class="cancelled"``.
        """
        call = _CallState(
            messages, tools, _call_settings(settings, max_output_tokens, compact_first, tool_choice, response_format),
            estimate_tokens(messages, tools), list(self._entries), on_first_token,
        )
        while (entry := await self._next_entry(call)) is not None:
            retries = 0
            wait_seconds = 0.0
            while True:  # attempts on this entry
                attempt, events = self._start_attempt(call, entry, wait_seconds)
                failure: ModelCallError | None = None
                try:
                    while True:
                        event = await self._next_event(events, attempt)
                        if isinstance(event, Completion):
                            await self._emit(attempt, attempt.record(status="succeeded", usage=event.usage,
                                                                     completion=event))
                            await self._health_success(entry)
                            yield event
                            return
                        attempt.output_chars += len(event.text)
                        yield event
                except ModelCallError as err:
                    failure = await self._failed(call, attempt, err)
                except (asyncio.CancelledError, GeneratorExit):
                    attempt.cancelled = True
                    raise
                finally:
                    await events.aclose()  # type: ignore[attr-defined]
                    if not attempt.recorded:
                        await self._record_unfinished(call, attempt)
                wait_seconds = await self._after_attempt(call, attempt, failure, retries=retries)
                if wait_seconds is None:
                    break
                await self._clock.sleep(wait_seconds)
                retries += 1
            await self._leave_entry(call, entry, failure)
        raise self._exhausted(call)

    # -- the steps of a call --

    async def _next_entry(self, call: _CallState) -> RouteEntryConfig | None:
        """The next entry to attempt, or None when the route is used up.

        Entries that cannot take the request are skipped (recorded in ``call.skipped``, a
        ``model_fallback`` event each); when every suitable entry is cooling down and nothing
        was attempted, the one whose cooldown ends first is tried anyway (once).
        """
        while True:
            if call.position >= len(call.order):
                if call.attempts or not call.cooling or call.rescue:
                    return None
                # Every suitable entry is cooling down: try the one that recovers first rather
                # than failing without a single attempt.
                call.order.append(await self._soonest_available(call.cooling))
                call.rescue = True
            entry = call.order[call.position]
            call.position += 1
            reason = None if call.rescue else _skip_reason(call, entry)
            if reason is None and not call.rescue and not await self._available(entry):
                reason = "cooldown"
            await self._fallback_event(call.leaving, entry)
            if reason is None:
                call.leaving = None
                return entry
            call.skip(entry, reason)

    def _start_attempt(
        self, call: _CallState, entry: RouteEntryConfig, wait_seconds: float
    ) -> tuple[_Attempt, AsyncIterator[StreamEvent]]:
        """Count and time a new attempt on ``entry`` and open its adapter stream."""
        call.attempts += 1
        attempt = _Attempt(
            entry, call.attempts, now=asyncio.get_running_loop().time(),
            retry_wait_ms=round(wait_seconds * 1000), notify=call.notify,
        )
        if self._capture_bodies:
            attempt.bodies = BodyCapture(secrets=(entry.api_key,))
            events = _adapter_for(entry).stream(  # type: ignore[call-arg]
                call.messages, call.tools, call.settings, on_first_token=attempt.mark_first_token,
                capture=attempt.bodies,
            )
            return attempt, events
        events = _adapter_for(entry).stream(
            call.messages, call.tools, call.settings, on_first_token=attempt.mark_first_token
        )
        return attempt, events

    async def _failed(self, call: _CallState, attempt: _Attempt, err: ModelCallError) -> ModelCallError:
        """Record a failed attempt; the failure with the entry's key redacted from it."""
        failure = err.redact((attempt.entry.api_key,))  # a provider may echo the key back
        failed = attempt.record(
            status="failed",
            usage=attempt.failure_usage(call.messages, call.tools),
            error_class=err.error_class,
            error=err.message if err.status_code is None else f"HTTP {err.status_code}: {err.message}",
        )
        call.failures.append(failed)
        await self._emit(attempt, failed)
        return failure

    async def _record_unfinished(self, call: _CallState, attempt: _Attempt) -> None:
        """Record an attempt that ended without a completion or a classified failure: the
        caller cancelled or closed the stream, or an unexpected error in the model layer."""
        cancelled = attempt.cancelled
        await self._emit(
            attempt,
            attempt.record(
                status="failed",
                usage=attempt.failure_usage(call.messages, call.tools),
                error_class="cancelled" if cancelled else "other",
                error="cancelled by the caller" if cancelled else "unexpected error in the model layer",
            ),
        )

    async def _after_attempt(
        self, call: _CallState, attempt: _Attempt, failure: ModelCallError | None, *, retries: int
    ) -> float | None:
        """What follows a failed attempt: the wait before retrying its entry, seconds, or None
        to leave the entry.

        Raises:
            StreamInterrupted: the attempt had streamed its first fragment (never falls back).
            ModelCallError: a ``bad_request`` (see :meth:`_after_failure`).
        """
        if failure is None:  # pragma: no cover - the attempt loop ends by return or exception
            raise RuntimeError("attempt ended without an outcome")
        entry = attempt.entry
        if attempt.first_token_at is not None:
            await self._health_failure(entry, failure, retries_exhausted=True)
            raise StreamInterrupted(
                failure, entry_index=entry.index, provider_name=entry.provider_name, model=entry.model
            ) from failure
        return await self._after_failure(entry, failure, retries=retries, next_attempt=call.attempts + 1)

    async def _leave_entry(self, call: _CallState, entry: RouteEntryConfig, failure: ModelCallError | None) -> None:
        """Book a failed entry into the call; a ``context_window`` rejection raises
        :class:`~llm.errors.ContextWindowExceeded` at once under ``compact_first``."""
        assert failure is not None  # the entry's attempt loop only breaks after a failure
        call.last_error = failure
        call.leaving = (entry, failure.error_class)
        if failure.error_class != "context_window":
            call.failed_otherwise = True
            return
        call.size_limited = True
        call.window_floor = max(call.window_floor, entry.max_input_tokens)
        if call.settings.compact_first:
            raise ContextWindowExceeded(
                estimated_prompt_tokens=call.prompt_tokens,
                largest_window_tokens=max(e.max_input_tokens for e in self._entries),
                attempts=call.failures, last_error=failure, skipped=call.skipped,
            )

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

    def _exhausted(self, call: _CallState) -> Exception:
        """The error to raise when no entry answered."""
        if not call.failed_otherwise and call.size_limited:
            return ContextWindowExceeded(
                estimated_prompt_tokens=call.prompt_tokens,
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
        settings: ModelSettings | None = None,
        *,
        max_output_tokens: int | None = None,
    ) -> Completion:
        """:meth:`stream` consumed to its ``Completion`` (same retries, fallback, records and errors)."""
        stream = self.stream(messages, tools, settings, max_output_tokens=max_output_tokens)
        try:
            async for event in stream:
                if isinstance(event, Completion):
                    return event
        finally:
            await stream.aclose()  # type: ignore[attr-defined]
        raise ModelCallError("other", "the router stream ended without a completion")  # pragma: no cover


Router = FallbackModel
"""The name the runner and the services use for :class:`FallbackModel`."""

__all__ = [
    "FallbackModel",
    "Router",
    "output_reserve_tokens",
    "unsuitable_reason",
]
