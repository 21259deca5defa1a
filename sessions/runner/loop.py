"""The ReAct loop: reason (a model turn), act (tool calls), observe (results), repeat.

Durable by construction: every step is persisted before the next, and each iteration
rebuilds its context from the database. A run redelivered after a worker died therefore
resumes where it stopped: tool calls of the last assistant message that have no result are
executed (those that have one never run again), then the loop goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from dataclasses import dataclass
from typing import Any

from asgiref.sync import sync_to_async

from llm.errors import AllEntriesFailed, ContextWindowExceeded, ModelCallError, StreamInterrupted, public_error_message
from llm.health import RedisEntryHealth
from llm.records import AttemptRecord
from llm.router import Router
from llm.tokens import estimate_tokens
from llm.types import ChatMessage, Completion, ReasoningDelta, TextDelta, ToolSpec
from sessions.events import async_redis, event_publish, event_publish_nowait, pipelined_command
from sessions.models import RunFailureReason, RunStatus
from sessions.runner import _db
from sessions.runner.cancellation import CANCEL_ERROR, CANCEL_REASON, raise_if_cancelling, watch_for_cancel
from sessions.runner.compaction import BUDGET_RATIO, MAX_ATTEMPTS_PER_TURN, compact, system_prompt_with_summary
from sessions.runner.spec import RunSpec
from sessions.runner.tool_execution import UNTRUSTED_SYSTEM_NOTE, execute_tool_calls
from sessions.runner.toolset import CapabilityUnavailable, Toolset, toolset_open
from tenants.scoping import current_tenant_id, tenant_scope

logger = logging.getLogger(__name__)

DEFAULT_SYSTEM_PROMPT = "You are a helpful assistant."
FINAL_TURN_NOTE = (
    "You cannot call any more tools for this request. Answer the user now, in plain text, "
    "with what you have found so far."
)


@dataclass(frozen=True, slots=True)
class Outcome:
    status: str
    reply: str = ""
    error: str = ""
    reason: str = ""


async def execute_run(run_id: int, *, tenant_id: int | None = None) -> None:
    """Execute or resume run ``run_id`` to its end. Never raises for a run's own failure.

    Ends with the run ``completed``, ``failed`` (with ``reason``) or ``cancelled`` (a cancel
    was requested through :mod:`sessions.runner.cancellation`), and its event published.

    ``tenant_id``: the run's tenant, if the task's sender knew it; else it is looked up. A
    wrong one finds no run (the claim reads the run in that tenant only), and nothing happens.
    """
    if tenant_id is None:
        tenant_id = await _db.run_tenant_id(run_id)
        if tenant_id is None:
            logger.warning("run %s does not exist", run_id)
            return
    with tenant_scope(tenant_id):
        try:
            spec = await _db.db(_db.run_claim)(run_id)
        except _db.RunNotClaimable as exc:
            logger.info("not starting: %s", exc)
            return
        except ValueError as exc:
            await _finish(run_id, None, Outcome(RunStatus.FAILED, error=str(exc), reason=RunFailureReason.CONFIGURATION))
            return

        async def publish(event_type: str, data: dict[str, Any]) -> None:
            await event_publish(session_id=spec.session_id, run_id=run_id, type=event_type, data=data)
            raise_if_cancelling()  # redis-py may swallow a cancel of the run's loop task

        publish.nowait = lambda event_type, data: event_publish_nowait(  # type: ignore[attr-defined]
            session_id=spec.session_id, run_id=run_id, type=event_type, data=data
        )
        # The text streamed in the current model turn (_model_turn keeps it): a stopped run keeps it as its reply.
        publish.streamed = []  # type: ignore[attr-defined]
        await publish("run_running", {"attempt": spec.attempt})
        heartbeat = asyncio.create_task(_heartbeat(run_id, spec.attempt, asyncio.current_task()),
                                        name=f"run-{run_id}-heartbeat")
        try:
            outcome = await _run_loop_cancellable(spec, publish)
        except CapabilityUnavailable as exc:
            outcome = Outcome(RunStatus.FAILED, error=str(exc), reason=RunFailureReason.CAPABILITY_UNAVAILABLE)
        except Exception as exc:  # the run must end failed with a reason, never stay running
            logger.exception("run %s crashed", run_id)
            outcome = Outcome(RunStatus.FAILED, error=f"Internal error: {type(exc).__name__}: {exc}",
                              reason=RunFailureReason.INTERNAL)
        finally:
            heartbeat.cancel()
        await _finish(run_id, spec, outcome, publish=publish)


async def _heartbeat(run_id: int, attempt: int, owner: asyncio.Task | None) -> None:
    """Write the run's heartbeat every ``RUN_HEARTBEAT_SECONDS`` while it works.

    The sweeper (:func:`sessions.services.runs_sweep`) treats a run whose heartbeat is older
    than ``RUN_STALE_SECONDS`` as orphaned by a dead worker and hands it to another. If that
    happened to a worker that was only stalled, this worker finds its attempt superseded at
    its next beat and cancels ``owner`` (the run's task here) so two workers never go on
    with one run. A failed write is logged and retried (a database blip must not kill the run).
    """
    from django.conf import settings

    while True:
        await asyncio.sleep(settings.RUN_HEARTBEAT_SECONDS)
        try:
            alive = await _db.run_heartbeat(run_id, attempt)
        except Exception:  # noqa: BLE001 - keep beating
            logger.warning("run %s: heartbeat write failed", run_id, exc_info=True)
            continue
        if not alive:
            logger.warning("run %s: attempt %s was taken over by another worker; stopping here", run_id, attempt)
            if owner is not None:
                owner.cancel()
            return


async def _finish(run_id: int, spec: RunSpec | None, outcome: Outcome, *, publish: Any = None) -> None:
    if publish is None:
        from sessions.runner._db import Run  # local: only for the session id of a run that never started

        session_id = await _db.db(lambda: Run.objects.get(pk=run_id).session_id)()

        async def publish(event_type: str, data: dict[str, Any]) -> None:
            await event_publish(session_id=session_id, run_id=run_id, type=event_type, data=data)

    if outcome.status == RunStatus.AWAITING_APPROVAL:
        approvals, to_start = await _db.db(_db.run_pause)(run_id)
        if approvals:
            await publish("run_awaiting_approval", {"approvals": approvals})
        await _start_runs(to_start)
        return
    ended = {"run_id": run_id, "status": outcome.status, "reply": outcome.reply, "error": outcome.error,
             "reason": outcome.reason}
    if spec is not None and spec.attempt == 1 and not spec.steer and not spec.starts_subruns:
        finished = await _db.run_finish_alone(  # nothing steered into it, no sub-runs
            **ended, session_id=spec.session_id, subrun=spec.depth > 0,
        )
    else:
        finished = await _db.db(_db.run_finish)(**ended)
    for target in (run_id, *finished.steered):
        if outcome.status == RunStatus.COMPLETED:
            data: dict[str, Any] = {"reply": outcome.reply}
            event_type = "run_completed"
        elif outcome.status == RunStatus.CANCELLED:
            data, event_type = {"reason": CANCEL_REASON}, "run_cancelled"
        else:
            data, event_type = {"error": outcome.error, "reason": outcome.reason}, "run_failed"
        if target == run_id:
            await publish(event_type, data)
        elif spec is not None:  # a run steered into this one ends with it
            await event_publish(session_id=spec.session_id, run_id=target, type=event_type,
                                data={**data, "steered_into": run_id})
    await _start_runs(finished.to_start)


async def _start_runs(run_ids: list[int]) -> None:
    """Hand runs to workers (each claim re-checks that it may start)."""
    if not run_ids:
        return
    from sessions.tasks import run_enqueue

    for next_run_id in run_ids:
        await sync_to_async(run_enqueue)(next_run_id, current_tenant_id())  # runs of this run's tenant


CANCELLED_OUTCOME = Outcome(RunStatus.CANCELLED, error=CANCEL_ERROR)
AWAITING_APPROVAL_OUTCOME = Outcome(RunStatus.AWAITING_APPROVAL)
"""The run paused: some tool call waits for a human; no worker holds it meanwhile."""


async def _run_loop_cancellable(spec: RunSpec, publish: Any, *, toolset: Toolset | None = None) -> Outcome:
    """:func:`_run_loop`, cancelled as soon as a cancel of the run is requested.

    The loop runs as a task next to :func:`watch_for_cancel`. When the watcher returns
    first, the loop task is cancelled: the CancelledError goes into whatever it awaits (the
    router's HTTP stream is closed, the ``asyncio.gather`` of tool calls cancels every
    tool, the AsyncExitStack closes the MCP connections) and this waits for it to unwind.
    Tool calls left without a result are recorded ``cancelled`` by ``run_finish``.

    The run's wall-clock limit (the agent's ``run_timeout_seconds`` from the run's first
    start, time spent awaiting approvals excluded) cancels the loop the same way and ends the
    run ``failed`` with reason ``run_timeout``.

    Returns:
        The loop's own outcome if it ended first (a finished run is never turned into a
        cancelled one), else :data:`CANCELLED_OUTCOME` or the run-timeout outcome.

    Raises:
        Whatever ``_run_loop`` raises. If the watcher itself fails (Redis down), the run goes
        on without cancellation rather than failing.
    """
    loop_task = asyncio.create_task(_run_loop(spec, publish, toolset=toolset), name=f"run-{spec.run_id}-loop")
    watcher = asyncio.create_task(watch_for_cancel(spec.run_id), name=f"run-{spec.run_id}-cancel-watch")
    timeout = max(0.0, spec.run_seconds_left(time.time()))
    try:
        await asyncio.wait({loop_task, watcher}, return_when=asyncio.FIRST_COMPLETED, timeout=timeout)
        if not loop_task.done() and watcher.done() and watcher.exception() is not None:
            logger.error("run %s: cannot watch for cancel requests: %r", spec.run_id, watcher.exception())
            await asyncio.wait({loop_task}, timeout=max(0.0, spec.run_seconds_left(time.time())))
        if loop_task.done():
            return loop_task.result()
        timed_out = not watcher.done() or watcher.exception() is not None
        logger.info("run %s: %s", spec.run_id, "run timeout" if timed_out else "cancelled by request")
        loop_task.cancel()
        await asyncio.wait({loop_task})
        if not loop_task.cancelled() and loop_task.exception() is not None:
            logger.warning("run %s: error while unwinding after cancel: %r", spec.run_id, loop_task.exception())
        if timed_out:
            return Outcome(
                RunStatus.FAILED, reason=RunFailureReason.RUN_TIMEOUT,
                error=f"The run took longer than the agent's run timeout of {spec.run_timeout_seconds:g} s.",
            )
        # Stopped mid-answer: the text streamed so far stays as the run's reply (the chat shows it
        # marked stopped, after a reload too).
        partial = "".join(getattr(publish, "streamed", None) or ())
        return dataclasses.replace(CANCELLED_OUTCOME, reply=partial) if partial.strip() else CANCELLED_OUTCOME
    finally:
        for task in (loop_task, watcher):
            task.cancel()
        await asyncio.wait({loop_task})  # the loop must unwind (its MCP connections close)
        await asyncio.wait({watcher}, timeout=1.0)  # the watcher holds nothing the run needs
        if not watcher.done():
            logger.warning("run %s: the cancel watcher did not stop", spec.run_id)


async def _run_loop(spec: RunSpec, publish: Any, *, toolset: Toolset | None = None) -> Outcome:
    """The loop of run ``spec``; ``toolset``: given for a sub-run (a subset of its parent's
    tools, already connected), else opened here from the run's bindings."""
    async with contextlib.AsyncExitStack() as stack:
        if toolset is None:
            toolset = await toolset_open(spec, stack, publish=publish)
        if await _db.session_has_artifacts(spec.session_id):
            toolset.add_builtin("read_artifact")
        turn = spec.loop_count
        record = _LlmCallRecorder(spec, turn)
        router = Router(spec.entries, record=record, health=entry_health(), on_event=publish)
        interrupted_turns: set[int] = set()
        current_entry = 0  # the entry that answered last: its window decides when to compact
        compaction_attempts = 0  # in this model turn (never more than MAX_ATTEMPTS_PER_TURN)
        # Sub-runs are never compacted (their history is short-lived and compactions move the
        # session's cursor); one whose context overflows fails with reason context_window.
        no_compaction = spec.depth > 0
        compaction_exhausted = no_compaction  # this turn: nothing more to compact, or attempts used up
        force_compaction = False  # a model rejected the prompt as too long
        known_cursor: dict[str, Any] = {}  # the compaction cursor, once read (see history_load)
        while True:
            record.turn = turn
            history = await _db.history_load(spec.run_id, session_id=spec.session_id, subrun=spec.depth > 0,
                                             **known_cursor)
            known_cursor = {"compaction": history.compaction}  # until this run compacts
            last = history.tail
            if last is not None:
                if not last.tool_calls:  # answered before a worker died: nothing left to do
                    return Outcome(RunStatus.COMPLETED, reply=last.content)
                pending = await _db.db(_db.pending_tool_calls)(
                    run_id=spec.run_id, call_ids=[c.id for c in last.tool_calls]
                )
                if await execute_tool_calls(spec=spec, calls=pending, toolset=toolset, publish=publish, resumed=True):
                    return AWAITING_APPROVAL_OUTCOME
                continue
            # One locked query per turn, so only for agents in steer mode.
            steered = await _db.db(_db.steer_absorb)(spec.run_id) if spec.steer and spec.depth == 0 else []
            if steered:  # messages sent meanwhile join this run's history from this turn on
                for steered_run_id in steered:
                    await event_publish(session_id=spec.session_id, run_id=steered_run_id, type="run_running",
                                        data={"steered_into": spec.run_id})
                continue
            if turn >= spec.max_loop_count:
                return _loop_limit_reached(spec)
            final_turn = turn == spec.max_loop_count - 1
            system = system_prompt_with_summary(spec.system_prompt or DEFAULT_SYSTEM_PROMPT, history.summary)
            tool_specs = toolset.specs
            if any(t.untrusted for t in toolset.tools.values()):
                system = f"{system}\n\n{UNTRUSTED_SYSTEM_NOTE}"
            messages = [ChatMessage(role="system", content=system), *history.messages]
            if final_turn and tool_specs:
                messages.append(ChatMessage(role="user", content=FINAL_TURN_NOTE))
            offered = [] if final_turn else tool_specs
            prompt_tokens = estimate_tokens(messages, offered)
            budget = spec.entries[current_entry].max_input_tokens * BUDGET_RATIO
            if (force_compaction or prompt_tokens > budget) and not compaction_exhausted:
                compaction_attempts += 1
                result = await compact(spec=spec, history=history, router=router, publish=publish,
                                       attempt=compaction_attempts, tokens_before=prompt_tokens)
                known_cursor = {}  # the cursor may have moved: read it again
                force_compaction = False
                if result.nothing_to_compact or compaction_attempts >= MAX_ATTEMPTS_PER_TURN:
                    compaction_exhausted = True
                if not result.ok and not result.nothing_to_compact and compaction_attempts >= MAX_ATTEMPTS_PER_TURN:
                    return Outcome(
                        RunStatus.FAILED,
                        error=f"The conversation could not be compacted ({compaction_attempts} attempts): {result.error}",
                        reason=RunFailureReason.COMPACTION_FAILED,
                    )
                continue
            over_budget = await _budget_exceeded(spec, prompt_tokens=prompt_tokens, entry_index=current_entry)
            if over_budget:
                return Outcome(RunStatus.FAILED, error=over_budget, reason=RunFailureReason.BUDGET_EXCEEDED)
            try:
                async with record.holding_the_answer(), asyncio.timeout(spec.turn_timeout_seconds):
                    completion, reasoning = await _model_turn(
                        router, messages, offered, publish, compact_first=not compaction_exhausted
                    )
            except TimeoutError:
                return Outcome(
                    RunStatus.FAILED,
                    error=f"A model turn took longer than the agent's turn timeout of {spec.turn_timeout_seconds:g} s.",
                    reason=RunFailureReason.TURN_TIMEOUT,
                )
            except ContextWindowExceeded as exc:
                if not compaction_exhausted:  # compact first; larger entries only after that
                    force_compaction = True
                    continue
                return Outcome(RunStatus.FAILED, error=f"The conversation does not fit any model of the route: {exc}",
                               reason=RunFailureReason.CONTEXT_WINDOW)
            except AllEntriesFailed as exc:
                return Outcome(RunStatus.FAILED, error=f"No model could answer: {exc}", reason=RunFailureReason.MODEL_UNAVAILABLE)
            except StreamInterrupted as exc:
                if turn in interrupted_turns:
                    # Members read the run's error: the class only; the provider's (redacted)
                    # text stays in the LLMCall rows, which only admins read in full.
                    return Outcome(RunStatus.FAILED, error="The model's answer broke off twice: "
                                   f"{public_error_message(exc.error_class)} ({exc.error_class})",
                                   reason=RunFailureReason.STREAM_INTERRUPTED)
                # Nothing of the broken answer was persisted: retry the turn once from the
                # stored history; clients drop the text streamed so far.
                interrupted_turns.add(turn)
                await publish("model_retry", {"turn": turn, "error_class": getattr(exc, "error_class", "") or "",
                                              "turn_restarted": True})
                continue
            except ModelCallError as exc:
                return Outcome(RunStatus.FAILED, reason=RunFailureReason.MODEL_ERROR, error="The model request failed: "
                               f"{public_error_message(exc.error_class)} ({exc.error_class})")
            message = completion.message
            if final_turn and message.tool_calls:  # tools were withheld: ignore calls the model still wrote
                message = dataclasses.replace(message, tool_calls=())
            calls = await _db.assistant_message_save(spec=spec, turn=turn, message=message, reasoning=reasoning,
                                                     llm_call=record.take_answer())
            turn += 1
            current_entry = completion.entry_index
            compaction_attempts, compaction_exhausted = 0, no_compaction
            if not message.tool_calls:
                if not message.content.strip():
                    if final_turn:
                        return _loop_limit_reached(spec)
                    return Outcome(RunStatus.FAILED, error="The model returned an empty answer.",
                                   reason=RunFailureReason.MODEL_ERROR)
                return Outcome(RunStatus.COMPLETED, reply=message.content)
            if await execute_tool_calls(spec=spec, calls=calls, toolset=toolset, publish=publish):
                return AWAITING_APPROVAL_OUTCOME


