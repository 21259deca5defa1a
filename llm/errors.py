"""Errors of the model layer, and the classification of provider failures.

Every error the model layer raises is an :class:`LLMError`:

* :class:`ModelCallError`: one call to one route entry failed; ``error_class`` says how (one
  of :data:`ERROR_CLASSES`). The router decides from it whether to retry the entry, fall
  back to the next one, or surface the error (``bad_request``).
* :class:`StreamInterrupted`: a call failed after its first streamed token. The router never
  falls back then (the user already saw part of an answer); the runner may retry the turn.
* :class:`AllEntriesFailed`: every route entry failed (or was in cooldown) before its first
  token.
* :class:`ContextWindowExceeded` (an ``AllEntriesFailed``): the request is too large for
  every entry; the runner should compact the history.

:func:`classify_error` (exceptions) and :func:`classify_http_error` (status, body, headers)
are the one place that maps provider failures to error classes; :func:`classify_finish_reason`
does the same for a stream that ends with a content filter. All three are pure.
"""

from __future__ import annotations

import email.utils
import json
import math
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Literal, get_args

import httpx
import openai

try:  # the openai 3.x SDK runs on httpx2; its exceptions are usually wrapped, but not always.
    import httpx2 as _httpx2
except ImportError:  # pragma: no cover - depends on the installed SDK generation
    _httpx2 = None

if TYPE_CHECKING:
    from llm.records import AttemptRecord

ErrorClass = Literal[
    "rate_limit",
    "quota_exhausted",
    "overloaded",
    "server",
    "timeout",
    "network",
    "bad_request",
    "auth",
    "not_found",
    "context_window",
    "content_policy",
    "other",
]

ERROR_CLASSES: Final[frozenset[str]] = frozenset(get_args(ErrorClass))

NO_FALLBACK_CLASSES: Final[frozenset[str]] = frozenset({"bad_request"})
"""Error classes the router surfaces instead of trying the next route entry.

A bad request would fail the same way on every entry. Everything else falls back: ``auth``,
``not_found`` and ``quota_exhausted`` (one misconfigured or unpaid entry must not take the
route down), ``content_policy`` (another provider's filter may differ), ``context_window``
(only to an entry with a larger window; see :class:`ContextWindowExceeded`).
"""

RETRYABLE_CLASSES: Final[frozenset[str]] = frozenset({"rate_limit", "overloaded", "server", "timeout", "network"})
"""Error classes the router retries on the same entry (up to the entry's ``max_retries``,
with backoff) before falling back. Transient by nature: the same request may succeed a
moment later. ``quota_exhausted``/``auth``/``not_found`` will not fix themselves within a
call, ``content_policy``/``context_window``/``bad_request`` are about the request."""

_MAX_MESSAGE_CHARS: Final[int] = 500

REDACTED: Final[str] = "[redacted]"
"""What a secret in an error text is replaced with (:func:`redact_secrets`)."""

_SECRET_PATTERNS: Final[tuple[tuple[re.Pattern[str], str], ...]] = (
    # "Bearer <token>", "Basic <credentials>" (an echoed Authorization header).
    # (A credential has 8+ characters, one a digit: "Bearer token" or "Basic auth" are words.)
    (re.compile(r"\b(Bearer|Basic)(\s+)(?=[A-Za-z0-9._~+/=:-]*[0-9])[A-Za-z0-9._~+/=:-]{8,}", re.IGNORECASE),
     rf"\1\2{REDACTED}"),
    # "Authorization: …", "x-api-key=…", '"api_key": "…"', "?key=…", "access_token=…", "password: …".
    (re.compile(
        r"""(\b(?:proxy-)?authorization|\bx-api-key|\bx-goog-api-key|\bapi[-_]?key|\bkey|\baccess[-_]?token"""
        r"""|\brefresh[-_]?token|\btoken|\bsecret|\bpassword|\bpasswd)(["']?\s*[:=]\s*["']?)"""
        r"""(?!\[redacted\])(?:(?:Bearer|Basic)\s+)?[^\s"',;&}]{3,}""",
        re.IGNORECASE,
    ), rf"\1\2{REDACTED}"),
    # Well-known key shapes: OpenAI/DeepSeek/Anthropic "sk-…", GitHub, Slack, Google, Hugging Face.
    (re.compile(r"\b(?:sk|rk|pk)-[A-Za-z0-9_-]{8,}"), REDACTED),
    (re.compile(r"\b(?:ghp|gho|ghu|ghs|github_pat)_[A-Za-z0-9_]{10,}"), REDACTED),
    (re.compile(r"\bxox[abprs]-[A-Za-z0-9-]{10,}"), REDACTED),
    (re.compile(r"\bAIza[A-Za-z0-9_-]{20,}"), REDACTED),
    (re.compile(r"\bhf_[A-Za-z0-9]{20,}"), REDACTED),
)
"""Secrets recognised by their shape, whatever the key is (the provider's own key is
replaced by value besides, see :func:`redact_secrets`)."""

