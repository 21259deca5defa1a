"""One turn of the ReAct loop, as three steps over a per-run state.

A turn is :func:`prepare` (history, the resumed tail, steering, the loop limit, the compaction
decision, the budget) → :func:`model_turn` (the router call, the stream-interruption retry,
the assistant message persisted) → :func:`resolve` (tool calls, the approvals pause). Each
step returns a typed outcome:

- ``None``: go on to the turn's next step;
- :class:`Continue`: start the turn over (a new ``prepare``, which reloads the history);
- :class:`Completed`, :class:`Failed`, :class:`Paused`: the loop ends with it.

:func:`run_turns` is the dispatch (:func:`sessions.runner.loop._run_loop` calls it). Every
mutable thing the loop used to keep in locals is a field of :class:`RunState`.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from capabilities.registry import ContextBlock
from capabilities.tools import SessionStore
from llm.errors import AllEntriesFailed, ContextWindowExceeded, ModelCallError, StreamInterrupted, public_error_message
from llm.metering import LLMCallPurpose
from llm.tokens import estimate_tokens
from llm.types import ChatMessage, ToolSpec
from sessions.models import RunFailureReason, RunStatus
from sessions.runner.cancellation import CANCEL_ERROR
from sessions.runner.compaction import (
    BUDGET_RATIO,
    MAX_ATTEMPTS_PER_TURN,
    CompactionResult,
    compact,
    summary_prompt_tokens,
    system_prompt_with_summary,
)
from sessions.runner.guarding import guard_handoff_reply, guard_input, guard_output, guard_tripped
from sessions.runner.images import history_with_images
from sessions.runner.ports import RunStore
from sessions.runner.routing import route_turn
from sessions.runner.run_context import context_nonce, context_system_text
from sessions.runner.spec import RunSpec
from sessions.runner.streaming import stream_model_turn
from sessions.runner.structured_output import (
    format_system_note,
    native_response_format,
    output_problem,
    parsed_answer,
    repair_note,
    repairs_spent,
    unfenced,
)
from sessions.runner.tool_execution import UNTRUSTED_SYSTEM_NOTE, execute_tool_calls
from sessions.runner.toolset import Toolset

DEFAULT_SYSTEM_PROMPT = "You are a helpful assistant."
FINAL_TURN_NOTE = (
    "You cannot call any more tools for this request. Answer the user now, in plain text, "
    "with what you have found so far."
)


# --- Outcomes -------------------------------------------------------------------------------
# The ends (Completed, Failed, Paused, Cancelled) carry ``status``, ``reply``, ``error`` and
# ``reason`` like :class:`sessions.runner.loop.Outcome`, so the run-end path reads any of them.


@dataclass(frozen=True, slots=True)
class Completed:
    """The run answered: ``reply`` is its final assistant text; ``structured``: its parsed JSON
    value under an output format; ``attributions``: the platform's
    attribution of its sentences to the run's passages (:func:`sessions.runner.run_context.run_attributions`,
    stored as ``Run.attributions``), None when not attempted."""

    reply: str
    attributions: list[dict[str, Any]] | None = None
    structured: Any = None
    """The answer's parsed JSON value when the run had an output format (None: free text)."""
    status: ClassVar[str] = RunStatus.COMPLETED
    error: ClassVar[str] = ""
    reason: ClassVar[str] = ""


@dataclass(frozen=True, slots=True)
class Failed:
    """The run failed: ``reason`` is a :class:`~sessions.models.RunFailureReason` value,
    ``error`` the text members read."""

    reason: str
    error: str
    status: ClassVar[str] = RunStatus.FAILED
    reply: ClassVar[str] = ""


@dataclass(frozen=True, slots=True)
class Paused:
    """Some tool call waits for a human's approval; no worker holds the run meanwhile."""

    status: ClassVar[str] = RunStatus.AWAITING_APPROVAL
    reply: ClassVar[str] = ""
    error: ClassVar[str] = ""
    reason: ClassVar[str] = ""


