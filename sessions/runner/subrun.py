"""Skills as tools: a call runs a *sub-run*, awaited inside the parent's tool call.

A sub-run is a :class:`sessions.models.Run` with ``parent_tool_call`` (the skill tool's call)
and ``depth`` (parent's + 1). It runs the same loop as a user's run (:mod:`sessions.runner.loop`)
with its own context:

- system prompt: the skill's instructions only (not the agent's prompt: a skill is a
  self-contained procedure, and its context stays small); user message: the task;
- tools: the tools of the *calling run* whose exposed name (or name inside its capability)
  matches one of the skill's ``allowed_tools`` patterns (fnmatch); empty = none. Skill tools
  in that subset run their own sub-runs one level deeper; at :data:`SKILL_MAX_DEPTH` they
  are no longer offered, and a call still made fails with a clear error;
- the skill's loop limit and route (else the calling run's route entries); the parent's
  tool timeout, parallelism and run deadline; per-run budgets count the sub-run's usage plus
  its ancestors' (``run_usage`` of the runner's reads).

Its LLMCall / ToolCall / Message rows are its own (its messages never enter the session's
history), its events go on the session stream with its own ``run_id`` and
``parent_run_id`` in their data. Its final reply is the tool result; a failed sub-run is a
failed tool call with the reason. When it ends, its tokens and cost are added to the
parent run.

Cancellation: the sub-run runs inside the parent's tool-call task, so cancelling the parent
cancels it (recorded ``cancelled``); cancelling the sub-run alone (the API, its own id) ends
only it, and the parent's model hears that the skill was cancelled.

Durability: if the worker dies during a sub-run, the parent resumes on another worker and
re-executes the skill call (it has no result); :func:`sessions.runs.subrun_open` finds
the sub-run by ``parent_tool_call`` and it resumes from its own persisted messages, like any
run. A sub-run that already ended returns its recorded outcome without running again.

Approvals: a tool call inside a sub-run that needs a human (policy ``ask``, a tool raising
ApprovalRequired, ``ask_user``) pauses the whole tree, and no worker holds any of it. The
Approval belongs to the user's run (``sub_run`` names this one); the sub-run's loop returns
``awaiting_approval``, :func:`sessions.runs.subrun_pause` records the sub-run and the
skill call as waiting, and the call raises
:class:`sessions.runner.tool_execution.SubRunWaiting`, so its run waits too, up to the user's
run, which pauses like any run. Once decided, the user's run resumes on any worker,
executes the skill call again, and the same sub-run resumes with the decision.
"""

from __future__ import annotations

import asyncio
import fnmatch
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from capabilities.subagents.kind import AgentBindingSpec
from capabilities.tools import Tool, ToolContext, ToolError, ToolResult
from llm.types import ToolSpec
from sessions.models import RunFailureReason, RunStatus
from sessions.runner.cancellation import raise_if_cancelling
from sessions.runner.interceptors import ClientTool
from sessions.runner.ports import Publish, Publisher, RunPorts, RunStore, run_ports_current
from sessions.runner.spec import RunSpec, SkillBindingSpec
from sessions.runner.tool_execution import SubRunWaiting
from sessions.runner.toolset import CapabilityUnavailable, Toolset
from sessions.runner.turn import Cancelled, Failed, RunEnd

logger = logging.getLogger(__name__)

SKILL_MAX_DEPTH = 3
"""Deepest sub-run: a user's run is depth 0, a skill it calls depth 1, …, 3 at most. Bounds
the cost of skills calling skills (each level multiplies model turns)."""

TASK_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "task": {
            "type": "string",
            "description": "What the skill should do, with every detail it needs: it sees nothing of this conversation.",
        },
    },
    "required": ["task"],
    "additionalProperties": False,
}