_TOKEN_RE: Final[re.Pattern[str]] = re.compile(r"[A-Za-z0-9._~+/=-]{8,}")
_MIN_SECRET_FRAGMENT: Final[int] = 8


def redact_secrets(text: str, *, secrets: Sequence[str] = ()) -> str:
    """``text`` with secrets replaced by ``[redacted]``.

    Replaced: every occurrence of each of ``secrets`` (the provider's API key, MCP header
    values… values shorter than 4 characters are ignored), any run of 8+ token characters
    that is a fragment of one of them (a key cut off by a length limit), ``Bearer …`` /
    ``Basic …`` credentials, values after ``Authorization``, ``x-api-key``, ``api_key``,
    ``key``, ``token``, ``secret``, ``password`` (``:`` or ``=``, quoted or not), and
    well-known key shapes (``sk-…``, ``ghp_…``, ``xoxb-…``, ``AIza…``, ``hf_…``). Pure.

    Args:
        text: Any text (an error message or body); a non-string is returned unchanged.
        secrets: Values known to be secret.

    Returns:
        The redacted text (the same text when nothing matched).
    """
    if not isinstance(text, str) or not text:
        return text
    known = [s for s in secrets if isinstance(s, str) and len(s) >= 4]
    for secret in sorted(known, key=len, reverse=True):
        text = text.replace(secret, REDACTED)
    if known:
        text = _TOKEN_RE.sub(
            lambda m: REDACTED if len(m.group(0)) >= _MIN_SECRET_FRAGMENT and any(m.group(0) in s for s in known)
            else m.group(0),
            text,
        )
    for pattern, replacement in _SECRET_PATTERNS:
        text = pattern.sub(replacement, text)
    return text


_PUBLIC_MESSAGES: Final[dict[str, str]] = {
    "rate_limit": "The model provider is rate limiting requests.",
    "quota_exhausted": "The model provider's quota or balance is used up.",
    "overloaded": "The model provider is overloaded.",
    "server": "The model provider had an internal error.",
    "timeout": "The model provider did not answer in time.",
    "network": "The model provider could not be reached.",
    "bad_request": "The model provider rejected the request.",
    "auth": "The model provider refused the credentials.",
    "not_found": "The model provider does not know the model.",
    "context_window": "The conversation is too long for the model.",
    "content_policy": "The model provider's content filter stopped the answer.",
    "other": "The model call failed.",
}


