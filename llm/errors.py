"""Errors of the model layer, and the classification of provider SDK exceptions.

Every error the model layer raises is an :class:`LLMError`:

* :class:`ModelCallError`: one call to one route entry failed; ``error_class`` says how
  (``rate_limit``, ``server``, ``timeout``, ``network``, ``bad_request``, ``auth``,
  ``not_found``, ``context_window``, ``other``). The router decides from it whether to fall
  back; a ``bad_request`` reaches the caller as is.
* :class:`StreamInterrupted`: a call failed after its first streamed token. The router never
  falls back then (the user already saw part of an answer); the runner may retry the turn.
* :class:`AllEntriesFailed`: every route entry failed before its first token.

:func:`classify_error` is the one place that maps OpenAI-SDK (and transport) exceptions to a
:class:`ModelCallError`. It is pure: it reads the exception's type, status code, headers and
body and has no side effects.
"""

from __future__ import annotations

import email.utils
import json
import math
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Final, Literal

import httpx
import openai

try:  # the openai 3.x SDK runs on httpx2; its exceptions are usually wrapped, but not always.
    import httpx2 as _httpx2
except ImportError:  # pragma: no cover - depends on the installed SDK generation
    _httpx2 = None

if TYPE_CHECKING:
    from llm.router import AttemptRecord

ErrorClass = Literal[
    "rate_limit", "server", "timeout", "network", "bad_request", "auth", "not_found", "context_window", "other"
]

ERROR_CLASSES: Final[frozenset[str]] = frozenset(
    {"rate_limit", "server", "timeout", "network", "bad_request", "auth", "not_found", "context_window", "other"}
)

NO_FALLBACK_CLASSES: Final[frozenset[str]] = frozenset({"bad_request"})
"""Error classes the router surfaces instead of trying the next route entry.

A bad request would fail the same way on every entry. Everything else (including ``auth`` and
``not_found``: one misconfigured entry must not take the route down, and ``context_window``:
a later entry may have a larger window) falls back.
"""

_CONTEXT_WINDOW_MARKERS: Final[tuple[str, ...]] = (
    "context_length_exceeded",
    "context length",
    "context window",
    "maximum context",
    "context_window",
    "too many tokens",
    "prompt is too long",
    "exceeds the context",
    "exceed context",
    "requested tokens",
    "input is too long",
    "reduce the length",
)

_MAX_MESSAGE_CHARS: Final[int] = 500


class LLMError(Exception):
    """Base of every error raised by the model layer (``llm``)."""


class ModelCallError(LLMError):
    """One call to one route entry failed.

    Attributes:
        error_class: One of :data:`ERROR_CLASSES`.
        status_code: The provider's HTTP status, or None (timeouts, network errors, errors
            reported inside an already-open stream).
        retry_after_seconds: The provider's ``Retry-After`` (or ``retry-after-ms``) in
            seconds, or None when it sent none.
        message: Human-readable, at most ~500 characters; never contains the API key.
    """

    def __init__(
        self,
        error_class: ErrorClass,
        message: str,
        *,
        status_code: int | None = None,
        retry_after_seconds: float | None = None,
    ) -> None:
        if error_class not in ERROR_CLASSES:
            raise ValueError(f"unknown error class {error_class!r}")
        super().__init__(message)
        self.error_class: ErrorClass = error_class
        self.status_code = status_code
        self.retry_after_seconds = retry_after_seconds
        self.message = message

    @property
    def falls_back(self) -> bool:
        """True when the router should try the next entry (before the first token)."""
        return self.error_class not in NO_FALLBACK_CLASSES

    def __str__(self) -> str:
        status = f" HTTP {self.status_code}" if self.status_code is not None else ""
        return f"{self.error_class}{status}: {self.message}"

    def __repr__(self) -> str:
        return (
            f"ModelCallError({self.error_class!r}, {self.message!r}, status_code={self.status_code!r}, "
            f"retry_after_seconds={self.retry_after_seconds!r})"
        )


