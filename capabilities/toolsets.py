"""Toolsets: the one abstraction for the tools of a run and the path a call to one of them takes.

An :class:`AbstractToolset` offers tools (:meth:`~AbstractToolset.tool_sources`) and runs a
call (:meth:`~AbstractToolset.call_tool`, a :class:`ToolInvocation` in, a :class:`ToolOutcome`
out). A :class:`WrapperToolset` delegates both to the toolset it wraps and may intercept a call
before it goes on (decide it instead, as the approval policy does), around it (the timeout) or
after it (the output's cleaning and framing): this is pydantic-ai's ``WrapperToolset`` /
``ApprovalRequiredToolset`` pattern. The toolsets:

- :class:`KindToolset`: what a capability kind (:mod:`capabilities.registry`) opens for one
  binding: its tools under their *own* names (the name inside their source: an MCP server's
  tool name, a built-in tool's name, ...); :meth:`KindToolset.for_binding` gives its tools the
  binding's id and approval rules;
- :class:`NamedToolset`: the union of a run's toolsets, each tool under the name the model
  sees (:func:`capabilities.naming.assign_exposed_names`: ``<alias>__<tool>`` for qualified
  sources such as MCP servers, bare names otherwise, names over 64 characters shortened with a
  hash; independent of the order servers list their tools). A call names its tool by that
  name: an unknown name or arguments that are not a JSON object fail here; else the tool runs
  (:func:`tool_run`);
- :class:`ApprovalPolicyToolset`: wrapper; the rules of the tool's binding decide a call
  (:func:`approval_action`: ``allow`` goes on, ``ask`` raises
  :class:`~capabilities.tools.ApprovalRequired`, ``deny`` fails it without running it);
- :class:`TimeoutToolset`: wrapper; the call's tool runs at most ``timeout_seconds``.

The run's toolset (:class:`sessions.runner.toolset.Toolset`) is a :class:`NamedToolset` under
the runner's registered wrappers (:data:`sessions.runner.interceptors.INTERCEPTORS`). No Django
and no ``sessions`` imports here.
"""

from __future__ import annotations

import abc
import asyncio
import dataclasses
import fnmatch
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from capabilities.naming import assign_exposed_names
from capabilities.tools import (
    ApprovalRequired,
    ConnectionForUser,
    InputForUser,
    QuestionForUser,
    Tool,
    ToolContext,
    ToolError,
)

logger = logging.getLogger(__name__)

APPROVAL_ACTIONS = ("allow", "ask", "deny")
"""The actions of an approval rule (``agents.models.ApprovalAction`` has the same values)."""

SUCCEEDED, FAILED, TIMED_OUT = "succeeded", "failed", "timed_out"
"""A :class:`ToolOutcome`'s statuses (the values of ``sessions.models.ToolCallStatus``)."""


def approval_rule(policy: Sequence[Mapping[str, Any]], *names: str) -> Mapping[str, Any] | None:
    """The first rule whose pattern matches any of ``names``; None if none matches.

    Args:
        policy: ``[{"pattern": str, "action": "allow" | "ask" | "deny", ...}, ...]`` in order;
            an ``ask`` rule may also carry ``approvers``, ``message``, ``timeout_seconds`` and
            ``on_timeout`` (``agents.models.approval_policy_errors`` checks the shape).
        names: The names a call is known by (its own name, its exposed name).

    Patterns are :func:`fnmatch.fnmatchcase` patterns (``*``, ``?``, ``[...]``).
    """
    for rule in policy:
        if any(fnmatch.fnmatchcase(name, rule["pattern"]) for name in names):
            return rule
    return None


def approval_action(policy: Sequence[Mapping[str, Any]], *names: str) -> str:
    """The action of the first rule whose pattern matches any of ``names``; ``"allow"`` if none
    (:func:`approval_rule`)."""
    rule = approval_rule(policy, *names)
    return str(rule["action"]) if rule is not None else "allow"


@dataclass(frozen=True, slots=True)
class ToolOrigin:
    """Where an exposed tool comes from: what approval policies and the UI need."""

    source: str
    """The capability's alias (an MCP server alias, ``builtin``, ``cli``, ...)."""
    name: str
    """The tool's name inside its source."""
    binding_id: int | None = None
    """The CapabilityBinding it was bound by (None: offered by the platform)."""
    approval_policy: tuple[Mapping[str, Any], ...] = ()
    """The binding's ``[{pattern, action, ...}]`` rules (set by :meth:`KindToolset.for_binding`)."""


