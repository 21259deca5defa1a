"""The ReAct loop: reason (a model turn), act (tool calls), observe (results), repeat.

Durable by construction: every step is persisted before the next, and each iteration
rebuilds its context from the database. A run redelivered after a worker died therefore
resumes where it stopped: tool calls of the last assistant message that have no result are
executed (those that have one never run again), then the loop goes on.

This module is the run's lifecycle around the loop: :func:`execute_run` (claim, heartbeat,
cancel watcher and run timeout in :func:`run_loop_cancellable`, the run's end in
:func:`_finish`). The loop itself is :func:`sessions.runner.turn.run_turns` over the turn's
steps (prepare → model turn → resolve, each returning a typed outcome); streaming a model
turn to clients is :mod:`sessions.runner.streaming`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from typing import Any

from agent_platform import metrics
from llm.metering import LLMCallPurpose
from llm.records import AttemptRecord
from sessions import runs
from sessions.models import RunFailureReason, RunStatus
from sessions.runner.adapters import production_ports
from sessions.runner.guarding import GuardrailStop, run_guarded
from sessions.runner.ports import Publish, Publisher, RunPorts, RunStore, run_ports_entered
from sessions.runner.run_context import run_attributions
from sessions.runner.sampling import run_sampler
from sessions.runner.spec import RunSpec
from sessions.runner.streaming import TOKEN_FLUSH_CHARS, TOKEN_FLUSH_SECONDS, StreamedTextBatcher
from sessions.runner.toolset import CapabilityUnavailable, ClientToolClash, Toolset
from sessions.runner.tracing import run_traced
from sessions.runner.turn import (
    DEFAULT_SYSTEM_PROMPT,
    FINAL_TURN_NOTE,
    Cancelled,
    Completed,
    Continue,
    Failed,
    Paused,
    RunEnd,
    RunState,
    run_turns,
)
from tenants.scoping import tenant_scope

__all__ = [
    "DEFAULT_SYSTEM_PROMPT", "FINAL_TURN_NOTE", "TOKEN_FLUSH_CHARS", "TOKEN_FLUSH_SECONDS", "Cancelled", "Completed",
    "Continue", "Failed", "Paused", "execute_run",
]

_StreamedTextBatcher = StreamedTextBatcher  # its old name here (tests and bench/concurrent_runs.py use it)

logger = logging.getLogger(__name__)


async def execute_run(run_id: int, *, tenant_id: int | None = None, ports: RunPorts | None = None) -> None:
    """Execute or resume run ``run_id`` to its end. Never raises for a run's own failure.

    Ends with the run ``completed``, ``failed`` (with ``reason``) or ``cancelled`` (a cancel
    was requested through :mod:`sessions.runner.cancellation`), and its event published.

    ``tenant_id``: the run's tenant, if the task's sender knew it; else it is looked up. A
    wrong one finds no run (the claim reads the run in that tenant only), and nothing happens.

    ``ports``: the run store, publisher, model, toolset opener and cancel watch the run goes
    through (:mod:`sessions.runner.ports`); None: the production ones
    (:func:`sessions.runner.adapters.production_ports`).
    """
    if ports is None:
        ports = production_ports()
    store = ports.store
    if tenant_id is None:
        tenant_id = await store.tenant_of(run_id)
        if tenant_id is None:
            logger.warning("run %s does not exist", run_id)
            return
    with tenant_scope(tenant_id):
        try:
            spec = await store.claim(run_id)  # publishes run_running
        except runs.RunNotClaimable as exc:
            logger.info("not starting: %s", exc)
            return
        except ValueError as exc:
            await _finish(ports, run_id, None, Failed(RunFailureReason.CONFIGURATION, str(exc)))
            return
        publish = ports.publisher(spec.session_id, run_id)
        # The text streamed in the current model turn (stream_model_turn keeps it): a stopped run keeps it as its reply.
        publish.streamed = []
        heartbeat = asyncio.create_task(_heartbeat(store, run_id, spec.attempt, asyncio.current_task()),
                                        name=f"run-{run_id}-heartbeat")
        try:
            outcome = await run_loop_cancellable(spec, publish, ports)
        except CapabilityUnavailable as exc:
            outcome = Failed(RunFailureReason.CAPABILITY_UNAVAILABLE, str(exc))
        except ClientToolClash as exc:
            outcome = Failed(RunFailureReason.CONFIGURATION, str(exc))
        except Exception as exc:  # the run must end failed with a reason, never stay running
            logger.exception("run %s crashed", run_id)
            outcome = Failed(RunFailureReason.INTERNAL, f"Internal error: {type(exc).__name__}: {exc}")
        finally:
            heartbeat.cancel()
        await _finish(ports, run_id, spec, outcome, publish=publish)


async def _heartbeat(store: RunStore, run_id: int, attempt: int, owner: asyncio.Task | None) -> None:
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
            alive = await store.heartbeat(run_id, attempt)
        except Exception:  # noqa: BLE001 - keep beating
            logger.warning("run %s: heartbeat write failed", run_id, exc_info=True)
            continue
        if not alive:
            logger.warning("run %s: attempt %s was taken over by another worker; stopping here", run_id, attempt)
            if owner is not None:
                owner.cancel()
            return


async def _finish(ports: RunPorts, run_id: int, spec: RunSpec | None, outcome: RunEnd, *,
                  publish: Publish | None = None) -> None:
    """The run's end as the loop left it: paused (:func:`sessions.runs.run_pause`) or ended
    (:func:`sessions.runs.run_finish`); each publishes its event and starts the runs that may
    start now. A chat's first completed run then gets its title (``after_completed``)."""
    store = ports.store
    metrics.run_ended(status=outcome.status, reason=outcome.reason, depth=spec.depth if spec else 0)
    if publish is None:  # a run that never started
        publish = ports.publisher(await store.session_of(run_id), run_id)
    if outcome.status == RunStatus.AWAITING_APPROVAL:
        await store.pause(run_id, publish=publish)
    else:
        finished = await store.finish(run_id, outcome, publish=publish, spec=spec)
        if finished.ended and outcome.status == RunStatus.COMPLETED and spec is not None:
            await store.after_completed(spec)