@dataclass(frozen=True, slots=True)
class Cancelled:
    """A cancel was requested; ``reply``: the text streamed in the interrupted turn ("" if none)."""

    reply: str = ""
    status: ClassVar[str] = RunStatus.CANCELLED
    error: ClassVar[str] = CANCEL_ERROR
    reason: ClassVar[str] = ""


@dataclass(frozen=True, slots=True)
class Continue:
    """Start the turn over from :func:`prepare` (never an end of the run)."""


CONTINUE = Continue()
RunEnd = Completed | Failed | Paused | Cancelled
StepOutcome = RunEnd | Continue | None
Step = Callable[["RunState"], Awaitable[StepOutcome]]


# --- State ----------------------------------------------------------------------------------


@dataclass(slots=True, eq=False)
class RunState:
    """What the loop of one run carries from step to step and turn to turn.

    ``model``: the run's model route (``stream(messages, tools, compact_first=)``, a
    :class:`sessions.runner.ports.Model`), ``record``: its LLM-call recorder (``turn``,
    ``holding_the_answer()``, ``take_answer()``, ``calls_for(purpose)``). The fields
    after ``interrupted_turns`` are set by :func:`prepare` for :func:`model_turn`, and by
    :func:`model_turn` for :func:`resolve`.
    """

    spec: RunSpec
    publish: Any
    toolset: Toolset
    model: Any
    record: Any
    store: RunStore
    """The run's reads and writes (:class:`sessions.runner.ports.RunStore`)."""
    turn: int
    """Model turns this run has answered (the next one's index)."""
    current_entry: int = 0
    """The route entry that answered last: its window decides when to compact."""
    compaction_attempts: int = 0
    """Compactions tried for the coming model turn (never more than MAX_ATTEMPTS_PER_TURN)."""
    compaction_exhausted: bool = False
    """For the coming model turn: nothing more to compact, or the attempts are used up."""
    force_compaction: bool = False
    """A model rejected the prompt as too long: compact even below the budget."""
    known_cursor: dict[str, Any] = field(default_factory=dict)
    """``{"compaction": cursor}`` once read (``history_load`` skips reading it), ``{}`` to read it."""
    interrupted_turns: set[int] = field(default_factory=set)
    """Turns whose stream broke off once (a second break fails the run)."""
    history: Any = None
    final_turn: bool = False
    messages: list[ChatMessage] = field(default_factory=list)
    offered: list[ToolSpec] = field(default_factory=list)
    prompt_tokens: int = 0
    message: ChatMessage | None = None
    calls: list[dict[str, Any]] = field(default_factory=list)
    tool_choice: str = "auto"
    """This turn's tool choice (:func:`turn_tool_choice`), set by :func:`prepare`."""
    context: tuple[ContextBlock, ...] = ()
    """The run's start context (:mod:`sessions.runner.run_context`): appended to the system message."""
    tool_store: SessionStore | None = None
    """The session data its tools may touch (the ports' ``tool_store``: each call's ``ToolContext.store``)."""
    output_repairs: int | None = None
    """Repair turns spent on answers that did not match the output format (:mod:`.structured_output`);
    None until counted from the stored messages (the first :func:`prepare` of a run's attempt)."""
    repair: str = ""
    """The note of the coming repair turn ("" when none), added after the history by :func:`prepare`."""
    model_for: Callable[[RunSpec], Any] | None = None
    """Makes the model of another route's spec (``ports.model``): routing rules (:mod:`.routing`)."""
    route_models: dict[str, Any] = field(default_factory=dict)
    """Route name ("": the agent's own) → its model, made once per run; and ``spec`` per route in :attr:`route_specs`."""
    route_specs: dict[str, RunSpec] = field(default_factory=dict)
    """Route name → the run's spec with that route's entries (:func:`sessions.runner.routing.route_turn`)."""
    route_rule: str | None = None
    """The routing rule that chose the current route ("": none matched, the agent's route; None: not chosen yet)."""

    @property
    def no_compaction(self) -> bool:
        """Sub-runs are never compacted (their history is short-lived and compactions move the
        session's cursor); one whose context overflows fails with reason context_window."""
        return self.spec.depth > 0

    @classmethod
    def start(cls, *, spec: RunSpec, publish: Any, toolset: Toolset, model: Any, record: Any, store: RunStore,
              context: tuple[ContextBlock, ...] = (), tool_store: SessionStore | None = None,
              model_for: Callable[[RunSpec], Any] | None = None) -> RunState:
        """The state at the start (or resumption) of run ``spec``: turn ``spec.loop_count``.
        ``model_for``: makes a route's model (needed only when the agent has routing rules)."""
        state = cls(spec=spec, publish=publish, toolset=toolset, model=model, record=record, store=store,
                    turn=spec.loop_count, context=context, tool_store=tool_store, model_for=model_for)
        state.compaction_exhausted = state.no_compaction
        return state


