"""The production adapters of the runner's ports (:mod:`sessions.runner.ports`), wired in one
place: :func:`production_ports`.

- :class:`DatabaseRunStore`: PostgreSQL. Status transitions and row writes are
  :mod:`sessions.runs`' functions; the runner's reads are :mod:`sessions.runner.database`'s (plain
  SQL on the run host loop's async pool for what every turn reads, ORM on the runner's
  database threads for the rest). The methods are those functions themselves (no wrapper
  frame per call: the per-turn path costs what it cost before the ports).
- the publisher: :class:`RedisPublisher` (a :class:`~sessions.runner.ports.Publisher`): Redis
  streams (:func:`sessions.events.event_publish`), with the cancel check after each publish;
- the model: the fallback router over the run's route entries, with the route-entry health
  shared in Redis;
- the toolset opener: the capability kinds (:func:`sessions.runner.toolset.toolset_open`) and
  the run's start context;
- the cancel watch: :func:`sessions.runner.cancellation.watch_for_cancel`;
- the tool store: :data:`sessions.tool_store.SESSION_TOOL_STORE` (artifacts and todos, each
  tool call's ``ToolContext.store``).

Also the public names of the runner's configuration load and history read for code outside
the runner (capabilities' tests, ``bench/storage.py``): :func:`run_spec_load`,
:func:`history_load`, :data:`HISTORY_SQL`, :class:`History`, :class:`HistoryRow`.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from capabilities.registry import ContextBlock
from llm.health import RedisEntryHealth
from llm.router import Router
from sessions import runs
from sessions.events import async_redis, event_publish, event_publish_nowait, pipelined_command
from sessions.runner import database
from sessions.runner.cancellation import raise_if_cancelling, watch_for_cancel
from sessions.runner.ports import Publish, RunPorts
from sessions.runner.run_context import run_context_open
from sessions.runner.spec import RunSpec
from sessions.runner.subrun import subrun_tool_for
from sessions.runner.threads import db
from sessions.runner.titles import title_after_first_exchange
from sessions.runner.toolset import Toolset, toolset_open
from sessions.runner.tracing import model_observed
from sessions.tool_store import SESSION_TOOL_STORE

__all__ = [
    "HISTORY_SQL", "DatabaseRunStore", "History", "HistoryRow", "entry_health", "history_load", "production_ports",
    "run_spec_load",
]

run_spec_load = database._spec
"""``run_spec_load(claimed: sessions.runs.ClaimedRun) -> RunSpec``: a just-claimed run's
configuration (agent, limits, route entries, binding specs), five statements in one round trip.
ORM connection: call it on a database thread (or in a sync test). Raises ValueError for an
unusable configuration (a route without entries, a provider outside the tenant)."""

HISTORY_SQL = database._HISTORY_SQL
"""The history statement of a user's run (``{after_cursor}`` to format: "" or the compaction
cursor's condition); parameters ``tenant_id``, ``session_id``, ``run_id``."""

history_load = database.history_load
"""``await history_load(run_id, *, session_id=None, subrun=None)``: the conversation up to
and including the run (the store's ``history``; see :func:`sessions.runner.database.history_load`)."""

History = database.History
HistoryRow = database.HistoryRow


async def _claim(run_id: int) -> RunSpec:
    return await runs.run_claim(run_id, load=database._spec)


async def _session_of(run_id: int) -> int:
    return await db(lambda: database.Run.objects.get(pk=run_id).session_id)()


async def _finish(run_id: int, outcome: Any, *, publish: Publish, spec: RunSpec | None) -> Any:
    return await runs.run_finish(run_id, outcome, publish=publish, spec=spec)


async def _after_completed(spec: RunSpec) -> None:
    await title_after_first_exchange(spec)  # a chat's first answer: its title from the model (a task)