class SkillTool(Tool):
    """A bound skill as a tool: ``{task: string}`` → a sub-run → its final reply.

    Raises (as failed tool calls): ToolError ``invalid_arguments`` (no task), ``depth_limit``
    (the calling run is at :data:`SKILL_MAX_DEPTH`), ``sub_run_failed`` (the sub-run failed or
    was cancelled; the message carries its reason). SubRunWaiting when the sub-run paused for
    a human (the call then waits without a result).
    """

    manages_own_timeout = True
    """The agent's per-tool timeout does not apply: a sub-run is bounded by its loop limit,
    turn timeouts and the run's deadline (:class:`capabilities.toolsets.TimeoutToolset` reads this)."""

    def __init__(self, *, skill: SkillBindingSpec, exposed_name: str, parent: RunSpec, parent_toolset: Toolset) -> None:
        self.skill = skill
        self.parent = parent
        self.parent_toolset = parent_toolset
        self.spec = ToolSpec(name=exposed_name, description=skill.description, parameters=TASK_PARAMETERS)

    @property
    def untrusted(self) -> bool:  # type: ignore[override]
        """True when the sub-run may read outside content (one of its tools is untrusted): its
        answer may carry text from there, so the parent frames it as data too."""
        allowed = self.skill.allowed_tools
        return any(
            not isinstance(tool, SkillTool) and tool.untrusted and _matches(name, self.parent_toolset, allowed)
            for name, tool in self.parent_toolset.tools.items()
        )

    @classmethod
    def for_run(cls, skill: SkillBindingSpec, exposed_name: str, parent: RunSpec, parent_toolset: Toolset) -> SkillTool:
        """The skill ``skill`` offered as ``exposed_name`` in the run ``parent`` (the toolset's
        factory of skill tools: :func:`sessions.runner.toolset.toolset_open`)."""
        return cls(skill=skill, exposed_name=exposed_name, parent=parent, parent_toolset=parent_toolset)

    def bound_to(self, parent: RunSpec, parent_toolset: Toolset) -> SkillTool:
        """This skill as offered inside the run ``parent`` (a sub-run) with its tools."""
        return SkillTool(skill=self.skill, exposed_name=self.spec.name, parent=parent, parent_toolset=parent_toolset)

    async def execute(self, arguments: dict[str, Any], context: ToolContext) -> ToolResult:
        task = arguments.get("task")
        if not isinstance(task, str) or not task.strip():
            raise ToolError("`task` is required: a string saying what the skill should do.", code="invalid_arguments")
        if self.parent.depth >= SKILL_MAX_DEPTH:
            raise ToolError(
                f"The skill {self.spec.name!r} cannot run here: skills may call skills at most {SKILL_MAX_DEPTH} "
                "levels deep. Do this part yourself with the tools you have.",
                code="depth_limit",
            )
        ports = run_ports_current() or _production_ports()  # the parent run's ports
        publishers: dict[int, tuple[Publish, Publisher]] = {}

        def publishers_of(run_id: int) -> tuple[Publish, Publisher]:
            if run_id not in publishers:
                publishers[run_id] = subrun_publishers(ports.publisher(self.parent.session_id, run_id),
                                                       parent=self.parent, context=context, skill_name=self.skill.name)
            return publishers[run_id]

        state = await ports.store.subrun_open(  # publishes the sub-run's run_running
            parent=self.parent, call_pk=context.tool_call_id, skill_id=self.skill.skill_id, skill_name=self.skill.name,
            task=task.strip(), publisher=lambda run_id: publishers_of(run_id)[1],
        )
        if state.status == RunStatus.COMPLETED:  # ended before a worker died: its result stands
            return ToolResult(content=state.reply, data={"sub_run_id": state.run_id})
        if state.status in (RunStatus.FAILED, RunStatus.CANCELLED):
            raise ToolError(f"The skill {self.spec.name!r} did not finish: {state.error}", code="sub_run_failed")
        outcome = await self._run(state.run_id, context=context, ports=ports, publishers=publishers_of(state.run_id))
        if outcome.status == RunStatus.COMPLETED:
            return ToolResult(content=outcome.reply, data={"sub_run_id": state.run_id})
        raise ToolError(f"The skill {self.spec.name!r} did not finish: {outcome.error}", code="sub_run_failed")

    async def _run(self, run_id: int, *, context: ToolContext, ports: RunPorts,
                   publishers: tuple[Publish, Publisher]) -> RunEnd:
        store = ports.store
        publish_now, publish = publishers
        try:
            spec = await store.subrun_spec(subrun_id=run_id, parent=self.parent)
        except ValueError as exc:
            outcome = Failed(RunFailureReason.CONFIGURATION, str(exc))
            await store.subrun_finish(run_id, outcome, publish=publish_now)
            return outcome
        toolset = self._toolset_for(spec)
        try:
            outcome = await subrun_engine().run_loop(spec, publish, ports, toolset=toolset)
        except asyncio.CancelledError:  # the parent was cancelled (or timed out): so is this sub-run
            await asyncio.shield(self._record_cancelled(store, run_id, spec.attempt, publish_now))
            raise
        except CapabilityUnavailable as exc:
            outcome = Failed(RunFailureReason.CAPABILITY_UNAVAILABLE, str(exc))
        except Exception as exc:  # noqa: BLE001 - the sub-run fails, the parent goes on
            logger.exception("sub-run %s crashed", run_id)
            outcome = Failed(RunFailureReason.INTERNAL, f"Internal error: {type(exc).__name__}: {exc}")
        if outcome.status == RunStatus.AWAITING_APPROVAL:
            if not await store.subrun_pause(run_id=run_id, attempt=spec.attempt, call_pk=context.tool_call_id,
                                            publish=publish_now):
                raise asyncio.CancelledError()  # another worker resumed this sub-run meanwhile: it goes on there
            raise SubRunWaiting(f"sub-run {run_id} waits for a human")
        if not await store.subrun_finish(run_id, outcome, publish=publish, attempt=spec.attempt):
            raise asyncio.CancelledError()  # another worker resumed this sub-run meanwhile: it reports the outcome
        return outcome

    def _toolset_for(self, spec: RunSpec) -> Toolset | None:
        """The sub-run's tools: the allowed subset of the parent's (None: the loop opens the
        sub-run's own bindings, :class:`AgentTool`)."""
        return subrun_toolset(parent_toolset=self.parent_toolset, allowed=list(self.skill.allowed_tools), spec=spec)

    @staticmethod
    async def _record_cancelled(store: RunStore, run_id: int, attempt: int, publish_now: Publish) -> None:
        try:
            await store.subrun_finish(run_id, Cancelled(), publish=publish_now, attempt=attempt)
        except Exception:  # noqa: BLE001 - the end of the parent ends it anyway
            logger.warning("sub-run %s: could not record its cancellation", run_id, exc_info=True)


