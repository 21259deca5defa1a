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

import re
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Final, Protocol, runtime_checkable

from llm.errors import ModelCallError
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
    tool_choice: str = "auto"
    """Which tool call the model must make (:data:`TOOL_CHOICE_MODES`): ``"auto"`` (it
    decides; the default), ``"required"`` (some call of an offered tool), ``"none"`` (no
    call: an answer in text), or an offered tool's exposed name (a call of that tool). As
    openai-agents' ``ModelSettings.tool_choice``; each adapter sends it in its API's form
    (:func:`tool_choice_resolve`)."""
    response_format: dict[str, Any] | None = None
    """The answer's required JSON format in the OpenAI chat completions shape (``{"type":
    "json_object"}`` or ``{"type": "json_schema", "json_schema": {"name", "schema", "strict"}}``),
    sent as ``response_format`` by adapters whose entry has native JSON-schema mode
    (:attr:`~llm.config.RouteEntryConfig.json_schema_mode`) and only on calls where it cannot
    stop a tool call (native tool calls, or no tools offered); other entries ignore it (the
    caller prompts for the format and checks the answer). None: free text."""

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
        if not isinstance(self.tool_choice, str) or not (
            self.tool_choice in TOOL_CHOICE_MODES or _TOOL_NAME_RE.match(self.tool_choice)
        ):
            raise ValueError(
                f"tool_choice must be one of {sorted(TOOL_CHOICE_MODES)} or a tool name, got {self.tool_choice!r}"
            )

    def applied_to(self, entry: RouteEntryConfig) -> RouteEntryConfig:
        """``entry`` with this call's overrides (``temperature``); ``entry`` itself when none."""
        if self.temperature is None:
            return entry
        return replace(entry, temperature=self.temperature)


TOOL_CHOICE_MODES: Final[frozenset[str]] = frozenset({"auto", "required", "none"})
"""The tool choices that are not a tool's name."""
_TOOL_NAME_RE: Final[re.Pattern[str]] = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


def tool_choice_resolve(choice: str, tools: Sequence[ToolSpec]) -> str | ToolSpec:
    """What ``choice`` asks of a call offering ``tools``, for an adapter to send.

    Args:
        choice: A :attr:`ModelSettings.tool_choice`.
        tools: The tools the call offers.

    Returns:
        ``"auto"`` (send nothing: also for ``"none"`` when no tool is offered), ``"none"``,
        ``"required"``, or the :class:`~llm.types.ToolSpec` a named choice names.

    Raises:
        ModelCallError: ``bad_request`` when ``"required"`` or a name is asked of a call that
            offers no tools, or the name is not among ``tools`` (the caller's mistake: no
            entry of the route could do better, so the router does not fall back).
    """
    if choice == "auto" or (choice == "none" and not tools):
        return "auto"
    if choice == "none":
        return "none"
    if not tools:
        raise ModelCallError("bad_request", f"tool_choice {choice!r} asks for a tool call, but no tool is offered")
    if choice == "required":
        return "required"
    for tool in tools:
        if tool.name == choice:
            return tool
    raise ModelCallError("bad_request", f"tool_choice names {choice!r}, which is not among the offered tools "
                                        f"{sorted(t.name for t in tools)}")


def tool_call_schema(tool: ToolSpec, *, required_only: bool = False) -> dict[str, Any]:
    """The JSON Schema of one call of ``tool`` written as text: ``{"name": <tool.name>,
    "arguments": <tool.parameters>}`` (both required, nothing else), the shape
    :mod:`llm.toolcall_parsing` reads as a call. For constrained decoding
    (``response_format``) on routes whose server does not parse tool calls.

    Args:
        tool: The tool.
        required_only: Keep only the parameters' ``required`` properties (and no others):
            the call then takes the tool's defaults for the rest.
    """
    parameters = dict(tool.parameters) if tool.parameters else {"type": "object", "properties": {}}
    parameters.setdefault("type", "object")
    if required_only and isinstance(parameters.get("properties"), dict):
        required = [k for k in parameters.get("required") or () if k in parameters["properties"]]
        parameters["properties"] = {k: parameters["properties"][k] for k in required}
        parameters["additionalProperties"] = False
    return {
        "type": "object",
        "properties": {"name": {"type": "string", "const": tool.name}, "arguments": parameters},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }


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

    The provider adapters (:mod:`llm.providers`) also take ``capture=`` (an
    :class:`~llm.records.BodyCapture` they fill with the request and response bodies); the
    router passes it only when it records bodies, so a model without the keyword works
    everywhere else.
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


__all__ = [
    "DEFAULT_SETTINGS", "TOOL_CHOICE_MODES", "FirstTokenHook", "Model", "ModelSettings", "tool_call_schema",
    "tool_choice_resolve",
]