CANCELLED_OUTCOME = Cancelled()
AWAITING_APPROVAL_OUTCOME = Paused()
"""The run paused: some tool call waits for a human; no worker holds it meanwhile."""


async def run_loop_cancellable(spec: RunSpec, publish: Publisher, ports: RunPorts, *,
                               toolset: Toolset | None = None) -> RunEnd:
    """:func:`_run_loop`, cancelled as soon as a cancel of the run is requested.

    The loop runs as a task next to :func:`watch_for_cancel`. When the watcher returns
    first, the loop task is cancelled: the CancelledError goes into whatever it awaits (the
    router's HTTP stream is closed, the ``asyncio.gather`` of tool calls cancels every
    tool, the AsyncExitStack closes the MCP connections) and this waits for it to unwind.
    Tool calls left without a result are recorded ``cancelled`` by :func:`sessions.runs.run_finish`.

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
    loop_task = asyncio.create_task(run_traced(spec, _run_loop(spec, publish, ports, toolset=toolset)),
                                    name=f"run-{spec.run_id}-loop")  # run_traced: invoke_agent span if tracing
    watcher = asyncio.create_task(ports.cancel_watch(spec.run_id), name=f"run-{spec.run_id}-cancel-watch")
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
            return Failed(RunFailureReason.RUN_TIMEOUT,
                          f"The run took longer than the agent's run timeout of {spec.run_timeout_seconds:g} s.")
        # Stopped mid-answer: the text streamed so far stays as the run's reply (the chat shows it
        # marked stopped, after a reload too).
        partial = "".join(publish.streamed or ())
        return Cancelled(reply=partial) if partial.strip() else CANCELLED_OUTCOME
    finally:
        for task in (loop_task, watcher):
            task.cancel()
        await asyncio.wait({loop_task})  # the loop must unwind (its MCP connections close)
        await asyncio.wait({watcher}, timeout=1.0)  # the watcher holds nothing the run needs
        if not watcher.done():
            logger.warning("run %s: the cancel watcher did not stop", spec.run_id)


async def _run_loop(spec: RunSpec, publish: Publisher, ports: RunPorts, *, toolset: Toolset | None = None) -> RunEnd:
    """The loop of run ``spec``: turn after turn of :mod:`sessions.runner.turn`'s steps
    (prepare → model turn → resolve) until one ends the run; a top-level run's answer then gets
    its kinds' attributions (:func:`sessions.runner.run_context.run_attributions`). ``toolset``: given for a sub-run
    (a subset of its parent's tools, already connected), else opened here by the ports'
    toolset opener (and closed when the loop ends). A skill's sub-run started by one of its tool
    calls runs over the same ``ports`` (:func:`sessions.runner.ports.run_ports_current`)."""
    store = ports.store
    # A skill's sub-run (inside one of the tool calls) goes through these ports too.
    with run_ports_entered(ports):
        async with contextlib.AsyncExitStack() as stack:
            context: tuple = ()
            if toolset is None:
                toolset, context = await ports.toolsets(spec, stack, publish)
            if await store.has_artifacts(spec.session_id):
                toolset.add_builtin("read_artifact")
            record = _LlmCallRecorder(spec, spec.loop_count, store)
            model = ports.model(spec, record, publish)
            state = RunState.start(spec=spec, publish=publish, toolset=toolset, model=model, record=record,
                                   store=store, context=context, tool_store=ports.tool_store,
                                   model_for=lambda route_spec: ports.model(route_spec, record, publish))
            toolset.sampler = run_sampler(state, ports)  # MCP servers' sampling requests (ToolContext.sample)
            try:
                with run_guarded(spec, publish):  # the agent's guardrails (sessions.runner.guarding)
                    outcome = await run_turns(state)
            except GuardrailStop as stop:
                outcome = Failed(stop.reason, stop.error)
            if isinstance(outcome, Completed) and outcome.structured is not None and spec.depth == 0:
                await store.structured_save(spec.run_id, outcome.structured)  # the REST API's `structured`
            if isinstance(outcome, Completed) and spec.depth == 0 and toolset.context is not None:
                # Before the run ends, so that run_completed carries them (bounded: ATTRIBUTION_TIMEOUT_SECONDS).
                attributions = await run_attributions(spec, toolset, context, outcome.reply, store=store)
                if attributions is not None:
                    outcome = dataclasses.replace(outcome, attributions=attributions)
            return outcome


class _LlmCallRecorder:
    """The router's ``record`` callback: writes each attempt's LLMCall row as it ends, except
    the attempt that answered a model turn, which :func:`sessions.runs.assistant_message_save` writes
    with the answer (one transaction and one thread hop less per turn).

    Inside :meth:`holding_the_answer` a succeeded attempt is kept; if the turn then fails
    anyway (a publish error, the turn timeout, a cancel), it is written on the way out.
    Inside :meth:`calls_for` the attempts are written with that purpose (a compaction's
    summary: ``compaction``), else ``turn``.
    """

    def __init__(self, spec: RunSpec, turn: int, store: RunStore) -> None:
        self.spec = spec
        self.turn = turn
        self._store = store
        self._holding = False
        self._answer: AttemptRecord | None = None
        self.purpose: str = LLMCallPurpose.TURN.value
        """The purpose the attempts ending now are written with."""

    async def __call__(self, attempt: AttemptRecord) -> None:
        if self._holding and self._answer is None and attempt.status == "succeeded":
            self._answer = attempt
            return
        await self._store.llm_call_record(spec=self.spec, turn=self.turn, record=attempt, purpose=self.purpose)

    @contextlib.contextmanager
    def calls_for(self, purpose: str) -> Any:
        """Write the attempts that end inside the block with ``purpose`` (an
        :class:`~llm.metering.LLMCallPurpose` value) instead of ``turn``. The run's model calls
        are sequential (a compaction runs before its turn's model call, never beside it), so
        no other call's attempts end inside the block."""
        previous, self.purpose = self.purpose, str(purpose)
        try:
            yield
        finally:
            self.purpose = previous

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