def _task_text(arguments: dict[str, Any]) -> str:
    """A sub-agent's user message: the ``task`` argument when the arguments are just that, else
    the arguments as JSON ("" when there is nothing)."""
    task = arguments.get("task")
    if set(arguments) == {"task"} and isinstance(task, str):
        return task.strip()
    return json.dumps(arguments, ensure_ascii=False, sort_keys=True) if arguments else ""


def sub_agent_max_depth() -> int:
    """``settings.SUB_AGENT_MAX_DEPTH``: the deepest sub-run a sub-agent call may start (default 3)."""
    from django.conf import settings

    return int(getattr(settings, "SUB_AGENT_MAX_DEPTH", 3))


class AgentTool(SkillTool):
    """A bound agent B (capability kind ``agent``) as a tool of the run ``parent`` (A's).

    A call runs B as a sub-run of A's run, as a skill's: B's system prompt, route, limits and
    bindings of the version the binding resolved (B's published one, else its draft), opened
    for the sub-run itself (B's own tools, not A's); A's budgets (tokens, cost, run deadline)
    bound it, since a sub-run's usage counts with its ancestors'. B's reply is the tool result,
    framed as data (B may have read outside content).

    A *handoff* binding (``handoff: true``) also makes B the chat's agent for the rest of the
    session when called from the user's run (depth 0): once the turn's tool calls are recorded,
    the switch is, with B's reply as the run's answer (:func:`sessions.runs.session_handoff`,
    event ``agent_handoff``), and A's run ends with it, without another turn of A's model
    (:func:`sessions.runner.turn.resolve`).
    Called inside a sub-run, a handoff binding is an ordinary sub-agent call.

    Raises (as failed tool calls): ToolError ``invalid_arguments`` (nothing to do),
    ``depth_limit`` (the calling run is at ``settings.SUB_AGENT_MAX_DEPTH``),
    ``sub_run_failed`` (B has no version, or its sub-run failed or was cancelled: the reason).
    SubRunWaiting when B's sub-run paused for a human (the whole tree waits).
    """

    untrusted = True  # type: ignore[assignment]

    def __init__(self, *, binding: AgentBindingSpec, exposed_name: str, parent: RunSpec, parent_toolset: Toolset) -> None:
        self.skill = binding  # type: ignore[assignment]  (the name the progress lines show)
        self.binding = binding
        self.parent = parent
        self.parent_toolset = parent_toolset
        self.spec = ToolSpec(name=exposed_name, description=binding.description, parameters=binding.parameters)

    def bound_to(self, parent: RunSpec, parent_toolset: Toolset) -> AgentTool:
        """This tool as offered inside the run ``parent`` (a skill's sub-run given it)."""
        return AgentTool(binding=self.binding, exposed_name=self.spec.name, parent=parent, parent_toolset=parent_toolset)

    def _toolset_for(self, spec: RunSpec) -> Toolset | None:
        return None  # B's own bindings, opened by the sub-run's loop

    async def execute(self, arguments: dict[str, Any], context: ToolContext) -> ToolResult:
        name = self.binding.agent_name
        task = _task_text(arguments)
        if not task:
            raise ToolError("Say what the agent should do: `task` is required.", code="invalid_arguments")
        max_depth = sub_agent_max_depth()
        if self.parent.depth >= max_depth:
            raise ToolError(
                f"The agent {name!r} cannot be called here: agents may call agents at most {max_depth} levels deep. "
                "Do this part yourself with the tools you have.", code="depth_limit")
        if self.binding.version_id is None:
            raise ToolError(f"The agent {name!r} has no saved version to run.", code="sub_run_failed")
        ports = run_ports_current() or _production_ports()
        publishers: dict[int, tuple[Publish, Publisher]] = {}

        def publishers_of(run_id: int) -> tuple[Publish, Publisher]:
            if run_id not in publishers:
                publishers[run_id] = subrun_publishers(ports.publisher(self.parent.session_id, run_id),
                                                       parent=self.parent, context=context, skill_name=name)
            return publishers[run_id]

        state = await ports.store.subrun_open(  # publishes the sub-run's run_running
            parent=self.parent, call_pk=context.tool_call_id, skill_id=None, skill_name=name, task=task,
            publisher=lambda run_id: publishers_of(run_id)[1], agent_version_id=self.binding.version_id,
        )
        if state.status == RunStatus.COMPLETED:  # ended before a worker died: its result stands
            return await self._answered(state.run_id, state.reply, ports)
        if state.status in (RunStatus.FAILED, RunStatus.CANCELLED):
            raise ToolError(f"The agent {name!r} did not finish: {state.error}", code="sub_run_failed")
        outcome = await self._run(state.run_id, context=context, ports=ports, publishers=publishers_of(state.run_id))
        if outcome.status == RunStatus.COMPLETED:
            return await self._answered(state.run_id, outcome.reply, ports)
        raise ToolError(f"The agent {name!r} did not finish: {outcome.error}", code="sub_run_failed")

    async def _answered(self, sub_run_id: int, reply: str, ports: RunPorts) -> ToolResult:
        """B's reply as the tool result; for a handoff from the user's run, the switch first."""
        data: dict[str, Any] = {"sub_run_id": sub_run_id, "agent_id": self.binding.agent_id}
        if self.binding.handoff and self.parent.depth == 0:
            self.parent_toolset.handoff = (self.binding.agent_id, reply)  # recorded by resolve, after the results
            data["handoff"] = True
        return ToolResult(content=reply, data=data)