class DatabaseRunStore:
    """:class:`~sessions.runner.ports.RunStore` on PostgreSQL (see the module docstring).
    Stateless; one instance serves every run of the process."""

    tenant_of = staticmethod(database.run_tenant_id)
    claim = staticmethod(_claim)
    session_of = staticmethod(_session_of)
    heartbeat = staticmethod(runs.run_heartbeat)
    pause = staticmethod(runs.run_pause)
    finish = staticmethod(_finish)
    after_completed = staticmethod(_after_completed)

    history = staticmethod(database.history_load)
    pending_tool_calls = staticmethod(db(database.pending_tool_calls))
    approvals_for_calls = staticmethod(db(database.approvals_for_calls))
    steer_absorb = staticmethod(db(runs.steer_absorb))  # each absorbed run: run_running
    usage = staticmethod(database.run_usage)
    tenant_month_cost_usd_micros = staticmethod(database.tenant_month_cost_usd_micros)
    has_artifacts = staticmethod(database.session_has_artifacts)
    images_load = staticmethod(database.images_load)
    run_context_load = staticmethod(db(database.run_context_load))
    run_context_save = staticmethod(db(database.run_context_save))
    tool_results = staticmethod(db(database.tool_results))
    attributions_save = staticmethod(db(database.attributions_save))
    route_choice_save = staticmethod(database.route_choice_save)
    structured_save = staticmethod(db(database.structured_save))

    assistant_message_save = staticmethod(runs.assistant_message_save)
    llm_call_record = staticmethod(runs.llm_call_record)
    tool_call_start = staticmethod(runs.tool_call_start)  # publishes tool_call_started
    tool_call_finish = staticmethod(runs.tool_call_finish)  # publishes tool_call_succeeded / _failed
    approval_request = staticmethod(db(runs.approval_request))
    compaction_begin = staticmethod(runs.compaction_begin)  # publishes compaction_running
    compaction_save = staticmethod(runs.compaction_save)  # publishes compaction_completed

    subrun_open = staticmethod(runs.subrun_open)  # publishes run_running
    subrun_spec = staticmethod(db(database.subrun_spec))
    subrun_pause = staticmethod(runs.subrun_pause)  # publishes run_awaiting_approval
    subrun_finish = staticmethod(runs.subrun_finish)  # publishes the end event
    session_handoff = staticmethod(runs.session_handoff)  # publishes agent_handoff


class RedisPublisher:
    """The run's :class:`~sessions.runner.ports.Publisher`: each event appended to the
    session's Redis stream (:func:`sessions.events.event_publish`); after it, a pending cancel
    of the run's task is raised (redis-py may swallow one). :meth:`nowait`: queued on the
    loop's publishing connection without waiting for the reply
    (:func:`sessions.events.event_publish_nowait`, the streamed text's path: nothing more)."""

    __slots__ = ("session_id", "run_id", "streamed")

    def __init__(self, session_id: int, run_id: int) -> None:
        self.session_id, self.run_id = session_id, run_id
        self.streamed: list[str] | None = None

    async def __call__(self, event_type: str, data: dict[str, Any]) -> None:
        await event_publish(session_id=self.session_id, run_id=self.run_id, type=event_type, data=data)
        raise_if_cancelling()  # redis-py may swallow a cancel of the run's loop task

    def nowait(self, event_type: str, data: dict[str, Any]) -> asyncio.Future[Any]:
        return event_publish_nowait(session_id=self.session_id, run_id=self.run_id, type=event_type, data=data)


redis_publisher = RedisPublisher
"""The production :data:`~sessions.runner.ports.PublisherFactory`: ``redis_publisher(session_id, run_id)``."""


def entry_health() -> RedisEntryHealth:
    """Route-entry health shared by every worker (cooldowns, circuit breaker) in Redis, its
    scripts pipelined on the loop's publishing connection (``pipelined_command``)."""
    from django.conf import settings

    return RedisEntryHealth(async_redis(), prefix=f"{settings.REDIS_KEY_PREFIX}:health", execute=pipelined_command)


def router_model(spec: RunSpec, record: Any, publish: Publish) -> Router:
    """The run's model: the fallback router over its route entries, its attempts observed
    (metrics; ``chat`` spans while tracing: :func:`sessions.runner.tracing.model_observed`),
    capturing each attempt's bodies when the tenant records them (``spec.record_llm_bodies``)."""
    return model_observed(spec, record, lambda observed: Router(spec.entries, record=observed, health=entry_health(),
                                                                on_event=publish,
                                                                capture_bodies=spec.record_llm_bodies))


async def capability_toolsets(
    spec: RunSpec, stack: contextlib.AsyncExitStack, publish: Publish,
) -> tuple[Toolset, tuple[ContextBlock, ...]]:
    """The run's tools from its bindings' capability kinds (closed with ``stack``) and its start
    context (read and stored through the production store)."""
    toolset = await toolset_open(spec, stack, publish=publish, skill_tool=subrun_tool_for)
    return toolset, await run_context_open(spec, toolset.context, store=_STORE)


_STORE = DatabaseRunStore()
_PORTS: RunPorts | None = None


def production_ports() -> RunPorts:
    """The ports a worker runs runs with (one instance per process; every adapter is stateless
    or keeps its per-loop state itself)."""
    global _PORTS
    if _PORTS is None:
        _PORTS = RunPorts(store=_STORE, publisher=redis_publisher, model=router_model,
                          toolsets=capability_toolsets, cancel_watch=watch_for_cancel, tool_store=SESSION_TOOL_STORE)
    return _PORTS