# --- Dispatch -------------------------------------------------------------------------------


async def run_turns(state: RunState, steps: Sequence[Step] | None = None) -> RunEnd:
    """Run ``steps`` (default: prepare, model_turn, resolve) turn after turn until one ends the run.

    A step returning ``None`` hands over to the next step; :class:`Continue` (or the last step
    returning ``None``) starts the next turn; any other outcome is returned.
    """
    steps = (prepare, model_turn, resolve) if steps is None else steps
    while True:
        for step in steps:
            outcome = await step(state)
            if outcome is not None:
                break
        if outcome is not None and not isinstance(outcome, Continue):
            return outcome


# --- prepare --------------------------------------------------------------------------------


async def prepare(state: RunState) -> StepOutcome:
    """Load the history and decide what this turn is.

    Returns :class:`Completed` / :class:`Paused` / :class:`Continue` for a resumed run (see
    :func:`_resume_tail`), :class:`Continue` when steered messages joined or a compaction ran,
    :class:`Failed` for the loop limit, a failed compaction or a budget (checked before a
    compaction's summary request too, so a run over budget never compacts), else ``None`` with
    ``state.messages``, ``offered``, ``prompt_tokens`` and ``final_turn`` set for the model.
    """
    spec = state.spec
    state.record.turn = state.turn
    history = await state.store.history(spec.run_id, session_id=spec.session_id, subrun=spec.depth > 0,
                                        **state.known_cursor)
    state.history = history
    state.known_cursor = {"compaction": history.compaction}  # until this run compacts
    _count_repairs_once(state)
    repairing = bool(state.repair) and history.tail is not None and not history.tail.tool_calls
    if history.tail is not None and not repairing:  # (the answer being repaired is no resumed tail)
        return await _resume_tail(state, history.tail)
    if await _absorb_steering(state.store, spec):
        return CONTINUE
    if state.turn >= spec.max_loop_count:
        return loop_limit_reached(spec)
    if spec.routing_rules:  # the turn's route (the state's spec and model follow it)
        await route_turn(state)
        spec = state.spec
    state.history = await history_with_images(  # images of the user's messages, for entries that take them
        history, store=state.store, tenant_id=spec.tenant_id, session_id=spec.session_id,
        supports_images=any(e.supports_images for e in spec.entries),
    )
    _build_prompt(state)
    if compaction_due(state):
        over_budget = await compaction_budget_exceeded(state)
        if over_budget:  # the summarizer is not called: it would spend what the run may not
            return Failed(RunFailureReason.BUDGET_EXCEEDED, over_budget)
        return await _compact(state)
    over_budget = await budget_exceeded(spec, state.store, prompt_tokens=state.prompt_tokens, entry_index=state.current_entry)
    if over_budget:
        return Failed(RunFailureReason.BUDGET_EXCEEDED, over_budget)
    return None


def _count_repairs_once(state: RunState) -> None:
    """Once per run attempt (the first :func:`prepare`): the repair turns a worker that died had
    already spent, counted from the stored answers (:func:`~.structured_output.repairs_spent`)."""
    if state.output_repairs is not None:
        return
    spec, history = state.spec, state.history
    tail_is_answer = history.tail is not None and not history.tail.tool_calls
    state.output_repairs = 0 if spec.output_format is None else repairs_spent(
        history.rows, run_id=spec.run_id, tail_is_answer=tail_is_answer)