def subrun_tool_for(binding: Any, exposed_name: str, parent: RunSpec, parent_toolset: Toolset) -> SkillTool:
    """The Tool a binding whose kind runs sub-runs is offered as in run ``parent``: an
    :class:`AgentTool` for kind ``agent``, else a :class:`SkillTool` (the toolset's factory:
    :func:`sessions.runner.toolset.toolset_open`)."""
    if binding.kind == "agent":
        return AgentTool(binding=binding, exposed_name=exposed_name, parent=parent, parent_toolset=parent_toolset)
    return SkillTool.for_run(binding, exposed_name, parent, parent_toolset)


@dataclass(frozen=True, slots=True)
class SubrunEngine:
    """What a sub-run needs from the layers that import this module: the loop that runs it
    and the production ports (for a skill executed outside any run's loop, a test calling the
    tool directly; inside a run, a sub-run always goes through its parent's ports). Given once
    by ``AgentSessionsConfig.ready`` (:func:`subrun_engine_register`), so that this module
    imports neither the loop nor the adapters, which reach it through the toolset."""

    run_loop: Callable[..., Awaitable[RunEnd]]
    """``run_loop(spec, publish, ports, toolset=...)`` → the sub-run's end
    (:func:`sessions.runner.loop.run_loop_cancellable`)."""
    production_ports: Callable[[], RunPorts]
    """:func:`sessions.runner.adapters.production_ports`."""