class _LlmCallRecorder:
    """The router's ``record`` callback: writes each attempt's LLMCall row as it ends, except
    the attempt that answered a model turn, which :func:`_db.assistant_message_save` writes
    with the answer (one transaction and one thread hop less per turn).

    Inside :meth:`holding_the_answer` a succeeded attempt is kept; if the turn then fails
    anyway (a publish error, the turn timeout, a cancel), it is written on the way out.
    """

    def __init__(self, spec: RunSpec, turn: int) -> None:
        self.spec = spec
        self.turn = turn
        self._holding = False
        self._answer: AttemptRecord | None = None

    async def __call__(self, attempt: AttemptRecord) -> None:
        if self._holding and self._answer is None and attempt.status == "succeeded":
            self._answer = attempt
            return
        await _db.llm_call_record(spec=self.spec, turn=self.turn, record=attempt)

    @contextlib.asynccontextmanager
    async def holding_the_answer(self) -> Any:
        self._holding = True
        try:
            yield
        except BaseException:
            self._holding = False
            answer = self.take_answer()
            if answer is not None:
                await self(answer)
            raise
        finally:
            self._holding = False

    def take_answer(self) -> AttemptRecord | None:
        """The kept answering attempt (once), or None."""
        answer, self._answer = self._answer, None
        return answer