def public_error_message(error_class: str) -> str:
    """A plain sentence for ``error_class`` that is safe to show to any member: it quotes
    nothing a provider sent. Unknown classes get the ``other`` sentence."""
    return _PUBLIC_MESSAGES.get(error_class, _PUBLIC_MESSAGES["other"])


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
        message: Human-readable, at most ~500 characters; secrets recognised by their shape
            are redacted on construction (:func:`redact_secrets`), the entry's own API key by
            the router (:meth:`redact`).
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
        message = redact_secrets(message)
        super().__init__(message)
        self.error_class: ErrorClass = error_class
        self.status_code = status_code
        self.retry_after_seconds = retry_after_seconds
        self.message = message

    def redact(self, secrets: Sequence[str]) -> ModelCallError:
        """Replace ``secrets`` (e.g. the entry's API key, which a provider may echo in its
        error body) in the message, in place; returns ``self``."""
        self.message = redact_secrets(self.message, secrets=secrets)
        self.args = (self.message,)
        return self

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
    """Every route entry failed (or was skipped) before its first token.

    Attributes:
        attempts: One record per failed attempt, in order (``status == "failed"``); retries
            of one entry are separate records.
        last_error: The failure of the last attempt, or None when nothing was tried.
        skipped: ``(entry_index, reason)`` for entries skipped without an attempt
            (``"cooldown"``, ``"context_window"``, ``"no_tool_support"``), in route order.
    """

    def __init__(
        self,
        attempts: Sequence[AttemptRecord],
        *,
        last_error: ModelCallError | None = None,
        skipped: Sequence[tuple[int, str]] = (),
    ) -> None:
        summary = "; ".join(
            f"#{a.entry_index} {a.provider_name}:{a.model} {a.error_class}" for a in attempts
        ) or "no attempts"
        if skipped:
            summary += "; skipped " + ", ".join(f"#{index} ({reason})" for index, reason in skipped)
        super().__init__(f"all route entries failed after {len(attempts)} attempt(s) ({summary})")
        self.attempts: list[AttemptRecord] = list(attempts)
        self.last_error = last_error
        self.skipped: list[tuple[int, str]] = list(skipped)


class ContextWindowExceeded(AllEntriesFailed):
    """No route entry can take the request because it is too large.

    Raised when every entry that could have answered was ruled out by size: skipped because
    ``estimate_tokens(messages, tools) + output cap > max_input_tokens``, rejected by the
    provider with a ``context_window`` error, or skipped because its window is not larger
    than one that already rejected the request. The runner should compact the history and
    try again; falling back to another entry cannot help.

    It subclasses :class:`AllEntriesFailed` so callers that only know that class still fail
    the call cleanly.

    Attributes:
        estimated_prompt_tokens: The router's estimate of the prompt (``llm.tokens``), tokens.
        largest_window_tokens: The largest ``max_input_tokens`` in the route, tokens.
        attempts, last_error, skipped: As in :class:`AllEntriesFailed` (attempts that were
            made, e.g. the one rejected with ``context_window``; entries skipped for size).
    """

    def __init__(
        self,
        *,
        estimated_prompt_tokens: int,
        largest_window_tokens: int,
        attempts: Sequence[AttemptRecord] = (),
        last_error: ModelCallError | None = None,
        skipped: Sequence[tuple[int, str]] = (),
    ) -> None:
        super().__init__(attempts, last_error=last_error, skipped=skipped)
        self.args = (
            f"the request (about {estimated_prompt_tokens} prompt tokens) does not fit any route entry "
            f"(largest context window {largest_window_tokens} tokens); compact the history and retry",
        )
        self.estimated_prompt_tokens = estimated_prompt_tokens
        self.largest_window_tokens = largest_window_tokens


# --- Classification ------------------------------------------------------------------------
#
# Sources of the markers below (the fixtures in llm/tests/fixtures/error_bodies/ hold the real
# bodies, each with the URL where it was seen):
# * OpenAI: 429 ``insufficient_quota``; 400 ``context_length_exceeded``; 400
#   ``content_policy_violation``; 404 ``model_not_found``; Azure OpenAI 400 ``content_filter``
#   with ``innererror.code`` ``ResponsibleAIPolicyViolation``; 503 "That model is currently
#   overloaded"; Responses-API ``server_is_overloaded``.
# * DeepSeek: 402 "Insufficient Balance"; 401 ``authentication_error``; 400 "This model's
#   maximum context length is …" with ``code: invalid_request_error``.
# * Zhipu/BigModel (z.ai): ``code`` 1113 balance/arrears (sent with HTTP 429!), 1261 "Prompt
#   exceeds max length", 1301 unsafe/sensitive content, 1211 model does not exist (HTTP 400),
#   1302 rate limit (HTTP 429).
# * vLLM: top-level ``{"object": "error", "message": …, "type": "BadRequestError"}`` bodies.
# * llama.cpp server: ``exceed_context_size_error`` "the request exceeds the available context
#   size".
# * Ollama: "the input length exceeds the context length"; 404 "model … not found, try pulling
#   it first"; 503 "server busy, please try again.  maximum pending requests exceeded".
# * Anthropic: 529 ``overloaded_error``; 400 "prompt is too long: N tokens > M maximum"; 400
#   "Your credit balance is too low"; 401 ``authentication_error``; 404 ``not_found_error``;
#   429 ``rate_limit_error`` (a spend cap when ``details.error_code`` is
#   ``enforced_spend_limit_reached``); 402 ``billing_error``. Its SDK reports an ``error`` SSE
#   event as a status error with the stream's HTTP 200, so statuses below 400 are classified
#   by body only.