async def _resume_tail(state: RunState, last: ChatMessage) -> StepOutcome:
    """A run resumed after its worker died, at its last assistant message ``last``: answered
    (:class:`Completed`), or its calls without a result run now (those with one never run
    again), then :class:`Paused` if one waits for approval, else :class:`Continue`."""
    if not last.tool_calls:  # answered before a worker died: nothing left to do (if it is in the format asked)
        return checked_answer(state, last.content)
    spec = state.spec
    pending = await state.store.pending_tool_calls(run_id=spec.run_id, call_ids=[c.id for c in last.tool_calls])
    if await execute_tool_calls(spec=spec, calls=pending, toolset=state.toolset, publish=state.publish,
                                store=state.store, resumed=True, tool_store=state.tool_store):
        return Paused()
    return await handed_off(state) or CONTINUE


async def handed_off(state: RunState) -> Completed | None:
    """After a turn's tool calls: when a handoff call finished (``Toolset.handoff``, set by
    ``sessions.runner.subrun.AgentTool``), the chat goes to that agent with its reply as this
    run's answer (``store.session_handoff``, event ``agent_handoff``) and the run completes with
    it, once this run's output guardrails passed it (:func:`guard_handoff_reply`); else None."""
    if state.toolset.handoff is None:
        return None
    agent_id, reply = state.toolset.handoff
    await guard_handoff_reply(reply)
    await state.store.session_handoff(spec=state.spec, agent_id=agent_id, reply=reply, publish=state.publish)
    return Completed(reply)


async def _absorb_steering(store: RunStore, spec: RunSpec) -> bool:
    """Messages sent meanwhile (agents in steer mode, top-level runs) join this run's history
    from this turn on; each absorbed run is told so. Whether any joined. One locked query
    per turn, so only for agents in steer mode."""
    if not spec.steer or spec.depth != 0:
        return False
    return bool(await store.steer_absorb(spec.run_id))  # each absorbed run: run_running


CALLER_INSTRUCTIONS_HEADING = "Instructions from the application calling you for this conversation:"
"""Heads the instructions an API caller added (``system`` / ``developer`` messages, a response's
``instructions``) in the system prompt, after the agent's own."""


def _build_prompt(state: RunState) -> None:
    """Set the turn's ``messages`` (system prompt with the compaction summary, the API caller's
    instructions, the untrusted note, the history, the final-turn note), ``offered`` tools and
    ``prompt_tokens`` estimate."""
    spec, toolset = state.spec, state.toolset
    state.final_turn = state.turn == spec.max_loop_count - 1
    system = system_prompt_with_summary(spec.system_prompt or DEFAULT_SYSTEM_PROMPT, state.history.summary)
    if spec.request_options.instructions:  # the API caller's, after the agent's own (never instead)
        system = f"{system}\n\n{CALLER_INSTRUCTIONS_HEADING}\n{spec.request_options.instructions}"
    tool_specs = toolset.specs
    if any(t.untrusted for t in toolset.tools.values()) or any(b.untrusted for b in state.context):
        system = f"{system}\n\n{UNTRUSTED_SYSTEM_NOTE}"
    if state.context:
        system = f"{system}\n\n{context_system_text(state.context, nonce=context_nonce(spec.run_id))}"
    output_format = spec.output_format
    if output_format is not None:
        system = f"{system}\n\n{format_system_note(output_format)}"
    messages = [ChatMessage(role="system", content=system), *state.history.messages]
    if state.repair:
        messages.append(ChatMessage(role="user", content=state.repair))
    if state.final_turn and tool_specs:
        messages.append(ChatMessage(role="user", content=FINAL_TURN_NOTE))
    state.messages = messages
    state.offered = [] if state.final_turn else tool_specs
    state.tool_choice = turn_tool_choice(state)
    state.prompt_tokens = estimate_tokens(messages, state.offered)


