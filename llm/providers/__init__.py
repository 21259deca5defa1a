"""Provider adapters: one :class:`~llm.model.Model` class per wire API.

* ``openai`` → :class:`llm.providers.openai_compat.OpenAICompatModel` (chat completions);
* ``anthropic`` → :class:`llm.providers.anthropic.AnthropicModel` (Messages API), imported
  lazily, so the module and its SDK are only needed by routes that use it.

:func:`model_for` picks the adapter of a route entry; the fallback router
(:mod:`llm.router`) calls it once per attempt. No adapter imports the router.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Sequence
from typing import TYPE_CHECKING

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


__all__ = ["UnavailableModel", "model_for"]