class StreamInterrupted(LLMError):
    """A model call failed after its first streamed token (or tool-call fragment).

    The router never falls back then: part of the answer was already streamed. The runner may
    retry the whole turn (``retryable`` is always True).

    Args:
        cause: The classified failure, or a message (wrapped as an ``other`` failure), e.g.
            a caller noticing a stream that ended without its ``Completion``.
        entry_index: The route entry (0-based) whose stream broke, when known.
        provider_name: That entry's provider.
        model: That entry's model.

    Attributes:
        cause: The classified failure (a ``ModelCallError``).
        error_class: ``cause.error_class``.
        entry_index, provider_name, model: As given (None / ``""`` when unknown).
    """

    retryable: Final[bool] = True

    def __init__(
        self,
        cause: ModelCallError | str,
        *,
        entry_index: int | None = None,
        provider_name: str = "",
        model: str = "",
    ) -> None:
        if isinstance(cause, str):
            cause = ModelCallError("other", cause)
        where = f" from {provider_name}:{model} (route entry {entry_index})" if entry_index is not None else ""
        super().__init__(f"stream{where} interrupted after the first token: {cause}")
        self.cause = cause
        self.error_class: ErrorClass = cause.error_class
        self.entry_index = entry_index
        self.provider_name = provider_name
        self.model = model


class AllEntriesFailed(LLMError):
    """Every route entry failed before its first token.

    Attributes:
        attempts: One record per failed attempt, in order (``status == "failed"``).
        last_error: The failure of the last attempt, or None when the route was empty.
    """

    def __init__(self, attempts: Sequence[AttemptRecord], *, last_error: ModelCallError | None = None) -> None:
        summary = "; ".join(
            f"#{a.entry_index} {a.provider_name}:{a.model} {a.error_class}" for a in attempts
        ) or "no route entries"
        super().__init__(f"all {len(attempts)} route entries failed ({summary})")
        self.attempts: list[AttemptRecord] = list(attempts)
        self.last_error = last_error


# --- Classification ------------------------------------------------------------------------


def classify_error(exc: BaseException) -> ModelCallError:
    """Map an exception raised while calling a provider to a :class:`ModelCallError`.

    Pure: looks only at the exception's type, ``status_code``, response headers and body.

    Args:
        exc: Typically an ``openai.APIError`` subclass (``APIStatusError``, ``APITimeoutError``,
            ``APIConnectionError``, an in-stream ``APIError``); also ``TimeoutError`` (our own
            first-chunk / between-chunk timer), raw ``httpx``/``httpx2`` transport errors and
            ``ValueError`` (undecodable stream data). An existing ``ModelCallError`` is
            returned unchanged.

    Returns:
        The classified error (a new object; raise it ``from exc``).
    """
    if isinstance(exc, ModelCallError):
        return exc
    if isinstance(exc, openai.APITimeoutError):
        return ModelCallError("timeout", _cause_message(exc, "request timed out"))
    if isinstance(exc, openai.APIConnectionError):
        return ModelCallError("network", _cause_message(exc, "connection error"))
    if isinstance(exc, openai.APIStatusError):
        return _classify_status(exc.status_code, exc.body, exc.response.headers, exc.message)
    if isinstance(exc, openai.APIResponseValidationError):  # pragma: no cover - strict validation is off
        return ModelCallError("other", _truncate(f"invalid response: {exc.message}"), status_code=exc.status_code)
    if isinstance(exc, openai.APIError):
        # An error object inside an open stream: no HTTP status, only the body.
        return _classify_body_only(exc.body, exc.message)
    if isinstance(exc, TimeoutError):
        return ModelCallError("timeout", _truncate(str(exc) or "no data from the provider within the read timeout"))
    if _is_transport_timeout(exc):
        return ModelCallError("timeout", _truncate(f"{type(exc).__name__}: {exc}"))
    if _is_transport_error(exc) or isinstance(exc, ConnectionError):
        return ModelCallError("network", _truncate(f"{type(exc).__name__}: {exc}"))
    return ModelCallError("other", _truncate(f"{type(exc).__name__}: {exc}"))


def _classify_status(status: int, body: object, headers: Mapping[str, str], message: str) -> ModelCallError:
    text = _truncate(_body_message(body) or message or f"HTTP {status}")
    if status == 429:
        return ModelCallError(
            "rate_limit", text, status_code=status, retry_after_seconds=parse_retry_after(headers)
        )
    if status >= 500:
        return ModelCallError("server", text, status_code=status, retry_after_seconds=parse_retry_after(headers))
    if status in (401, 403):
        return ModelCallError("auth", text, status_code=status)
    if status == 404:
        return ModelCallError("not_found", text, status_code=status)
    if status == 408:
        return ModelCallError("timeout", text, status_code=status)
    if status == 413 or (status in (400, 422) and _mentions_context_window(body, message)):
        return ModelCallError("context_window", text, status_code=status)
    if status in (400, 422):
        return ModelCallError("bad_request", text, status_code=status)
    return ModelCallError("other", text, status_code=status)