def turn_tool_choice(state: RunState) -> str:
    """The tool choice of the coming model turn (:attr:`llm.model.ModelSettings.tool_choice`).

    A top-level run's first model turn (``turn == 0``: none answered yet, also after a
    worker died before it did) must call the first offered tool marked ``call_first`` (a
    ``knowledge`` binding with ``search_first``), by its exposed name; every other turn is
    ``"auto"``, so the choice resets once that turn is answered and cannot loop, and a run
    resumed after it (its ``loop_count`` stored with the turn) never forces again.
    """
    if state.turn != 0 or state.spec.depth > 0 or not state.offered:
        return "auto"
    offered = {t.name for t in state.offered}
    for name, tool in state.toolset.tools.items():
        if tool.call_first and name in offered:
            return name
    return "auto"


def compaction_due(state: RunState) -> bool:
    """Whether to compact before this model turn: the prompt passes ``BUDGET_RATIO`` of the
    window of the entry that answered last (or a model rejected it as too long), and this
    turn still may compact."""
    if state.compaction_exhausted:
        return False
    budget = state.spec.entries[state.current_entry].max_input_tokens * BUDGET_RATIO
    return state.force_compaction or state.prompt_tokens > budget


COMPACTION_REQUEST = "compacting the conversation before the next model turn"
"""How a budget refusal names the compaction's summary request (see :func:`budget_exceeded`)."""


async def compaction_budget_exceeded(state: RunState) -> str:
    """Why the coming compaction attempt's summary request would exceed a budget, or "".

    The request is the one :func:`~sessions.runner.compaction.compact` would send for attempt
    ``state.compaction_attempts + 1`` (its prompt estimated by
    :func:`~sessions.runner.compaction.summary_prompt_tokens`), held by :func:`budget_exceeded`
    against the run's usage so far, priced like a turn's at the entry that answered last.
    "" as well when the attempt would have nothing to compact (it makes no model call).
    """
    prompt_tokens = summary_prompt_tokens(state.history, attempt=state.compaction_attempts + 1)
    if prompt_tokens is None:
        return ""
    return await budget_exceeded(state.spec, state.store, prompt_tokens=prompt_tokens,
                                 entry_index=state.current_entry, request=COMPACTION_REQUEST)


async def _compact(state: RunState) -> StepOutcome:
    """Run one compaction attempt; :func:`after_compaction` says what follows."""
    state.compaction_attempts += 1
    with state.record.calls_for(LLMCallPurpose.COMPACTION):  # its LLM calls: purpose compaction, not turn
        result = await compact(spec=state.spec, history=state.history, router=state.model, publish=state.publish,
                               store=state.store, attempt=state.compaction_attempts, tokens_before=state.prompt_tokens)
    return after_compaction(state, result)


def after_compaction(state: RunState, result: CompactionResult) -> Failed | Continue:
    """Record compaction ``result`` in ``state``: the cursor is read again, and the turn may
    not compact again when there was nothing to compact or the attempts are used up.

    Returns :class:`Failed` (``compaction_failed``) when the last allowed attempt failed, else
    :class:`Continue` (the turn starts over on the compacted history).
    """
    state.known_cursor = {}  # the cursor may have moved: read it again
    state.force_compaction = False
    used_up = state.compaction_attempts >= MAX_ATTEMPTS_PER_TURN
    if result.nothing_to_compact or used_up:
        state.compaction_exhausted = True
    if not result.ok and not result.nothing_to_compact and used_up:
        return Failed(
            RunFailureReason.COMPACTION_FAILED,
            f"The conversation could not be compacted ({state.compaction_attempts} attempts): {result.error}",
        )
    return CONTINUE


def loop_limit_reached(spec: RunSpec) -> Failed:
    """The run used its ``max_loop_count`` model turns without answering."""
    return Failed(
        RunFailureReason.MAX_LOOP_COUNT,
        f"The agent reached its limit of {spec.max_loop_count} model turns without answering.",
    )