_QUOTA_CODES: Final[frozenset[str]] = frozenset(
    {
        "insufficient_quota",
        "credit_balance_exhausted",
        "billing_hard_limit_reached",
        "billing_error",
        "enforced_spend_limit_reached",
        "insufficient_balance",
        "1113",
        "30011",
    }
)
_QUOTA_MARKERS: Final[tuple[str, ...]] = (
    "insufficient balance",
    "insufficient_quota",
    "exceeded your current quota",
    "credit balance is too low",
    "billing hard limit",
    "paid balance is insufficient",
    "no resource package",
    "arrears",
    "余额不足",
    "欠费",
)
_CONTENT_CODES: Final[frozenset[str]] = frozenset(
    {"content_filter", "content_policy_violation", "responsibleaipolicyviolation", "1301", "invalid_prompt",
     "data_inspection_failed"}
)
_CONTENT_MARKERS: Final[tuple[str, ...]] = (
    "content management policy",
    "content_policy_violation",
    "rejected as a result of our safety system",
    "flagged as potentially violating",
    "content exists risk",
    "不安全或敏感内容",
    "sensitive content",
)
_CONTEXT_CODES: Final[frozenset[str]] = frozenset({"context_length_exceeded", "exceed_context_size_error", "1261"})
_CONTEXT_STRONG_MARKERS: Final[tuple[str, ...]] = (
    "context_length_exceeded",
    "maximum context length",
    "exceeds the available context size",
    "exceed_context_size_error",
    "prompt is too long",
    "prompt exceeds max length",
    "input length exceeds the context length",
    "exceed context limit",
    "too long to fit into the model",
    "exceeds the context window",
    "context window exceeded",
)
_CONTEXT_WEAK_MARKERS: Final[tuple[str, ...]] = (
    "context length",
    "context window",
    "context_window",
    "too many tokens",
    "requested tokens",
    "input is too long",
    "reduce the length",
    "exceeds the context",
    "exceed context",
)
"""Only believed on 400/413/422 and in-stream errors: "too many tokens" also appears in 429
token-rate messages."""
_OVERLOADED_CODES: Final[frozenset[str]] = frozenset(
    {"overloaded_error", "server_is_overloaded", "engine_overloaded_error", "service_unavailable_error", "1305"}
)
_OVERLOADED_MARKERS: Final[tuple[str, ...]] = (
    "overloaded",
    "server busy",
    "maximum pending requests exceeded",
    "service unavailable",
)
_RATE_LIMIT_CODES: Final[frozenset[str]] = frozenset(
    {"rate_limit_error", "rate_limit_exceeded", "rate_limit", "1302", "1303", "too_many_requests"}
)
_NOT_FOUND_CODES: Final[frozenset[str]] = frozenset({"model_not_found", "1211", "not_found_error", "notfounderror"})
_MODEL_MISSING_RE: Final[re.Pattern[str]] = re.compile(
    r"model\b[^.\n]{0,120}?\b(?:does not exist|not found|not exist)|模型不存在|no such model"
)
_AUTH_CODES: Final[frozenset[str]] = frozenset(
    {"authentication_error", "permission_error", "invalid_api_key", "permissiondeniederror",
     "authenticationerror", "1000", "1001", "1002", "1003", "1004"}
)
_SERVER_CODES: Final[frozenset[str]] = frozenset({"server_error", "api_error", "internal_error", "internalservererror"})