def entry_health() -> RedisEntryHealth:
    """Route-entry health shared by every worker (cooldowns, circuit breaker) in Redis, its
    scripts pipelined on the loop's publishing connection (``pipelined_command``)."""
    from django.conf import settings

    return RedisEntryHealth(async_redis(), prefix=f"{settings.REDIS_KEY_PREFIX}:health", execute=pipelined_command)


def _loop_limit_reached(spec: RunSpec) -> Outcome:
    return Outcome(
        RunStatus.FAILED,
        error=f"The agent reached its limit of {spec.max_loop_count} model turns without answering.",
        reason=RunFailureReason.MAX_LOOP_COUNT,
    )


async def _budget_exceeded(spec: RunSpec, *, prompt_tokens: int, entry_index: int) -> str:
    """Why the next model turn would exceed a budget, or "" if it would not.

    "Would": what the run has used so far plus the next prompt (``prompt_tokens``, the
    ``llm.tokens`` estimate, priced at the input price of the entry that answered last)
    against the agent's per-run limits and the tenant's monthly budget.
    """
    if spec.max_tokens_per_run is None and spec.max_cost_per_run_usd_micros is None and (
        spec.tenant_monthly_budget_usd_micros is None
    ):
        return ""
    next_prompt_tokens = prompt_tokens
    next_cost = round(next_prompt_tokens * spec.entries[entry_index].input_price_per_mtok)
    used = await _db.run_usage(spec.run_id)
    if spec.max_tokens_per_run is not None and used.tokens + next_prompt_tokens > spec.max_tokens_per_run:
        return (f"The run has used {used.tokens} tokens; the next model turn (~{next_prompt_tokens} prompt tokens) "
                f"would exceed the agent's budget of {spec.max_tokens_per_run} tokens per run.")
    if spec.max_cost_per_run_usd_micros is not None and used.cost_usd_micros + next_cost > spec.max_cost_per_run_usd_micros:
        return (f"The run has cost ${used.cost_usd_micros / 1e6:.6f}; the next model turn would exceed the agent's "
                f"budget of ${spec.max_cost_per_run_usd_micros / 1e6:.6f} per run.")
    if spec.tenant_monthly_budget_usd_micros is not None:
        month = await _db.db(_db.tenant_month_cost_usd_micros)(spec.tenant_id)
        if month + next_cost > spec.tenant_monthly_budget_usd_micros:
            return (f"The tenant has used ${month / 1e6:.2f} of its ${spec.tenant_monthly_budget_usd_micros / 1e6:.2f} "
                    "monthly model budget.")
    return ""


