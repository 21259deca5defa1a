"""Records and callbacks of the model layer: what one attempt of a model call leaves behind.

:class:`AttemptRecord` is the data of one ``LLMCall`` row (written by the runner's record
callback); the router reports every attempt through a :data:`RecordCallback` exactly once,
and its ``model_retry`` / ``model_fallback`` events through an :data:`EventCallback`.
Pure dataclasses and type aliases: no Django, no I/O.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal

SkipReason = Literal["cooldown", "context_window", "no_tool_support"]
"""Why the router passed over a route entry without an attempt."""


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
"""Awaited once per attempt with its record; an exception it raises propagates to the caller."""
EventCallback = Callable[[str, dict[str, Any]], Awaitable[None]]
"""Awaited with ``(event name, payload)`` for ``model_retry`` and ``model_fallback``."""

__all__ = ["AttemptRecord", "EventCallback", "RecordCallback", "SkipReason"]