_engine: SubrunEngine | None = None


def subrun_engine_register(engine: SubrunEngine) -> None:
    """Give the sub-runs their loop and production ports (the app's ``ready``)."""
    global _engine
    _engine = engine


def subrun_engine() -> SubrunEngine:
    """The registered :class:`SubrunEngine`. Raises RuntimeError when none was registered
    (Django not set up: the sessions app's ``ready`` registers it)."""
    if _engine is None:
        raise RuntimeError("no sub-run engine registered: the sessions app's ready() registers it")
    return _engine


def _production_ports() -> RunPorts:
    return subrun_engine().production_ports()


class SubrunPublisher:
    """A sub-run's loop's :class:`~sessions.runner.ports.Publisher` over its parent's ports'
    one (``base``): every event carries ``extra`` (the parent's ids); a ``tool_call_started``
    is also reported as the parent call's progress, and after each publish a pending cancel of
    the current task is raised (redis-py may swallow one). :meth:`nowait` is ``base``'s."""

    __slots__ = ("_base", "_extra", "_context", "_skill_name", "streamed")

    def __init__(self, base: Publisher, *, extra: dict[str, Any], context: ToolContext, skill_name: str) -> None:
        self._base, self._extra, self._context, self._skill_name = base, extra, context, skill_name
        self.streamed: list[str] | None = None

    async def __call__(self, event_type: str, data: dict[str, Any]) -> None:
        await self._base(event_type, {**data, **self._extra})
        if event_type == "tool_call_started":  # the parent's call shows what its skill is doing
            await self._context.progress(f"{self._skill_name}: {data.get('name')}")
        raise_if_cancelling()

    def nowait(self, event_type: str, data: dict[str, Any]) -> Awaitable[Any]:
        return self._base.nowait(event_type, {**data, **self._extra})


def subrun_publishers(
    base: Publisher, *, parent: RunSpec, context: ToolContext, skill_name: str,
) -> tuple[Publish, Publisher]:
    """A sub-run's publishers over ``base`` (the parent's ports' publisher for the sub-run's own
    ``run_id``): every event carries ``parent_run_id`` and ``parent_tool_call_id``.

    Returns:
        ``(publish_now, publish)``: ``publish_now`` adds the parent's ids only (for the
        sub-run's end and pause, recorded also while the parent is being cancelled);
        ``publish`` (the sub-run's loop's) also reports each ``tool_call_started`` as the
        parent call's progress and raises a pending cancel of the current task (redis-py may
        swallow one): a :class:`SubrunPublisher`.
    """
    extra = {"parent_run_id": parent.run_id, "parent_tool_call_id": context.tool_call_id}

    async def publish_now(event_type: str, data: dict[str, Any]) -> None:
        await base(event_type, {**data, **extra})

    return publish_now, SubrunPublisher(base, extra=extra, context=context, skill_name=skill_name)


def subrun_toolset(*, parent_toolset: Toolset, allowed: list[str], spec: RunSpec) -> Toolset:
    """The tools a sub-run (``spec``) gets: those of ``parent_toolset`` matching ``allowed``.

    A tool matches when its exposed name or its name inside its capability matches one of
    the fnmatch patterns. Skill tools are re-bound to the sub-run (their calls go one level
    deeper) and, at :data:`SKILL_MAX_DEPTH`, kept callable but not offered. Other tools are
    shared with the parent (the parent is awaiting this call meanwhile).
    """
    toolset = Toolset()
    for exposed, tool in parent_toolset.tools.items():
        origin = parent_toolset.origins.get(exposed)
        if isinstance(tool, ClientTool) or not _matches(exposed, parent_toolset, allowed):
            continue  # the API client's tools are offered to the user's run only
        if isinstance(tool, SkillTool):
            tool = tool.bound_to(spec, toolset)
            if spec.depth >= SKILL_MAX_DEPTH:
                toolset.hidden.add(exposed)
        toolset.tools[exposed] = tool
        if origin is not None:
            toolset.origins[exposed] = origin
    return toolset


def _matches(exposed: str, toolset: Toolset, patterns: Any) -> bool:
    """Whether tool ``exposed`` of ``toolset`` matches a pattern by exposed name or its name in its source."""
    origin = toolset.origins.get(exposed)
    names = (exposed, origin.name) if origin is not None else (exposed,)
    return any(fnmatch.fnmatchcase(n, p) for n in names for p in patterns)