TOKEN_FLUSH_SECONDS = 0.025
"""Streamed text is published at most this long after it arrived (25 ms: half the 50 ms
token-to-client target), and at most once per this interval per run while it keeps coming:
a run streaming 100 tokens/s costs ~40 events/s instead of 100."""
TOKEN_FLUSH_CHARS = 512


class _StreamedTextBatcher:
    """Batches a turn's streamed text into ``content_token``/``reasoning_token`` events.

    A throttle with a trailing timer: text that arrives after a quiet interval (nothing
    published for :data:`TOKEN_FLUSH_SECONDS`) is published at once, so the first token and a
    slow model's tokens are never held; text that arrives sooner waits until that interval
    has passed since the last publish, on a timer, so a pause in the stream never holds text
    back. :data:`TOKEN_FLUSH_CHARS` buffered publish at once.

    A publish does not wait for the previous one to return. ``publish.nowait`` (if the
    publish function has it: ``(event_type, data) -> awaitable``, see
    :func:`sessions.events.event_publish_nowait`) queues the event at once, on one ordered
    connection, so ``seq`` follows the stream's order and no task is made per event. Else
    each publish is a task of its own; tasks start in the order they are made, and
    ``event_publish`` queues its event before it first suspends, so the order holds too.
    Waiting for the previous reply used to hold text back by a whole Redis round trip of a
    busy loop (bench/README.md).

    :meth:`close` publishes the rest, waits for every publish and raises the first one's
    error; :meth:`drop` discards what is buffered but lets the publishes in flight finish (a
    broken stream: its ``model_retry`` must come after them); :meth:`abort` also cancels
    them (the turn is cancelled).
    """

    def __init__(self, publish: Any) -> None:
        self._publish = publish
        self._loop = asyncio.get_running_loop()
        self._groups: list[tuple[str, list[str]]] = []  # buffered text: (event type, pieces), in order
        self._size = 0
        self._last_publish_at = float("-inf")
        self._timer: asyncio.TimerHandle | None = None
        self._nowait = getattr(publish, "nowait", None)
        self._inflight: set[asyncio.Future[Any]] = set()
        self._error: BaseException | None = None

    def add(self, event_type: str, text: str) -> None:
        if self._groups and self._groups[-1][0] == event_type:
            self._groups[-1][1].append(text)
        else:
            self._groups.append((event_type, [text]))
        self._size += len(text)
        wait = self._last_publish_at + TOKEN_FLUSH_SECONDS - self._loop.time()
        if self._size >= TOKEN_FLUSH_CHARS or wait <= 0:
            self._flush()
        elif self._timer is None:
            self._timer = self._loop.call_later(wait, self._flush)

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _flush(self) -> None:
        self._stop_timer()
        if not self._groups:
            return
        groups, self._groups, self._size = self._groups, [], 0
        self._last_publish_at = self._loop.time()
        for event_type, pieces in groups:
            data = {"text": "".join(pieces)}
            if self._nowait is not None:
                sent = asyncio.ensure_future(self._nowait(event_type, data))
            else:
                sent = asyncio.ensure_future(self._publish(event_type, data))
            self._inflight.add(sent)
            sent.add_done_callback(self._sent)

    def _sent(self, sent: asyncio.Future[Any]) -> None:
        self._inflight.discard(sent)
        if not sent.cancelled() and sent.exception() is not None and self._error is None:
            self._error = sent.exception()

    async def close(self) -> None:
        """Publish everything buffered and wait for it (raises a publish's error; a cancel
        while waiting aborts)."""
        try:
            self._flush()
            if self._inflight:
                await asyncio.wait(set(self._inflight))
        except asyncio.CancelledError:
            self.abort()
            raise
        if self._error is not None:
            raise self._error

    async def drop(self) -> None:
        """Discard the buffered text; wait for the publishes in flight (an error is logged)."""
        self._stop_timer()
        self._groups, self._size = [], 0
        if self._inflight:
            await asyncio.wait(set(self._inflight))
        if self._error is not None:
            logger.warning("publishing streamed text failed: %r", self._error)

    def abort(self) -> None:
        """Stop: nothing more is published (the turn is being cancelled)."""
        self._stop_timer()
        self._groups, self._size = [], 0
        for sent in self._inflight:
            sent.cancel()