async def budget_exceeded(spec: RunSpec, store: RunStore, *, prompt_tokens: int, entry_index: int,
                          request: str = "the next model turn") -> str:
    """Why the next model request would exceed a budget, or "" if it would not.

    "Would": what the run has used so far plus the request's prompt (``prompt_tokens``, the
    ``llm.tokens`` estimate, priced at the input price of route entry ``entry_index``: the
    one that answered last) against the agent's per-run limits and the tenant's monthly
    budget. ``request`` names the request in the reason (default: the next model turn; a
    compaction's summary request: :data:`COMPACTION_REQUEST`).
    """
    if spec.max_tokens_per_run is None and spec.max_cost_per_run_usd_micros is None and (
        spec.tenant_monthly_budget_usd_micros is None
    ):
        return ""
    next_prompt_tokens = prompt_tokens
    next_cost = round(next_prompt_tokens * spec.entries[entry_index].input_price_per_mtok)
    used = await store.usage(spec.run_id)
    if spec.max_tokens_per_run is not None and used.tokens + next_prompt_tokens > spec.max_tokens_per_run:
        return (f"The run has used {used.tokens} tokens; {request} (~{next_prompt_tokens} prompt tokens) "
                f"would exceed the agent's budget of {spec.max_tokens_per_run} tokens per run.")
    if spec.max_cost_per_run_usd_micros is not None and used.cost_usd_micros + next_cost > spec.max_cost_per_run_usd_micros:
        return (f"The run has cost ${used.cost_usd_micros / 1e6:.6f}; {request} would exceed the agent's "
                f"budget of ${spec.max_cost_per_run_usd_micros / 1e6:.6f} per run.")
    if spec.tenant_monthly_budget_usd_micros is not None:
        month = await store.tenant_month_cost_usd_micros(spec.tenant_id)
        if month + next_cost > spec.tenant_monthly_budget_usd_micros:
            return (f"The tenant has used ${month / 1e6:.2f} of its ${spec.tenant_monthly_budget_usd_micros / 1e6:.2f} "
                    f"monthly model budget; {request} would exceed it.")
    return ""


# --- model turn -----------------------------------------------------------------------------


async def model_turn(state: RunState) -> StepOutcome:
    """Ask the model (through the router, within the agent's turn timeout) and persist its
    answer as the turn's assistant message (on the final turn without tool calls).

    Returns ``None`` with ``state.message`` and ``state.calls`` (the saved calls) set, or
    what :func:`model_failure` makes of the router's error.
    """
    spec = state.spec
    output_format = spec.output_format
    await guard_input(state)  # the input guardrails, before the run's first model call
    try:
        async with state.record.holding_the_answer(), asyncio.timeout(spec.turn_timeout_seconds):
            completion, reasoning = await stream_model_turn(
                state.model, state.messages, state.offered, state.publish, compact_first=not state.compaction_exhausted,
                tool_choice=state.tool_choice,
                response_format=native_response_format(output_format) if output_format is not None else None,
            )
    except (TimeoutError, ModelCallError, AllEntriesFailed, StreamInterrupted) as exc:
        return await model_failure(state, exc)
    message = completion.message
    if state.final_turn and message.tool_calls:  # tools were withheld: ignore calls the model still wrote
        message = dataclasses.replace(message, tool_calls=())
    await guard_output(state, message)  # the output guardrails, before the answer is saved
    state.calls = await state.store.assistant_message_save(spec=spec, turn=state.turn, message=message,
                                                          reasoning=reasoning, llm_call=state.record.take_answer())
    state.message = message
    state.turn += 1
    state.current_entry = completion.entry_index
    state.compaction_attempts, state.compaction_exhausted = 0, state.no_compaction
    return None


