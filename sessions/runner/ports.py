"""The runner's ports: what :func:`sessions.runner.loop.execute_run` is given to run a run.

The loop and the turn's steps (:mod:`sessions.runner.turn`, :mod:`sessions.runner.tool_execution`,
:mod:`sessions.runner.compaction`) are orchestration: every read and write of the run's rows
goes through a :class:`RunStore`, every event through a publisher, every model turn through a
model, and the run's tools come from a toolset opener. :class:`RunPorts` bundles them.

Production adapters (PostgreSQL through :mod:`sessions.runs` and the runner's own reads,
Redis streams, the fallback router, the capability kinds) are built in one place,
:func:`sessions.runner.adapters.production_ports`; tests give in-memory fakes
(``sessions/tests/test_loop_ports.py``). A skill's sub-run, run inside one of its parent's tool
calls, goes through its parent's ports (:func:`run_ports_current`), with a publisher of its own
wrapped around the parent's ports' publisher (:func:`sessions.runner.subrun.subrun_publishers`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, TypeAlias, TypedDict

if TYPE_CHECKING:
    from capabilities.registry import ContextBlock
    from capabilities.tools import SessionStore
    from llm.records import AttemptRecord, RecordCallback
    from llm.types import ChatMessage, Completion, StreamEvent, ToolSpec
    from sessions.runner.database import ApprovalState, CompactionCursor, History, Usage
    from sessions.runner.spec import RunSpec
    from sessions.runner.toolset import Toolset
    from sessions.runs import RunEnding, SubRunState

JSONValue: TypeAlias = "dict[str, JSONValue] | list[JSONValue] | str | int | float | bool | None"
"""A JSON value, as ``json.loads`` returns it (a tool call's parsed arguments, a result's data)."""

Publish = Callable[[str, dict[str, Any]], Awaitable[object]]
"""``publish(event_type, data)``: one event on the run's session stream (what the run store's
writes and the router are given: they only call it). The loop's own publisher is a
:class:`Publisher`."""


class Publisher(Protocol):
    """A run's events (:data:`Publish`, called), with what the loop needs beyond calling it.

    Production: :class:`sessions.runner.adapters.RedisPublisher`; a skill's sub-run wraps its
    parent's ports' one (:class:`sessions.runner.subrun.SubrunPublisher`); tests use
    :class:`CallbackPublisher` over a function that records.
    """

    streamed: list[str] | None
    """The current model turn's text as it streamed (:func:`sessions.runner.streaming.stream_model_turn`
    keeps it; a run stopped mid-answer keeps it as its reply), or None: not kept."""

    async def __call__(self, event_type: str, data: dict[str, Any]) -> object:
        """Publish one event and wait until it is stored (raises the store's error)."""

    def nowait(self, event_type: str, data: dict[str, Any]) -> Awaitable[object]:
        """Queue one event without waiting: it goes out before any event queued or published
        after this call (:class:`sessions.runner.streaming.StreamedTextBatcher`); the
        awaitable gives its result or error."""


class CallbackPublisher:
    """A :class:`Publisher` over an async ``publish(event_type, data)`` function (tests' fakes
    that record). :meth:`nowait` starts the publish as a task: tasks start in the order they
    are made, so events keep the order of the calls if ``publish`` records (or queues) its
    event before it first suspends."""

    __slots__ = ("_publish", "streamed")

    def __init__(self, publish: Publish) -> None:
        self._publish = publish
        self.streamed: list[str] | None = None

    def __call__(self, event_type: str, data: dict[str, Any]) -> Awaitable[object]:
        return self._publish(event_type, data)

    def nowait(self, event_type: str, data: dict[str, Any]) -> Awaitable[object]:
        return asyncio.ensure_future(self._publish(event_type, data))


class ArtifactImage(NamedTuple):
    """An artifact a user message references as an image (:meth:`RunStore.images_load`)."""

    artifact_id: int
    mime_type: str
    size_bytes: int
    content: bytes | None
    """The bytes, or None: not an image type models take, or larger than the limit asked for."""


class PendingCall(TypedDict):
    """A tool call of the run as the loop executes it (a model turn's, or one left without a result)."""

    pk: int
    call_id: str
    """The model's id of the call."""
    name: str
    """The exposed tool name."""
    arguments_raw: str
    """The arguments as the model wrote them (JSON text, maybe invalid)."""


class RunFinish(Protocol):
    """What :meth:`RunStore.finish` returns (production: :class:`sessions.runs.RunFinished`)."""

    @property
    def ended(self) -> bool:
        """False: the run had already ended; nothing was written."""


class RunStore(Protocol):
    """The run's reads and writes, as the loop needs them. Every method runs under the run's
    tenant scope (set by ``execute_run``). Production: :class:`sessions.runner.adapters.DatabaseRunStore`.

    Every write clients see publishes its own event through the ``publish`` it is given, after
    the write committed (:mod:`sessions.runs`); callers never publish those events themselves.
    An in-memory store (``sessions/tests/fakes.py``) publishes the same events in the same order.
    """

    async def tenant_of(self, run_id: int) -> int | None:
        """The run's tenant (None: no such run)."""

    async def claim(self, run_id: int) -> RunSpec:
        """Mark the run running (publishes ``run_running``) and load its configuration.

        Raises:
            sessions.runs.RunNotClaimable: not the worker's to run (ended, held by another).
            ValueError: its configuration is unusable (the run then fails ``configuration``).
        """

    async def session_of(self, run_id: int) -> int:
        """The run's session (for a run that failed before its configuration loaded)."""

    async def heartbeat(self, run_id: int, attempt: int) -> bool:
        """Beat for ``attempt``; False if another worker took the run over."""

    async def pause(self, run_id: int, *, publish: Publish) -> bool:
        """The run waits for a human (``Paused``); False: every approval was decided meanwhile
        and the run is queued again."""

    async def finish(self, run_id: int, outcome: RunEnding, *, publish: Publish, spec: RunSpec | None) -> RunFinish:
        """End the run with ``outcome``; the result's ``ended`` says whether it did."""

    async def after_completed(self, spec: RunSpec) -> None:
        """Work after a completed run's end (a chat's title from its first exchange)."""

    # Per turn: reads.
    async def history(self, run_id: int, *, session_id: int, subrun: bool,
                      compaction: CompactionCursor | None = ...) -> History:
        """The conversation a model turn is built from (``messages``, ``tail``, ``summary``,
        ``rows``, ``compaction``). ``compaction``: the session's compaction cursor if the caller
        knows it (None: none), else read with the history."""

    async def pending_tool_calls(self, *, run_id: int, call_ids: list[str]) -> list[PendingCall]:
        """Of ``call_ids``, the run's calls without a result."""

    async def approvals_for_calls(self, *, call_pks: list[int]) -> dict[int, ApprovalState]:
        """``{call pk: ApprovalState}`` of the calls that have an approval."""

    async def steer_absorb(self, run_id: int) -> list[int]:
        """Queued steer messages join the run; the runs absorbed."""

    async def usage(self, run_id: int) -> Usage:
        """Tokens and cost used so far (``tokens``, ``cost_usd_micros``)."""

    async def tenant_month_cost_usd_micros(self, tenant_id: int) -> int:
        """The tenant's model cost this calendar month."""

    async def has_artifacts(self, session_id: int) -> bool:
        """Whether the session has artifacts (``read_artifact`` is then offered)."""

    async def images_load(self, *, session_id: int, artifact_ids: list[int], max_bytes: int) -> list[ArtifactImage]:
        """The session's artifacts among ``artifact_ids`` (another session's are not found), each
        with its bytes only if it is an image models take (:data:`llm.types.IMAGE_MIME_TYPES`) of
        at most ``max_bytes`` (:mod:`sessions.runner.images`)."""

    # The run's start context and attributions (:mod:`sessions.runner.run_context`).
    async def run_context_load(self, run_id: int) -> tuple[list[JSONValue] | None, str]:
        """``(the stored start context: JSON blocks, None if none was stored yet; the run's input)``."""

    async def run_context_save(self, run_id: int, blocks: list[dict[str, Any]]) -> None:
        """Store the run's start context (JSON blocks) unless an earlier attempt did."""

    async def tool_results(self, run_id: int) -> list[tuple[str, JSONValue]]:
        """``[(exposed name, result data)]`` of the run's succeeded calls with data, oldest first."""

    async def attributions_save(self, run_id: int, attributions: list[dict[str, Any]]) -> None:
        """Store the attributions of the run's answer (before the run ends)."""

    # Routing rules and structured output (:mod:`sessions.runner.routing`, :mod:`sessions.runner.structured_output`).
    async def route_choice_save(self, run_id: int, *, turn: int, rule: str, route: str) -> None:
        """Record that routing rule ``rule`` ("" : none) chose route ``route`` from turn ``turn`` on."""

    async def structured_save(self, run_id: int, value: JSONValue) -> None:
        """Store a completed run's parsed JSON answer (before the run ends)."""

    # Per turn: writes.
    async def assistant_message_save(
        self, *, spec: RunSpec, turn: int, message: ChatMessage, reasoning: str = "",
        llm_call: AttemptRecord | None = None,
    ) -> list[PendingCall]:
        """Persist a model turn's answer; returns its tool calls."""

    async def llm_call_record(self, *, spec: RunSpec, turn: int, record: AttemptRecord, purpose: str = "turn") -> None:
        """Record one model attempt that did not answer the turn (or whose answer was not saved),
        or one of a compaction's (``purpose="compaction"``); ``purpose``: an
        ``llm.metering.LLMCallPurpose`` value."""

    async def tool_call_start(self, *, pk: int, name: str, arguments: JSONValue, publish: Publish) -> None:
        """The call starts running; then publishes ``tool_call_started`` (before the tool runs)."""

    async def tool_call_finish(
        self, *, spec: RunSpec, pk: int, name: str, status: str, content: str, data: JSONValue, error: str,
        duration_ms: int, publish: Publish, model_content: str | None = None,
    ) -> bool:
        """The call's result; then publishes ``tool_call_succeeded`` / ``tool_call_failed``.
        False if it already had one (nothing is written or published then)."""

    async def approval_request(
        self, *, spec: RunSpec, call_pk: int, kind: str, tool_name: str, arguments: JSONValue, reason: str = "",
        question: str = "", elicitation: JSONValue = None, rule: Mapping[str, Any] | None = None,
    ) -> int:
        """The call waits for a human: an Approval; its id. Publishes nothing (the run's
        ``pause`` announces its pending approvals). ``elicitation``: kind ``elicitation``'s
        ``{"request": ...}`` (a call whose server asks again gets its approval back, pending).
        ``rule``: the approval rule that asked, whose approvers, timeout and ``on_timeout`` the
        Approval keeps (:func:`sessions.runs.records.approval_terms`)."""

    async def compaction_begin(self, *, attempt: int, tokens_before: int, messages: int, publish: Publish) -> None:
        """A compaction attempt starts: publishes ``compaction_running`` (no row yet)."""

    async def compaction_save(self, *, spec: RunSpec, attempt: int, status: str, publish: Publish, summary: str = "",
                              cursor_message_id: int | None = None, messages_summarized: int = 0,
                              tokens_before: int = 0, tokens_after: int = 0, error: str = "") -> int:
        """One compaction attempt's row; then publishes ``compaction_completed``. Its id."""

    # Sub-runs (a skill's tool call runs one, through its parent run's store).
    async def subrun_open(self, *, parent: RunSpec, call_pk: int, skill_id: int | None, skill_name: str, task: str,
                          publisher: Callable[[int], Publish], agent_version_id: int | None = None) -> SubRunState:
        """The sub-run answering skill (or sub-agent: ``agent_version_id``) call ``call_pk``:
        created (``running``) or resumed, then publishes ``run_running`` through
        ``publisher(run_id)``; an ended one as it is, with no event."""

    async def subrun_spec(self, *, subrun_id: int, parent: RunSpec) -> RunSpec:
        """The sub-run's configuration. Raises ValueError when it is unusable (the skill is gone)."""

    async def subrun_pause(self, *, run_id: int, attempt: int, call_pk: int, publish: Publish) -> bool:
        """The sub-run waits for a human (publishes ``run_awaiting_approval``); False if refused."""

    async def subrun_finish(self, run_id: int, ending: RunEnding, *, publish: Publish,
                            attempt: int | None = None) -> bool:
        """End the sub-run (publishes its end event); False if refused (ended, or a later attempt holds it)."""

    async def session_handoff(self, *, spec: RunSpec, agent_id: int, reply: str, publish: Publish) -> bool:
        """A handoff from the user's run ``spec``: the chat's agent becomes ``agent_id``, ``reply``
        its answer; publishes ``agent_handoff``. False if the chat has that agent already."""


class Model(Protocol):
    """A model route as the loop uses it (production: :class:`llm.router.Router`)."""

    def stream(self, messages: list[ChatMessage], tools: list[ToolSpec], *,
               compact_first: bool = False, tool_choice: str = "auto") -> AsyncIterator[StreamEvent]:
        """Text/reasoning deltas, then one :class:`~llm.types.Completion`; raises the
        :mod:`llm.errors` errors the turn maps to failure reasons. ``tool_choice``
        (:attr:`llm.model.ModelSettings.tool_choice`) is passed only when it is not ``"auto"``
        (a run's forced first call, :func:`sessions.runner.turn.turn_tool_choice`)."""

    async def complete(self, messages: list[ChatMessage], tools: list[ToolSpec], *,
                       max_output_tokens: int | None = None) -> Completion:
        """One whole answer (the compaction summarizer)."""


PublisherFactory = Callable[[int, int], Publisher]
"""``publisher(session_id, run_id)``: the run's :class:`Publisher` (a new one per call)."""

ModelFactory = Callable[["RunSpec", "RecordCallback", Publish], Model]
"""``model(spec, record, publish)``: the run's model route; ``record(attempt)`` is awaited with
each attempt's :class:`~llm.records.AttemptRecord`, ``publish`` carries its events (``model_fallback``)."""

ToolsetOpener = Callable[["RunSpec", contextlib.AsyncExitStack, Publish],
                         Awaitable[tuple["Toolset", tuple["ContextBlock", ...]]]]
"""``open(spec, stack, publish)``: the run's tools (closed with ``stack``) and its start context."""

CancelWatch = Callable[[int], Awaitable[None]]
"""``watch(run_id)``: returns when a cancel of the run is requested (never, if none is)."""


@dataclass(frozen=True, slots=True)
class RunPorts:
    """Everything :func:`~sessions.runner.loop.execute_run` needs from outside the loop."""

    store: RunStore
    publisher: PublisherFactory
    model: ModelFactory
    toolsets: ToolsetOpener
    cancel_watch: CancelWatch
    tool_store: SessionStore | None = None
    """The session data tools may touch (artifacts, todos), given to each tool call as
    ``ToolContext.store`` (production: :data:`sessions.tool_store.SESSION_TOOL_STORE`; None:
    tools that need it fail ``unavailable``, and a result too large for the model fails the run)."""


_RUN_PORTS: ContextVar[RunPorts | None] = ContextVar("run_ports", default=None)


@contextlib.contextmanager
def run_ports_entered(ports: RunPorts) -> Iterator[None]:
    """Within the block (a run's loop, :func:`sessions.runner.loop._run_loop`), and in every task
    started from it (its tool calls), :func:`run_ports_current` is ``ports``: a skill's
    sub-run, run inside its parent's tool call, goes through its parent's ports."""
    token = _RUN_PORTS.set(ports)
    try:
        yield
    finally:
        _RUN_PORTS.reset(token)


def run_ports_current() -> RunPorts | None:
    """The ports of the run whose loop this task belongs to; None outside a run's loop."""
    return _RUN_PORTS.get()