@dataclass(frozen=True, slots=True)
class ToolSource:
    """One tool a toolset offers, before it is named for the model."""

    origin: ToolOrigin
    factory: Callable[[str], Tool]
    """``factory(exposed_name)`` → the Tool, its spec carrying the exposed name."""


class CallWaiting(Exception):
    """Raised from inside a call that now waits for a human without a request of its own (a
    skill's sub-run that paused: ``sessions.runner.tool_execution.SubRunWaiting``). Wrappers
    let it through; the caller leaves the call without a result."""


@dataclass(slots=True)
class ToolOutcome:
    """What a call came to: a result, or a failure the model reads."""

    status: str = SUCCEEDED
    """:data:`SUCCEEDED`, :data:`FAILED` or :data:`TIMED_OUT`."""
    content: str = ""
    """The result's text (succeeded)."""
    data: Any = None
    """The result's structured data (JSON-serialisable), if any."""
    error: str = ""
    """Why it failed, written for the model (failed, timed out)."""
    code: str = ""
    """The :class:`~capabilities.tools.ToolError` code of a failure ('' otherwise)."""
    model_content: str | None = None
    """What the model reads instead of ``content`` / ``"Error: " + error`` (None: those)."""

    @classmethod
    def failure(cls, error: str, *, code: str = "", status: str = FAILED) -> ToolOutcome:
        """A failed (or ``status``) outcome with ``error``."""
        return cls(status=status, error=error, code=code)


@dataclass(slots=True)
class ToolInvocation:
    """One call on its way through a toolset's wrappers (they may change it on the way in)."""

    name: str
    """The tool's exposed name, as the model called it."""
    arguments: dict[str, Any] | None
    """The parsed arguments; None when they were not a JSON object (``arguments_error`` says why)."""
    context: ToolContext
    """What the tool is given (ids, publisher, session store, ``approved``)."""
    arguments_error: ToolError | None = None
    """Why ``arguments`` is None (a ToolError ``invalid_arguments``)."""
    tool: Tool | None = None
    """The tool called (None: no tool has that name); set by the toolset that names it."""
    origin: ToolOrigin | None = None
    """Where the tool comes from (its binding, its own name, its approval rules)."""
    timeout_seconds: float | None = None
    """The longest the tool may run (:class:`TimeoutToolset`); None: no limit."""
    on_start: Callable[[], Awaitable[None]] | None = None
    """Awaited once the call is let through to run (the runner records it as started)."""
    offer_tool: Callable[[str], None] | None = None
    """``offer_tool(name)``: offer the built-in tool ``name`` for the rest of the run (set by the
    run's toolset; e.g. ``read_artifact`` once a result is stored as an artifact)."""


class AbstractToolset(abc.ABC):
    """A set of tools and the path a call to one of them takes."""

    qualified: bool = False
    """Its tools are always exposed as ``<source>__<name>`` (MCP servers: names stay stable when
    another server is bound or a server adds a tool)."""

    @abc.abstractmethod
    def tool_sources(self) -> list[ToolSource]:
        """The tools it offers, under their own names."""

    @abc.abstractmethod
    async def call_tool(self, call: ToolInvocation) -> ToolOutcome:
        """Run ``call``.

        Returns:
            Its outcome: a tool's failure (ToolError, a bug, a timeout) is a failed outcome,
            not an exception.

        Raises:
            ApprovalRequired, QuestionForUser: the call waits for a human (before it ran, or
                the tool asked); CallWaiting: it waits without a request of its own.
        """


class WrapperToolset(AbstractToolset):
    """A toolset that delegates to ``wrapped``: subclasses override :meth:`call_tool` to act
    before the call goes on, instead of it, or on its outcome."""

    def __init__(self, wrapped: AbstractToolset) -> None:
        self.wrapped = wrapped

    @property
    def qualified(self) -> bool:  # type: ignore[override]
        return self.wrapped.qualified

    def tool_sources(self) -> list[ToolSource]:
        """The wrapped toolset's tools."""
        return self.wrapped.tool_sources()

    async def call_tool(self, call: ToolInvocation) -> ToolOutcome:
        """The wrapped toolset runs ``call``."""
        return await self.wrapped.call_tool(call)