async def _model_turn(
    router: Router, messages: list[ChatMessage], tool_specs: list[ToolSpec], publish: Any, *, compact_first: bool = False
) -> tuple[Completion, str]:
    """Stream one model turn, publishing text and reasoning in batches (:class:`_StreamedTextBatcher`).

    Returns:
        The completion, and the reasoning text streamed with it (recorded, never fed back).
    """
    completion: Completion | None = None
    reasoning: list[str] = []
    batcher = _StreamedTextBatcher(publish)
    streamed = getattr(publish, "streamed", None)  # this turn's text, for a run stopped mid-answer
    if streamed is not None:
        streamed.clear()
    try:
        async for event in router.stream(messages, tool_specs, compact_first=compact_first):
            if isinstance(event, TextDelta):
                batcher.add("content_token", event.text)
                if streamed is not None:
                    streamed.append(event.text)
            elif isinstance(event, ReasoningDelta):
                batcher.add("reasoning_token", event.text)
                reasoning.append(event.text)
            elif isinstance(event, Completion):
                completion = event
    except asyncio.CancelledError:
        batcher.abort()
        raise
    except BaseException:
        await batcher.drop()
        raise
    await batcher.close()
    if completion is None:
        raise StreamInterrupted("the stream ended without a completion")
    if streamed is not None:  # the turn's text is saved with its assistant message from here on
        streamed.clear()
    return completion, "".join(reasoning)
