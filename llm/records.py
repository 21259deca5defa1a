"""Records and callbacks of the model layer: what one attempt of a model call leaves behind.

:class:`AttemptRecord` is the data of one ``LLMCall`` row (written by the runner's record
callback); the router reports every attempt through a :data:`RecordCallback` exactly once,
and its ``model_retry`` / ``model_fallback`` events through an :data:`EventCallback`.
:class:`BodyCapture` is what an adapter fills when the caller records the exact bodies of its
model calls (a tenant's ``record_llm_bodies``; issue 40): the request as sent, the response
as received (a stream assembled). Pure dataclasses and type aliases: no Django, no I/O.
"""

from __future__ import annotations

import json
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
    bodies: BodyCapture | None = None
    """The attempt's request and response bodies (a router built with ``capture_bodies``);
    None: bodies are not recorded for this call (the default). Serialised only when a writer
    asks (:meth:`BodyCapture.texts`)."""
    finish_reason: str = ""
    """A succeeded attempt's :attr:`~llm.types.Completion.finish_reason` (``""``: not said, or failed)."""
    response_model: str = ""
    """A succeeded attempt's :attr:`~llm.types.Completion.model`, the model the provider says answered."""


class BodyCapture:
    """The bodies of one attempt, filled by the adapter that makes it; given to an adapter's
    ``stream(..., capture=)`` only when the caller records bodies (the router's
    ``capture_bodies``), so a call without it does no work for them at all.

    ``request``: the request body as sent: its JSON text (the bytes the adapter posted,
    decoded) or the dict the SDK serialises (``json.dumps`` at :meth:`texts`); None until the
    request was built. ``response``: the answer as one JSON object (an assembled stream), None
    until the whole answer came. ``secrets``: strings never to be written out (the entry's API
    key, set by the router), replaced by ``[redacted]`` in :meth:`texts`.
    """

    __slots__ = ("request", "response", "secrets")

    def __init__(self, *, secrets: tuple[str, ...] = ()) -> None:
        self.request: str | dict[str, Any] | None = None
        self.response: dict[str, Any] | None = None
        self.secrets = secrets

    def __repr__(self) -> str:  # never the secrets, never whole bodies in a log line
        return f"BodyCapture(request={self.request is not None}, response={self.response is not None})"

    def texts(self) -> tuple[str | None, str | None]:
        """``(request body, response body)`` as JSON text, each None when absent (a request
        never built, an answer that never came); every string of :attr:`secrets` at least 8
        characters long (an API key) replaced by ``[redacted]`` (shorter ones would mangle
        the body and are no key worth the name). A value ``json.dumps`` cannot encode is
        written with ``repr``. Raises nothing."""
        request = self.request if isinstance(self.request, str) or self.request is None else _json(self.request)
        response = None if self.response is None else _json(self.response)
        for secret in self.secrets:
            if secret and len(secret) >= 8:
                request = request.replace(secret, "[redacted]") if request is not None else None
                response = response.replace(secret, "[redacted]") if response is not None else None
        return request, response


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=repr)


RecordCallback = Callable[[AttemptRecord], Awaitable[None]]
"""Awaited once per attempt with its record; an exception it raises propagates to the caller."""
EventCallback = Callable[[str, dict[str, Any]], Awaitable[None]]
"""Awaited with ``(event name, payload)`` for ``model_retry`` and ``model_fallback``."""

__all__ = ["AttemptRecord", "BodyCapture", "EventCallback", "RecordCallback", "SkipReason"]
