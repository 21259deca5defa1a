"""Configuration records of the model layer: one route entry, and the retry wait rule.

A :class:`RouteEntryConfig` is one provider/model of a tenant's route with its credentials
and limits resolved (built by :func:`llm.selectors.route_entry_config`); provider adapters
(:mod:`llm.providers`) and the fallback router (:mod:`llm.router`) both read it, so it lives
here, below both. :class:`BackoffPolicy` is the router's wait rule between same-entry
retries. Pure dataclasses: no Django, no I/O.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Any, Final, Literal

ToolCallMode = Literal["native", "text"]
ApiKind = Literal["openai", "anthropic"]


def _positive_seconds(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


def _non_negative_finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and value >= 0


@dataclass(frozen=True, slots=True)
class RouteEntryConfig:
    """One provider/model entry of a route, with its credentials and limits resolved.

    Raises:
        ValueError: (on construction) a field outside its documented range.
    """

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
    supports_images: bool = False
    """True when the model takes image input: the adapters then send a user message's
    :attr:`~llm.types.ChatMessage.images` as image parts; False sends its text alone."""
    json_schema_mode: bool = False
    """True when the provider constrains decoding to a JSON Schema given as the request's
    ``response_format`` (OpenAI, vLLM, llama.cpp's ``llama-server``): an output format
    (:attr:`~llm.model.ModelSettings.response_format`) is then sent; False: it is only prompted."""

    def __post_init__(self) -> None:
        self._check_shape()
        self._check_timeouts()
        self._check_money_and_flags()

    def _check_shape(self) -> None:
        if self.index < 0:
            raise ValueError(f"index must be >= 0, got {self.index!r}")
        if self.tool_calls not in ("native", "text"):
            raise ValueError(f"tool_calls must be 'native' or 'text', got {self.tool_calls!r}")
        if self.max_output_tokens < 0 or self.max_input_tokens < 0:
            raise ValueError("token limits must be >= 0")
        if self.api not in ("openai", "anthropic"):
            raise ValueError(f"api must be 'openai' or 'anthropic', got {self.api!r}")
        if isinstance(self.max_retries, bool) or not isinstance(self.max_retries, int) or self.max_retries < 0:
            raise ValueError(f"max_retries must be an int >= 0, got {self.max_retries!r}")

    def _check_timeouts(self) -> None:
        for name in ("connect_timeout_seconds", "read_timeout_seconds"):
            value = getattr(self, name)
            if not _positive_seconds(value):
                raise ValueError(f"{name} must be positive finite seconds, got {value!r}")
        for name in ("first_token_timeout_seconds", "stream_timeout_seconds"):
            value = getattr(self, name)
            if value is not None and not _positive_seconds(value):
                raise ValueError(f"{name} must be None or positive finite seconds, got {value!r}")

    def _check_money_and_flags(self) -> None:
        for name in ("input_price_per_mtok", "output_price_per_mtok"):
            value = getattr(self, name)
            if not _non_negative_finite(value):
                raise ValueError(f"{name} must be finite USD >= 0, got {value!r}")
        for name in ("supports_tools", "supports_images", "json_schema_mode"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a bool, got {getattr(self, name)!r}")
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

    Raises:
        ValueError: (on construction) a negative or non-finite number of seconds.
    """

    base_seconds: float = 0.5
    cap_seconds: float = 8.0
    max_retry_after_seconds: float = 30.0

    def __post_init__(self) -> None:
        for name in ("base_seconds", "cap_seconds", "max_retry_after_seconds"):
            value = getattr(self, name)
            if not _non_negative_finite(value):
                raise ValueError(f"{name} must be finite seconds >= 0, got {value!r}")

    def ceiling(self, retry_number: int) -> float:
        """Upper bound of the ``retry_number``-th (0-based) jittered wait, seconds."""
        return min(self.cap_seconds, self.base_seconds * (2 ** min(retry_number, 62)))

    def delay(self, *, retry_number: int, rng: random.Random) -> float:
        """A full-jitter wait for the ``retry_number``-th (0-based) retry, seconds."""
        return rng.uniform(0.0, self.ceiling(retry_number))


DEFAULT_BACKOFF: Final[BackoffPolicy] = BackoffPolicy()

__all__ = ["DEFAULT_BACKOFF", "ApiKind", "BackoffPolicy", "RouteEntryConfig", "ToolCallMode"]