async def tool_run(call: ToolInvocation) -> ToolOutcome:
    """Execute ``call.tool`` with its arguments and context (the innermost step of every call).

    A ToolError becomes a failed outcome with its message and code, any other exception of the
    tool (a bug) a failed outcome naming it; a tool asking for approval (or a question) again
    after a human approved this very call fails it. TimeoutError, ApprovalRequired,
    QuestionForUser, InputForUser (a server's elicitation: asked each round, so not a tool
    bug after an answer), ConnectionForUser (an account to connect) and CallWaiting propagate
    (the wrappers and the caller handle them).
    """
    if call.tool is None:
        raise ValueError(f"no tool for the call {call.name!r}")  # the toolset that named it checks first
    try:
        result = await call.tool.execute(call.arguments or {}, call.context)
    except (CallWaiting, TimeoutError, InputForUser, ConnectionForUser):
        raise
    except (ApprovalRequired, QuestionForUser):
        if call.context.approved:  # approved once already: a tool asking again is a tool bug, not a new question
            return ToolOutcome.failure(f"The tool {call.name!r} asked for approval again.")
        raise
    except ToolError as exc:
        return ToolOutcome.failure(exc.message, code=exc.code)
    except Exception as exc:  # a tool's own bug must fail the call, not the run
        logger.exception("tool %r raised", call.name)
        return ToolOutcome.failure(f"The tool {call.name!r} failed: {type(exc).__name__}: {exc}")
    return ToolOutcome(content=result.content, data=result.data)


@dataclass(slots=True)
class KindToolset(AbstractToolset):
    """The tools one binding contributes to a run, under their own names (a leaf: a call runs
    its tool, :func:`tool_run`)."""

    sources: list[ToolSource] = field(default_factory=list)
    qualified: bool = False  # type: ignore[misc]

    def tool_sources(self) -> list[ToolSource]:
        """The tools (own names)."""
        return list(self.sources)

    def for_binding(self, binding_id: int | None, policy: Sequence[Mapping[str, Any]]) -> KindToolset:
        """These tools as bound by binding ``binding_id``: their origins carry its id and its
        approval rules ``policy`` (``[{pattern, action}]``, which :class:`ApprovalPolicyToolset`
        applies to each call)."""
        rules = tuple(policy)
        return KindToolset(qualified=self.qualified, sources=[
            ToolSource(origin=dataclasses.replace(s.origin, binding_id=binding_id, approval_policy=rules),
                       factory=s.factory)
            for s in self.sources
        ])

    async def call_tool(self, call: ToolInvocation) -> ToolOutcome:
        return await tool_run(call)


class NamedToolset(AbstractToolset):
    """A run's tools in one flat namespace of exposed names.

    :meth:`add_named` names the tools of several toolsets at once
    (:func:`capabilities.naming.assign_exposed_names`, so a collision between two kinds' tools
    is resolved the same wherever they come from) and adds them; :attr:`tools`,
    :attr:`origins` and :attr:`hidden` may also be filled directly (a sub-run's subset, tests).
    """

    def __init__(self, toolsets: Sequence[AbstractToolset] = ()) -> None:
        self.toolsets = list(toolsets)
        """The toolsets :meth:`named` names (:class:`KindToolset` or wrappers of one)."""
        self.tools: dict[str, Tool] = {}
        """``{exposed name: Tool}``."""
        self.origins: dict[str, ToolOrigin] = {}
        """``{exposed name: ToolOrigin}``."""
        self.hidden: set[str] = set()
        """Exposed names callable but not offered (skill tools past the depth limit: a call gets
        a clear error instead of "unknown tool")."""

    def named(self) -> list[tuple[str, ToolSource]]:
        """``[(exposed name, ToolSource)]`` of :attr:`toolsets`, in their order."""
        sources: list[ToolSource] = []
        qualified: set[str] = set()
        for toolset in self.toolsets:
            found = toolset.tool_sources()
            sources += found
            if toolset.qualified:
                qualified.update(s.origin.source for s in found)
        names = assign_exposed_names([(s.origin.source, s.origin.name) for s in sources], qualified_sources=qualified)
        return [(names[(s.origin.source, s.origin.name)], s) for s in sources]

    def add_named(self, toolsets: Iterable[AbstractToolset]) -> None:
        """Name the tools of ``toolsets`` and add each one (``factory(exposed name)``). Once per
        table (a run's kinds all at once, :func:`sessions.runner.toolset.toolset_open`): names are
        assigned over every toolset given so far, and a tool added before keeps its name."""
        self.toolsets += list(toolsets)
        for exposed, source in self.named():
            if exposed not in self.tools:
                self.tools[exposed] = source.factory(exposed)
                self.origins[exposed] = source.origin

    def tool_sources(self) -> list[ToolSource]:
        """The named tools, as sources whose factory gives the tool itself."""
        return [ToolSource(origin=self.origins.get(name, ToolOrigin(source="", name=name)),
                           factory=lambda _exposed, tool=tool: tool)
                for name, tool in self.tools.items()]

    async def call_tool(self, call: ToolInvocation) -> ToolOutcome:
        """Run the tool named ``call.name``: an unknown name fails with ``unknown_tool`` (the
        message lists the tools), arguments that are not a JSON object with ``invalid_arguments``."""
        if call.tool is None:
            call.tool, call.origin = self.tools.get(call.name), self.origins.get(call.name)
        if call.tool is None:
            return ToolOutcome.failure(
                f"Unknown tool {call.name!r}. Available tools: {', '.join(sorted(self.tools)) or 'none'}.",
                code="unknown_tool",
            )
        if call.arguments_error is not None:
            return ToolOutcome.failure(call.arguments_error.message, code=call.arguments_error.code)
        return await tool_run(call)


