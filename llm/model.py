"""The model protocol: one streamed model call, whatever answers it.

Everything that can answer a conversation implements :class:`Model`: the per-API adapters
(:class:`llm.providers.openai_compat.OpenAICompatModel`,
:class:`llm.providers.anthropic.AnthropicModel`, each over one route entry) and the fallback
router (:class:`llm.router.FallbackModel`, over a whole route). Callers (the runner, the
compaction step, the console's probe) hold a ``Model`` and call :meth:`Model.stream`;
which provider answers, and how failures are retried, is the implementation's business.

The shape follows pydantic-ai's ``Model.request_stream(messages, settings, parameters)`` and
openai-agents' ``Model.stream_response(...)``: canonical messages in (:mod:`llm.types`, the
OpenAI chat shape), typed stream events out. No Django, no I/O here.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Final, Protocol, runtime_checkable

from llm.types import ChatMessage, StreamEvent, ToolSpec

if TYPE_CHECKING:
    from llm.config import RouteEntryConfig


@dataclass(frozen=True, slots=True)
class ModelSettings:
    """Per-call settings of :meth:`Model.stream` (a route entry's own limits still apply).

    Raises:
        ValueError: (on construction) a negative output cap or a temperature outside [0, 2].
    """

    max_output_tokens: int | None = None
    """Cap on generated tokens for this call; the entry's own ``max_output_tokens`` still
    applies (the smaller wins). None: the entry's cap only."""
    temperature: float | None = None
    """Sampling temperature for this call (0–2), replacing the entry's; None: the entry's."""
    compact_first: bool = False
    """For the fallback router: on a ``context_window`` rejection raise
    :class:`~llm.errors.ContextWindowExceeded` at once (the caller compacts) instead of
    trying a larger entry. Single-entry adapters ignore it."""

    def __post_init__(self) -> None:
        if self.max_output_tokens is not None and (
            isinstance(self.max_output_tokens, bool) or not isinstance(self.max_output_tokens, int)
            or self.max_output_tokens < 0
        ):
            raise ValueError(f"max_output_tokens must be None or an int >= 0, got {self.max_output_tokens!r}")
        if self.temperature is not None and not (
            isinstance(self.temperature, (int, float)) and 0 <= self.temperature <= 2
        ):
            raise ValueError(f"temperature must be None or within [0, 2], got {self.temperature!r}")

    def applied_to(self, entry: RouteEntryConfig) -> RouteEntryConfig:
        """``entry`` with this call's overrides (``temperature``); ``entry`` itself when none."""
        if self.temperature is None:
            return entry
        return replace(entry, temperature=self.temperature)


DEFAULT_SETTINGS: Final[ModelSettings] = ModelSettings()
"""No per-call overrides."""

FirstTokenHook = Callable[[], None]
"""Called synchronously, at most once per attempt, when the first text, reasoning or
tool-call fragment arrives (before anything is yielded for it)."""


@runtime_checkable
class Model(Protocol):
    """One streamed model call.

    ``stream(messages, tools, settings)`` yields ``TextDelta`` / ``ReasoningDelta`` fragments
    of the answer, then exactly one ``Completion`` (the whole assistant message, its usage,
    ``entry_index`` and ``model``), and nothing after it.

    Errors: a failed call raises a :class:`~llm.errors.ModelCallError` (classified: see
    :data:`llm.errors.ERROR_CLASSES`); the fallback router also raises
    :class:`~llm.errors.StreamInterrupted`, :class:`~llm.errors.ContextWindowExceeded` and
    :class:`~llm.errors.AllEntriesFailed`. Cancellation propagates; closing the iterator early
    closes the HTTP stream.
    """

    def stream(
        self,
        messages: Sequence[ChatMessage],
        tools: Sequence[ToolSpec],
        settings: ModelSettings | None = None,
        *,
        on_first_token: FirstTokenHook | None = None,
    ) -> AsyncIterator[StreamEvent]:
        """Stream one call; see the class docstring for the events and errors."""
        ...


__all__ = ["DEFAULT_SETTINGS", "FirstTokenHook", "Model", "ModelSettings"]