async def model_failure(state: RunState, exc: Exception) -> Failed | Continue:
    """What a failed model turn means for the run.

    A too-long prompt compacts first (:class:`Continue` with ``force_compaction``) while the
    turn may still compact; a first stream break retries the turn once from the stored
    history (``model_retry`` published; clients drop the text streamed so far). Everything
    else is :class:`Failed` with its reason. Members read the class of a provider's error
    only; its (redacted) text stays in the LLMCall rows, which only admins read in full.
    """
    spec = state.spec
    if isinstance(exc, TimeoutError):
        return Failed(RunFailureReason.TURN_TIMEOUT,
                      f"A model turn took longer than the agent's turn timeout of {spec.turn_timeout_seconds:g} s.")
    if isinstance(exc, ContextWindowExceeded):
        if not state.compaction_exhausted:  # compact first; larger entries only after that
            state.force_compaction = True
            return CONTINUE
        return Failed(RunFailureReason.CONTEXT_WINDOW, f"The conversation does not fit any model of the route: {exc}")
    if isinstance(exc, AllEntriesFailed):
        return Failed(RunFailureReason.MODEL_UNAVAILABLE, f"No model could answer: {exc}")
    if isinstance(exc, StreamInterrupted):
        return await _stream_broke(state, exc)
    return Failed(RunFailureReason.MODEL_ERROR, "The model request failed: "
                  f"{public_error_message(exc.error_class)} ({exc.error_class})")


async def _stream_broke(state: RunState, exc: StreamInterrupted) -> Failed | Continue:
    """The model's answer broke off: fail the second time in one turn, else retry the turn."""
    if state.turn in state.interrupted_turns:
        return Failed(RunFailureReason.STREAM_INTERRUPTED, "The model's answer broke off twice: "
                      f"{public_error_message(exc.error_class)} ({exc.error_class})")
    # Nothing of the broken answer was persisted: retry the turn once from the stored history.
    state.interrupted_turns.add(state.turn)
    await state.publish("model_retry", {"turn": state.turn, "error_class": getattr(exc, "error_class", "") or "",
                                        "turn_restarted": True})
    return CONTINUE


# --- resolve --------------------------------------------------------------------------------


def checked_answer(state: RunState, text: str) -> Completed | Failed | Continue:
    """The answer ``text`` in the run's output format (:attr:`RunSpec.output_format`: the API
    caller's ``response_format``, else the agent's ``output_schema``): :class:`Completed` with it
    (without a code fence around it; its parsed value in ``structured``) when it matches or no
    format applies; else a repair turn (:class:`Continue`, the problem noted for the next prompt)
    while the agent's ``output_repairs`` allow and the loop limit is not reached, then
    :class:`Failed` ``output_invalid`` naming the problem."""
    output_format = state.spec.output_format
    if output_format is None:
        return Completed(text)
    problem = output_problem(output_format, text)
    spent = state.output_repairs or 0
    if problem is None:
        state.repair = ""
        return Completed(unfenced(text), structured=parsed_answer(text))
    if spent >= state.spec.output_repairs or state.final_turn:
        return Failed(RunFailureReason.OUTPUT_INVALID, f"The answer did not match the requested format after "
                      f"{spent} repair turn(s): {problem}")
    state.output_repairs = spent + 1
    state.repair = repair_note(problem)
    return CONTINUE


async def resolve(state: RunState) -> StepOutcome:
    """Act on the saved assistant message: no tool calls is the answer (:class:`Completed`;
    empty text fails, or reaches the loop limit on the final turn); else its calls run, and
    the run :class:`Paused` if one waits for approval, :class:`Completed` with the reply of an
    agent a handoff call handed the chat to (``Toolset.handoff``), else the next turn (:class:`Continue`).
    """
    message = state.message
    if message is None:
        raise RuntimeError("resolve runs after model_turn saved a message")
    if not message.tool_calls:
        if message.content.strip():
            return checked_answer(state, message.content)
        if state.final_turn:
            return loop_limit_reached(state.spec)
        return Failed(RunFailureReason.MODEL_ERROR, "The model returned an empty answer.")
    waiting = await execute_tool_calls(spec=state.spec, calls=state.calls, toolset=state.toolset,
                                       publish=state.publish, store=state.store, tool_store=state.tool_store)
    guard_tripped(state)  # a guardrail stopped one of the calls: the run ends here
    if waiting:
        return Paused()
    return await handed_off(state) or CONTINUE  # (another agent took the conversation over and answered)