class ApprovalPolicyToolset(WrapperToolset):
    """Wrapper: the approval rules of the called tool's binding (``origin.approval_policy``)
    decide a call before it goes on (:func:`approval_action` with the tool's own and exposed
    names; first match wins; no rule: allow).

    ``ask`` raises :class:`~capabilities.tools.ApprovalRequired` (the call waits for a human;
    once approved, it comes back with ``context.approved`` and goes on); ``deny`` fails it
    without running it. Calls to unknown tools or with invalid arguments go on (they fail
    below, and no human should be asked about them).
    """

    async def call_tool(self, call: ToolInvocation) -> ToolOutcome:
        rule = self.rule(call)
        action = rule["action"] if rule is not None else "allow"
        if action == "ask":
            name = call.origin.name if call.origin else call.name
            raise ApprovalRequired(str(rule.get("message") or "") or f"The agent's policy asks before {name} runs.",
                                   rule=rule)
        if action == "deny":
            return ToolOutcome.failure(f"The agent's policy does not allow the tool {call.name!r}. Do not call it again.")
        return await self.wrapped.call_tool(call)

    @staticmethod
    def rule(call: ToolInvocation) -> Mapping[str, Any] | None:
        """The rule of the call's tool that decides it (:func:`approval_rule`); None (allow) for
        a call a human approved, an unknown tool, invalid arguments, or no matching rule."""
        origin = call.origin
        if call.context.approved or call.tool is None or origin is None or call.arguments is None:
            return None
        return approval_rule(origin.approval_policy, origin.name, call.name)

    @classmethod
    def action(cls, call: ToolInvocation) -> str:
        """``allow``, ``ask`` or ``deny``: what the rules of the call's tool say (:meth:`rule`)."""
        rule = cls.rule(call)
        return str(rule["action"]) if rule is not None else "allow"


class TimeoutToolset(WrapperToolset):
    """Wrapper: the call runs at most ``call.timeout_seconds`` (not for a tool that
    ``manages_own_timeout``: a skill's sub-run is bounded by its own loop limit, turn timeouts
    and the run's deadline); a timeout, or a TimeoutError of the tool, is a ``timed_out``
    outcome."""

    async def call_tool(self, call: ToolInvocation) -> ToolOutcome:
        timeout = None if getattr(call.tool, "manages_own_timeout", False) else call.timeout_seconds
        try:
            return await asyncio.wait_for(self.wrapped.call_tool(call), timeout=timeout)
        except TimeoutError:
            after = f" after {call.timeout_seconds:g} s" if call.timeout_seconds is not None else ""
            return ToolOutcome.failure(f"The tool {call.name!r} timed out{after}.", status=TIMED_OUT)


def sources_toolset(sources: Iterable[ToolSource], *, qualified: bool = False) -> KindToolset:
    """A :class:`KindToolset` of ``sources``."""
    return KindToolset(sources=list(sources), qualified=qualified)