_CONTENT_FILTER_FINISH_REASONS: Final[frozenset[str]] = frozenset({"content_filter", "refusal"})


@dataclass(frozen=True, slots=True)
class _ErrorFacts:
    """What an error body says, normalised for matching."""

    message: str
    """The human message (``error.message`` and variants), as sent."""
    codes: frozenset[str]
    """Lower-cased ``type``/``code``/``status`` values of the body and its ``error`` object
    (and Azure's ``innererror.code``, Anthropic's ``details.error_code``)."""
    text: str
    """Lower-cased message plus the whole body as JSON, for phrase markers."""

    def has_code(self, codes: frozenset[str]) -> bool:
        return not self.codes.isdisjoint(codes)

    def mentions(self, markers: tuple[str, ...]) -> bool:
        return any(marker in self.text for marker in markers)


def _facts(body: object, message: str) -> _ErrorFacts:
    if isinstance(body, (str, bytes)):
        raw = body.decode("utf-8", "replace") if isinstance(body, bytes) else body
        try:
            body = json.loads(raw)
        except ValueError:
            body = raw
    layers: list[Mapping[str, object]] = []
    human = ""
    if isinstance(body, Mapping):
        layers.append(body)
        inner = body.get("error")
        if isinstance(inner, Mapping):
            layers.append(inner)
            nested = inner.get("error")  # an Anthropic body wrapped once more by a gateway
            if isinstance(nested, Mapping):
                layers.append(nested)
        elif isinstance(inner, str):
            human = inner
        for layer in reversed(layers):
            for key in ("message", "detail", "msg"):
                value = layer.get(key)
                if isinstance(value, str) and value:
                    human = human or value
                    break
    elif isinstance(body, str):
        human = body
    codes: set[str] = set()
    for layer in layers:
        for key in ("type", "code", "status"):
            value = layer.get(key)
            if isinstance(value, (str, int)) and not isinstance(value, bool):
                codes.add(str(value).strip().lower())
        for nested_key, code_key in (("innererror", "code"), ("details", "error_code")):
            nested = layer.get(nested_key)  # Azure's innererror.code, Anthropic's details.error_code
            if isinstance(nested, Mapping) and isinstance(nested.get(code_key), str):
                codes.add(str(nested[code_key]).lower())
    try:
        dumped = json.dumps(body, ensure_ascii=False, default=str) if body is not None else ""
    except (TypeError, ValueError):
        dumped = ""
    human = human or message or ""
    return _ErrorFacts(message=human, codes=frozenset(codes), text=f"{human} {message or ''} {dumped}".lower())


def classify_error(exc: BaseException) -> ModelCallError:
    """Map an exception raised while calling a provider to a :class:`ModelCallError`.

    Pure: looks only at the exception's type, ``status_code``, response headers and body.

    Args:
        exc: Typically an ``openai.APIError`` subclass (``APIStatusError``, ``APITimeoutError``,
            ``APIConnectionError``, an in-stream ``APIError``); the ``anthropic`` SDK's
            equivalents (matched by their attributes and class names, without importing
            it); ``TimeoutError`` (an asyncio timer); raw ``httpx``/``httpx2`` transport
            errors; ``ValueError`` (undecodable stream data). An existing ``ModelCallError``
            is returned unchanged.

    Returns:
        The classified error (a new object; raise it ``from exc``). See
        :func:`classify_http_error` for the status/body rules.
    """
    if isinstance(exc, ModelCallError):
        return exc
    names = {cls.__name__ for cls in type(exc).__mro__}
    if isinstance(exc, openai.APITimeoutError) or "APITimeoutError" in names:
        return ModelCallError("timeout", _cause_message(exc, "request timed out"))
    if isinstance(exc, openai.APIConnectionError) or "APIConnectionError" in names:
        return ModelCallError("network", _cause_message(exc, "connection error"))
    status = getattr(exc, "status_code", None)
    if isinstance(status, int) and not isinstance(status, bool):
        response = getattr(exc, "response", None)
        headers = getattr(response, "headers", None)
        return classify_http_error(
            status_code=status, body=getattr(exc, "body", None), headers=headers, message=_exc_message(exc)
        )
    if isinstance(exc, openai.APIError) or "APIError" in names:
        # An error object inside an open stream: no HTTP status, only the body.
        return classify_http_error(status_code=None, body=getattr(exc, "body", None), message=_exc_message(exc))
    if isinstance(exc, TimeoutError):
        return ModelCallError("timeout", _truncate(str(exc) or "no data from the provider within the read timeout"))
    if _is_transport_timeout(exc):
        return ModelCallError("timeout", _truncate(f"{type(exc).__name__}: {exc}"))
    if _is_transport_error(exc) or isinstance(exc, ConnectionError):
        return ModelCallError("network", _truncate(f"{type(exc).__name__}: {exc}"))
    return ModelCallError("other", _truncate(f"{type(exc).__name__}: {exc}"))