def _classify_body_only(body: object, message: str) -> ModelCallError:
    text = _truncate(_body_message(body) or message or "error inside the stream")
    kind = " ".join(
        str(body.get(key, "")) for key in ("type", "code") if isinstance(body, Mapping)
    ).lower()
    if _mentions_context_window(body, message):
        return ModelCallError("context_window", text)
    if "rate_limit" in kind or "rate limit" in kind:
        return ModelCallError("rate_limit", text)
    if any(word in kind for word in ("server_error", "overloaded", "internal", "unavailable")):
        return ModelCallError("server", text)
    if "invalid_request" in kind:
        return ModelCallError("bad_request", text)
    if "auth" in kind or "permission" in kind:
        return ModelCallError("auth", text)
    return ModelCallError("other", text)


def parse_retry_after(headers: Mapping[str, str] | None, *, now: float | None = None) -> float | None:
    """Seconds to wait according to ``retry-after-ms`` or ``Retry-After``.

    Args:
        headers: Response headers (case-insensitive mapping such as ``httpx.Headers``, or a
            plain dict with lower-case keys).
        now: Current Unix time in seconds for HTTP-date values (default: ``time.time()``).

    Returns:
        Non-negative seconds, or None when absent or unparsable.
    """
    if not headers:
        return None
    raw_ms = headers.get("retry-after-ms")
    if raw_ms is not None:
        try:
            value = float(raw_ms) / 1000.0
        except ValueError:
            value = math.nan
        if math.isfinite(value) and value >= 0:
            return value
    raw = headers.get("retry-after")
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(raw)
        except (TypeError, ValueError, IndexError):
            return None
        if when is None:
            return None
        value = when.timestamp() - (time.time() if now is None else now)
        return max(0.0, value)
    return value if math.isfinite(value) and value >= 0 else None


def _body_message(body: object) -> str:
    """The human message inside an error body (``{"error": {"message": ...}}`` and variants)."""
    if isinstance(body, Mapping):
        error = body.get("error", body)
        if isinstance(error, Mapping):
            message = error.get("message") or error.get("detail")
            if isinstance(message, str):
                return message
        elif isinstance(error, str):
            return error
        detail = body.get("detail") or body.get("message")
        if isinstance(detail, str):
            return detail
        return ""
    if isinstance(body, str):
        return body
    return ""


def _mentions_context_window(body: object, message: str) -> bool:
    try:
        haystack = (json.dumps(body, default=str) if body is not None else "") + " " + (message or "")
    except (TypeError, ValueError):
        haystack = message or ""
    haystack = haystack.lower()
    return any(marker in haystack for marker in _CONTEXT_WINDOW_MARKERS)


def _cause_message(exc: BaseException, default: str) -> str:
    cause = exc.__cause__ or exc.__context__
    if cause is not None and str(cause):
        return _truncate(f"{default}: {type(cause).__name__}: {cause}")
    return _truncate(str(exc) or default)


def _is_transport_timeout(exc: BaseException) -> bool:
    types: tuple[type[BaseException], ...] = (httpx.TimeoutException,)
    if _httpx2 is not None:
        types += (_httpx2.TimeoutException,)
    return isinstance(exc, types)


def _is_transport_error(exc: BaseException) -> bool:
    types: tuple[type[BaseException], ...] = (httpx.TransportError,)
    if _httpx2 is not None:
        types += (_httpx2.TransportError,)
    return isinstance(exc, types)


def _truncate(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _MAX_MESSAGE_CHARS else text[: _MAX_MESSAGE_CHARS - 1] + "…"


__all__ = [
    "ERROR_CLASSES",
    "NO_FALLBACK_CLASSES",
    "AllEntriesFailed",
    "ErrorClass",
    "LLMError",
    "ModelCallError",
    "StreamInterrupted",
    "classify_error",
    "parse_retry_after",
]
