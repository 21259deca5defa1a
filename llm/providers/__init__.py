"""Provider adapters: one :class:`~llm.model.Model` class per wire API.

* ``openai`` → :class:`llm.providers.openai_compat.OpenAICompatModel` (chat completions);
* ``anthropic`` → :class:`llm.providers.anthropic.AnthropicModel` (Messages API), imported
  lazily, so the module and its SDK are only needed by routes that use it.

:func:`model_for` picks the adapter of a route entry; the fallback router
(:mod:`llm.router`) calls it once per attempt. No adapter imports the router.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Sequence
from typing import TYPE_CHECKING, Any

from llm.errors import ModelCallError

if TYPE_CHECKING:
    from llm.config import RouteEntryConfig
    from llm.model import FirstTokenHook, Model, ModelSettings
    from llm.types import ChatMessage, StreamEvent, ToolSpec


class UnavailableModel:
    """A :class:`~llm.model.Model` whose every call fails at once with an ``other``
    :class:`~llm.errors.ModelCallError` carrying ``reason`` (recorded; the router falls back)."""

    __slots__ = ("entry", "reason")

    def __init__(self, entry: RouteEntryConfig, reason: str) -> None:
        self.entry = entry
        self.reason = reason

    async def stream(
        self,
        messages: Sequence[ChatMessage],
        tools: Sequence[ToolSpec],
        settings: ModelSettings | None = None,
        *,
        on_first_token: FirstTokenHook | None = None,
    ) -> AsyncGenerator[StreamEvent, None]:
        """Raises ``ModelCallError("other", reason)`` on the first ``anext``."""
        raise ModelCallError("other", self.reason)
        yield  # pragma: no cover - makes this an async generator


def model_for(entry: RouteEntryConfig) -> Model:
    """The adapter :class:`~llm.model.Model` for ``entry``, by ``entry.api``.

    Returns an :class:`UnavailableModel` (never raises) when the anthropic adapter cannot
    be imported (its SDK missing).
    """
    if entry.api == "anthropic":
        try:
            from llm.providers import anthropic as anthropic_adapter  # noqa: PLC0415 - lazy on purpose
        except ImportError as exc:
            return UnavailableModel(entry, f"the anthropic adapter cannot be loaded: {exc}")
        return anthropic_adapter.AnthropicModel(entry)
    return _openai_model_class()(entry)


_OPENAI_MODEL: list[type[Model]] = []


def _openai_model_class() -> type[Model]:
    """:class:`~llm.providers.openai_compat.OpenAICompatModel`, imported on first use (a
    submodule of this package cannot be imported while the package initialises) and kept:
    :func:`model_for` runs once per attempt."""
    if not _OPENAI_MODEL:
        from llm.providers.openai_compat import OpenAICompatModel  # noqa: PLC0415

        _OPENAI_MODEL.append(OpenAICompatModel)
    return _OPENAI_MODEL[0]


def sdk_client(*, api: str, base_url: str, api_key: str, connect_timeout_seconds: float,
               read_timeout_seconds: float) -> Any:
    """A new SDK client for a provider, built as the adapters build theirs (not cached).

    Every connect is checked against the outbound address rules; the SDK reads no credential
    from the environment; no retries. The caller closes it (``await client.close()``).

    Args:
        api: ``"anthropic"`` (an ``anthropic.AsyncAnthropic``; ``base_url`` may end in
            ``/v1``) or anything else for OpenAI-compatible (an ``openai.AsyncOpenAI``).
        base_url: The provider's base URL as configured.
        api_key: The decrypted key ("" for none).
        connect_timeout_seconds: Per TCP connect. read_timeout_seconds: Per read.

    Raises:
        ImportError: ``api`` is anthropic and its SDK cannot be imported.
    """
    if api == "anthropic":
        from llm.providers import anthropic as impl  # noqa: PLC0415 - lazy: the SDK only when used

        return impl.client_new((impl.api_root_url(base_url), api_key, connect_timeout_seconds, read_timeout_seconds))
    from llm.providers import openai_compat as openai_impl  # noqa: PLC0415

    return openai_impl.client_new((base_url, api_key, connect_timeout_seconds, read_timeout_seconds))


__all__ = ["UnavailableModel", "model_for", "sdk_client"]