def classify_http_error(
    *,
    status_code: int | None,
    body: object,
    headers: Mapping[str, str] | None = None,
    message: str = "",
) -> ModelCallError:
    """Classify a provider error from its HTTP status, body and headers. Pure.

    Rules, first match wins:

    1. ``quota_exhausted``: HTTP 402, or a body saying the balance/quota is gone (OpenAI
       ``insufficient_quota`` on 429, DeepSeek 402 "Insufficient Balance", Zhipu ``1113`` on
       429, Anthropic "credit balance is too low" on 400).
    2. ``content_policy`` (any 4xx or in-stream): OpenAI ``content_policy_violation`` /
       ``content_filter`` (Azure), Zhipu ``1301``, DeepSeek "Content Exists Risk".
    3. By status: 429 → ``rate_limit`` (``overloaded`` when the body says overloaded, as
       Moonshot/z.ai do); 401/403 → ``auth``; 404 → ``not_found``; 408 → ``timeout``;
       413 → ``context_window``; 503/529 → ``overloaded``; other 5xx → ``server``
       (``context_window`` / ``overloaded`` when the body says so, e.g. old llama.cpp).
    4. 400/422: ``context_window`` when the body says so (OpenAI ``context_length_exceeded``,
       vLLM "maximum context length", llama.cpp ``exceed_context_size_error``, Ollama,
       Anthropic "prompt is too long", Zhipu ``1261``); ``not_found`` when it names a missing
       model (Zhipu ``1211`` comes as a 400); else ``bad_request``. Other 4xx → ``other``.
    5. No status, or a status below 400 (an error event inside a 200 stream): by the body's
       ``type``/``code`` alone, with the same markers.

    ``retry_after_seconds`` is read from ``retry-after-ms`` / ``Retry-After`` (see
    :func:`parse_retry_after`) for ``rate_limit``, ``overloaded`` and ``server``.

    Args:
        status_code: HTTP status, or None for an error reported inside an open stream.
        body: The error body as parsed JSON (the whole body or just its ``error`` object, as
            the SDKs keep it), or its text.
        headers: Response headers (case-insensitive mapping), if any.
        message: The SDK's message, used when the body has none.

    Returns:
        The classified :class:`ModelCallError` (message ≤ ~500 characters).
    """
    facts = _facts(body, message)
    text = _truncate(facts.message or (f"HTTP {status_code}" if status_code else "error inside the stream"))
    if status_code is None or status_code < 400:
        return _classify_body_only(facts, text)

    def error(error_class: ErrorClass, *, retry_after: bool = False) -> ModelCallError:
        return ModelCallError(
            error_class,
            text,
            status_code=status_code,
            retry_after_seconds=parse_retry_after(headers) if retry_after else None,
        )

    if status_code == 402 or facts.has_code(_QUOTA_CODES) or facts.mentions(_QUOTA_MARKERS):
        return error("quota_exhausted")
    if 400 <= status_code < 500 and status_code != 429 and (
        facts.has_code(_CONTENT_CODES) or facts.mentions(_CONTENT_MARKERS)
    ):
        return error("content_policy")
    if status_code == 429:
        if facts.has_code(_OVERLOADED_CODES) or facts.mentions(_OVERLOADED_MARKERS):
            return error("overloaded", retry_after=True)
        return error("rate_limit", retry_after=True)
    if status_code in (401, 403):
        return error("auth")
    if status_code == 404:
        return error("not_found")
    if status_code == 408:
        return error("timeout")
    if status_code == 413:
        return error("context_window")
    if status_code in (503, 529):
        return error("overloaded", retry_after=True)
    if status_code >= 500:
        if facts.has_code(_CONTEXT_CODES) or facts.mentions(_CONTEXT_STRONG_MARKERS):
            return error("context_window")
        if facts.has_code(_OVERLOADED_CODES) or facts.mentions(_OVERLOADED_MARKERS):
            return error("overloaded", retry_after=True)
        return error("server", retry_after=True)
    if status_code in (400, 422):
        if _says_context_window(facts):
            return error("context_window")
        if facts.has_code(_NOT_FOUND_CODES) or _MODEL_MISSING_RE.search(facts.text):
            return error("not_found")
        return error("bad_request")
    return error("other")


def _says_context_window(facts: _ErrorFacts) -> bool:
    return (
        facts.has_code(_CONTEXT_CODES)
        or facts.mentions(_CONTEXT_STRONG_MARKERS)
        or facts.mentions(_CONTEXT_WEAK_MARKERS)
    )


def _classify_body_only(facts: _ErrorFacts, text: str) -> ModelCallError:
    if facts.has_code(_QUOTA_CODES) or facts.mentions(_QUOTA_MARKERS):
        return ModelCallError("quota_exhausted", text)
    if facts.has_code(_CONTENT_CODES) or facts.mentions(_CONTENT_MARKERS):
        return ModelCallError("content_policy", text)
    if _says_context_window(facts):
        return ModelCallError("context_window", text)
    if facts.has_code(_OVERLOADED_CODES) or facts.mentions(_OVERLOADED_MARKERS):
        return ModelCallError("overloaded", text)
    if facts.has_code(_RATE_LIMIT_CODES) or "rate limit" in facts.text or "rate_limit" in facts.text:
        return ModelCallError("rate_limit", text)
    if facts.has_code(_SERVER_CODES) or any(w in facts.text for w in ("server_error", "internal", "unavailable")):
        return ModelCallError("server", text)
    if facts.has_code(_NOT_FOUND_CODES) or _MODEL_MISSING_RE.search(facts.text):
        return ModelCallError("not_found", text)
    if facts.has_code(_AUTH_CODES) or any(w in facts.text for w in ("authentication", "permission")):
        return ModelCallError("auth", text)
    if "invalid_request" in facts.text or facts.has_code(frozenset({"badrequesterror"})):
        return ModelCallError("bad_request", text)
    return ModelCallError("other", text)


def classify_finish_reason(finish_reason: str | None) -> ModelCallError | None:
    """The failure a stream's finish reason stands for, or None when it is a normal end.

    ``content_filter`` (OpenAI / Azure: the provider's filter cut or withheld the answer)
    and ``refusal`` (Anthropic's stop reason when its safety classifiers step in) are
    ``content_policy`` failures; everything else (``stop``, ``length``, ``tool_calls``,
    ``end_turn``, None) is not an error. Pure.
    """
    if finish_reason in _CONTENT_FILTER_FINISH_REASONS:
        return ModelCallError(
            "content_policy", f"the provider's content filter stopped the answer (finish reason {finish_reason!r})"
        )
    return None


def _exc_message(exc: BaseException) -> str:
    message = getattr(exc, "message", None)
    return message if isinstance(message, str) else str(exc)


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
    text = redact_secrets(" ".join(text.split()))
    return text if len(text) <= _MAX_MESSAGE_CHARS else text[: _MAX_MESSAGE_CHARS - 1] + "…"


__all__ = [
    "ERROR_CLASSES",
    "NO_FALLBACK_CLASSES",
    "RETRYABLE_CLASSES",
    "AllEntriesFailed",
    "ContextWindowExceeded",
    "ErrorClass",
    "LLMError",
    "ModelCallError",
    "StreamInterrupted",
    "classify_error",
    "classify_finish_reason",
    "classify_http_error",
    "parse_retry_after",
    "public_error_message",
    "redact_secrets",
]
