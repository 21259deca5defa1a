"""The a2a-sdk ``RequestHandler`` of the platform's agents: every A2A operation over runs.

The SDK's transports (JSON-RPC and HTTP+JSON, :mod:`.app`) parse and validate each request,
check ``A2A-Version`` and turn the errors raised here into the spec's codes; this handler does
the work, over the same services as the chat app and the OpenAI-compatible API:

- ``SendMessage`` / ``SendStreamingMessage``: a message without ``taskId`` starts a run of the
  URL's agent (a new chat, or with ``contextId`` the next message of that chat of the caller's),
  counted against the ``messages`` and ``runs`` throttles like a message posted in the app. A
  message *with* ``taskId`` answers that task's pending approval (it must be input-required). The
  blocking form answers once the run ends or pauses (``returnImmediately``: at once, submitted);
  the streaming one sends the task, then status updates and the reply as chunks of the ``reply``
  artifact, until the run ends or pauses.
- ``GetTask``, ``ListTasks``: :class:`.tasks.RunTaskStore`.
- ``CancelTask``: :func:`sessions.runs.run_cancel` (a running run stops within about a second:
  the answer waits up to :data:`CANCEL_WAIT_SECONDS` for it); a terminal task is
  ``TaskNotCancelableError``.
- ``SubscribeToTask``: the task, then its updates as for a stream; a terminal task is
  ``UnsupportedOperationError`` (as the SDK's own handler answers).
- Push-notification configs (create, get, list, delete; and ``SendMessage``'s
  ``configuration.taskPushNotificationConfig``): :mod:`.push` (stored per task, URL
  address-checked; the notifications are sent by automations' deliveries on the run's end
  and pause).
- ``GetExtendedAgentCard``: :func:`.cards.extended_agent_card` for a caller of the agent's
  tenant (the app authenticates every call): the public card plus the agent's tools as skills,
  its published version and limits.

The events are read through :class:`sessions.event_reader.SessionEventReader` (the one reader
of a session's events), on one of the caller's stream slots: an open A2A answer counts like an
open event stream. Why not the SDK's ``DefaultRequestHandler`` with an ``AgentExecutor``: it
keeps each task's live state in the web process that started it (``ActiveTaskRegistry``) and
makes task ids before anything runs, whereas a run executes on a Celery worker, its id is made
by the database, and any web process must answer for any task.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from a2a.server.context import ServerCallContext
from a2a.server.request_handlers import RequestHandler, validate_request_params
from a2a.types.a2a_pb2 import (
    AgentCard,
    CancelTaskRequest,
    DeleteTaskPushNotificationConfigRequest,
    GetExtendedAgentCardRequest,
    GetTaskPushNotificationConfigRequest,
    GetTaskRequest,
    ListTaskPushNotificationConfigsRequest,
    ListTaskPushNotificationConfigsResponse,
    ListTasksRequest,
    ListTasksResponse,
    Message,
    Role,
    SendMessageRequest,
    SubscribeToTaskRequest,
    Task,
    TaskArtifactUpdateEvent,
    TaskPushNotificationConfig,
    TaskState,
    TaskStatus,
    TaskStatusUpdateEvent,
)
from a2a.utils.errors import (
    ContentTypeNotSupportedError,
    InternalError,
    InvalidParamsError,
    TaskNotCancelableError,
    TaskNotFoundError,
    UnsupportedOperationError,
)
from a2a.utils.task import apply_history_length, validate_history_length
from channels.db import database_sync_to_async
from django.contrib.auth import get_user_model
from django.db import transaction
from google.protobuf.json_format import MessageToDict

from agent_platform.api_errors import ApplicationError
from agent_platform.redis_clients import async_redis
from agents.models import AgentInstance, CapabilityBinding
from agents.versions import VersionError, run_pin
from sessions import stream_guard
from sessions.api.a2a.cards import CardTool, agent_card, extended_agent_card
from sessions.api.a2a.push import (
    RunPushConfigStore,
    push_config_save,
)
from sessions.api.a2a.tasks import (
    TERMINAL_STATES,
    A2ACaller,
    PlatformRefusal,
    RunTaskStore,
    caller_of,
    caller_runs,
    file_artifact,
    refusal_record,
    reply_artifact,
    run_id_of,
    task_get_sync,
    task_of_run,
)
from sessions.api.agent_runs import run_start_gate
from sessions.event_reader import Closed, Event, SessionEventReader
from sessions.events import session_keys
from sessions.models import Approval, ApprovalKind, ApprovalStatus, Run, RunStatus
from sessions.runs.approvals import approval_decide
from sessions.runs.transitions import unattended_runs
from sessions.selectors import chat_session_get_for_user
from sessions.services import chat_from_conversation, message_post, run_cancel
from sessions.stream_guard import StreamCredential
from tenants.scoping import tenant_scope
from tenants.throttling import throttle_wait

THROTTLE_SCOPES = ("messages", "runs")
"""The budgets a new A2A message spends (those of posting a message in the app)."""
CANCEL_WAIT_SECONDS = 5.0
"""How long ``CancelTask`` waits for a running run's worker to record the cancellation."""
RUN_END_TYPES = frozenset({"run_completed", "run_failed", "run_cancelled"})
PAUSE_TYPE = "run_awaiting_approval"
MAX_MESSAGE_PARTS = 64
"""Most parts one message may have."""


def _message_text(message: Message) -> str:
    """The run's input from an A2A message: its text parts, and its data parts as JSON, joined
    by blank lines. Raises ContentTypeNotSupportedError for a file part (by URL or bytes),
    InvalidParamsError for a message that is not the user's, has no text or too many parts."""
    if message.role != Role.ROLE_USER:
        raise InvalidParamsError(message="message.role: the caller's messages are ROLE_USER.")
    if len(message.parts) > MAX_MESSAGE_PARTS:
        raise InvalidParamsError(message=f"A message has at most {MAX_MESSAGE_PARTS} parts.")
    texts = []
    for index, part in enumerate(message.parts):
        kind = part.WhichOneof("content")
        if kind == "text":
            texts.append(part.text)
        elif kind == "data":
            texts.append(json.dumps(MessageToDict(part.data)))
        else:
            raise ContentTypeNotSupportedError(
                message=f"message.parts[{index}]: only text and data parts are accepted, not files.")
    text = "\n\n".join(t for t in texts if t.strip())
    if not text.strip():
        raise InvalidParamsError(message="The message has no text.")
    return text


def _start_sync(caller: A2ACaller, context_id: str, text: str, push: TaskPushNotificationConfig | None = None) -> Run:
    """A run of the caller's agent answering ``text``: the next message of the chat
    ``context_id`` (the caller's, with this agent), or of a new chat; with ``push``, that
    push-notification config stored for it in the same transaction (before any worker sees the
    run, so no state change goes unnotified).

    Raises:
        InvalidParamsError: no such chat of the caller's with this agent; a message the chat
            refuses (empty, too long); a bad ``push`` config (then no run starts).
        PlatformRefusal: 429 over the ``messages``/``runs`` throttles (``Retry-After``).
    """
    with transaction.atomic(), unattended_runs():  # nobody watches an A2A task's run
        run = _start_run(caller, context_id, text)
        if push is not None:
            with tenant_scope(caller.tenant_id):
                push_config_save(run=run, config=push, base_url=caller.base_url)
        return run


def _task_as_started(caller: A2ACaller, run: Run) -> Task:
    """The task of ``run`` as :func:`_start_sync` created it (``TASK_STATE_SUBMITTED``)."""
    with tenant_scope(caller.tenant_id):
        return task_of_run(run, caller)


def _start_run(caller: A2ACaller, context_id: str, text: str) -> Run:
    """:func:`_start_sync`'s run."""
    with tenant_scope(caller.tenant_id):
        agent = AgentInstance.objects.filter(pk=caller.agent_id, is_active=True).first()
        if agent is None:
            raise TaskNotFoundError(message="This agent is no longer active.")
        session = None
        if context_id:
            session = (chat_session_get_for_user(session_id=int(context_id), user_id=caller.user_id)
                       if context_id.isdigit() and len(context_id) <= 18 else None)
            if session is None or session.agent_id != agent.pk:
                raise InvalidParamsError(message=f"No conversation {context_id!r} with this agent is yours.")
        wait = throttle_wait(scopes=THROTTLE_SCOPES, user_id=caller.user_id, tenant_id=caller.tenant_id)
        if wait is not None:
            raise PlatformRefusal(429, "Too many requests; try again later.", retry_after=max(1, int(wait + 0.999)))
        user = get_user_model().objects.get(pk=caller.user_id)
        try:
            with run_pin(number=caller.version):  # /a2a/<slug>@<n>/: that version; else the published one
                if session is None:
                    return chat_from_conversation(user=user, agent=agent, history=[], content=text)
                return message_post(session=session, user=user, content=text)
        except ApplicationError as exc:
            raise InvalidParamsError(message=exc.message) from exc
        except VersionError as exc:  # the pinned version was deleted since the URL was checked
            raise InvalidParamsError(message=str(exc)) from exc


def _decision(approval: Approval, text: str) -> dict[str, str]:
    """``approval_decide``'s arguments from the caller's answer: a question's answer is the
    text; a tool call's is ``approve``, or ``deny`` with an optional reason after it."""
    if approval.kind == ApprovalKind.QUESTION:
        return {"answer": text}
    word, _, rest = text.strip().partition(" ")
    word = word.lower().rstrip(".!:,")
    if word in ("approve", "approved", "yes"):
        return {"decision": "approve"}
    if word in ("deny", "denied", "no"):
        return {"decision": "deny", "reason": rest.strip()}
    raise InvalidParamsError(message=f"Approval {approval.pk} is for a tool call: answer `approve` or "
                                     "`deny <reason>`.")


def _answer_sync(caller: A2ACaller, task_id: str, context_id: str, text: str,
                 push: TaskPushNotificationConfig | None = None) -> Run:
    """Decide the first pending approval of the caller's input-required task with ``text``
    (with ``push``: that push-notification config stored for the task first, in the same
    transaction).

    Raises:
        TaskNotFoundError: not the caller's task.
        InvalidParamsError: ``contextId`` is not the task's; the answer does not fit the approval
            or was refused (decided or expired meanwhile).
        UnsupportedOperationError: the task is not waiting for input.
    """
    run_id = run_id_of(task_id)
    with tenant_scope(caller.tenant_id), transaction.atomic():
        run = None if run_id is None else caller_runs(caller).filter(pk=run_id).first()
        if run is None:
            raise TaskNotFoundError(message=f"Task {task_id} not found.")
        if context_id and context_id != str(run.session_id):
            raise InvalidParamsError(message=f"Context {context_id} is not the context of task {task_id}.")
        approval = Approval.objects.filter(run=run, status=ApprovalStatus.PENDING).order_by("id").first()
        if run.status != RunStatus.AWAITING_APPROVAL or approval is None:
            raise UnsupportedOperationError(
                message=f"Task {task_id} is not waiting for input (it is {run.status}); send a new message with "
                        "its contextId to continue the conversation.")
        user = get_user_model().objects.get(pk=caller.user_id)
        decision = _decision(approval, text)
        if push is not None:
            push_config_save(run=run, config=push, base_url=caller.base_url)
        try:
            approval_decide(approval=approval, user=user, **decision)
        except ApplicationError as exc:
            raise InvalidParamsError(message=exc.message) from exc
        run.refresh_from_db()
        return run


def _cancel_sync(caller: A2ACaller, task_id: str) -> str:
    """Cancel the caller's task; its run's status after the call. Raises TaskNotFoundError,
    TaskNotCancelableError (already ended)."""
    run_id = run_id_of(task_id)
    with tenant_scope(caller.tenant_id):
        run = None if run_id is None else caller_runs(caller).filter(pk=run_id).first()
        if run is None:
            raise TaskNotFoundError(message=f"Task {task_id} not found.")
        try:
            return run_cancel(run=run).status
        except ApplicationError as exc:
            raise TaskNotCancelableError(message=f"Task {task_id} has already ended.") from exc


def _card_tool(binding: CapabilityBinding) -> CardTool:
    from capabilities.registry import kind_get

    kind = kind_get(binding.kind)
    name = (binding.mcp_server.name if binding.mcp_server_id else binding.cli_command.name if binding.cli_command_id
            else binding.skill.name if binding.skill_id else binding.builtin_name or binding.kind)
    policy = binding.approval_policy if isinstance(binding.approval_policy, list) else []
    return CardTool(key=f"{binding.kind}-{binding.pk}", name=name, kind_label=kind.label if kind else binding.kind,
                    tools=[t for t in binding.allowed_tools if isinstance(t, str)],
                    asks_approval=any(isinstance(r, dict) and r.get("action") == "ask" for r in policy))


def _limits(agent: AgentInstance) -> list[str]:
    limits = [f"at most {agent.max_loop_count} model turns", f"{agent.run_timeout_seconds:g} s of work"]
    if agent.max_tokens_per_run:
        limits.append(f"{agent.max_tokens_per_run} tokens")
    if agent.max_cost_per_run_usd is not None:
        limits.append(f"USD {agent.max_cost_per_run_usd.normalize():f}")
    return [f"{limit} per task" for limit in limits]


def _extended_card_sync(caller: A2ACaller) -> AgentCard | None:
    """The extended card of the caller's agent (:func:`.cards.extended_agent_card`: its enabled
    bindings as skills, the number of the version the URL pins or else of the published one, its
    limits); None when it is no longer active."""
    with tenant_scope(caller.tenant_id):
        agent = (AgentInstance.objects.select_related("tenant", "published_version")
                 .filter(pk=caller.agent_id, is_active=True).first())
        if agent is None:
            return None
        bindings = list(CapabilityBinding.objects.filter(agent=agent, enabled=True)
                        .select_related("mcp_server", "cli_command", "skill").order_by("id"))
    card = agent_card(base_url=caller.base_url, slug=caller.agent_slug, name=agent.name,
                      description=agent.description, tenant_name=agent.tenant.name)
    version = caller.version or (agent.published_version.number if agent.published_version_id else None)
    return extended_agent_card(card, version=version, tools=[_card_tool(b) for b in bindings], limits=_limits(agent))


def _run_status_sync(caller: A2ACaller, run_id: int) -> str | None:
    with tenant_scope(caller.tenant_id):
        return Run.objects.filter(pk=run_id).values_list("status", flat=True).first()


async def _session_seq(session_id: int) -> int:
    """The ``seq`` of the session's last event so far (0 for none)."""
    raw = await async_redis().get(session_keys(session_id)[0])
    return int(raw or 0)


async def _slot(context: ServerCallContext) -> str:
    """One of the caller's stream slots, for an answer that waits for or streams a run.

    Raises:
        PlatformRefusal: 429 (recorded for the app) when the caller holds them all.
    """
    caller = caller_of(context)
    slot = await stream_guard.stream_slot_acquire(user_id=caller.user_id)
    if slot is None:
        refusal = PlatformRefusal(
            429, f"Too many open answers (at most {stream_guard.streams_per_user_max()} per user).", retry_after=15)
        refusal_record(context, refusal)
        raise refusal
    return slot


def _reader(caller: A2ACaller, session_id: int, slot: str) -> SessionEventReader:
    """The session's event reader on ``slot`` (freed by its ``close()``)."""
    credential = StreamCredential(user_id=caller.user_id, membership_id=caller.membership_id,
                                  token_id=caller.token_id)
    return SessionEventReader(session_id=session_id, after_seq=0, credential=credential, slot=slot)


def _status_event(task: Task, state: int, *, message: Message | None = None) -> TaskStatusUpdateEvent:
    status = TaskStatus(state=state)
    status.timestamp.GetCurrentTime()
    if message is not None:
        status.message.CopyFrom(message)
    return TaskStatusUpdateEvent(task_id=task.id, context_id=task.context_id, status=status)


@dataclass(slots=True)
class _RunWatch:
    """One run followed through its session's frames: turns them into A2A events."""

    caller: A2ACaller
    task: Task
    """The task as it stood when the watch began."""
    paused_before: int = 0
    """Pauses at or before this ``seq`` are history (the run has resumed since)."""
    streamed: list[str] = field(default_factory=list)
    """The reply's text so far."""

    @property
    def run_id(self) -> int:
        return int(self.task.id)

    def chunk(self, text: str) -> TaskArtifactUpdateEvent:
        event = TaskArtifactUpdateEvent(task_id=self.task.id, context_id=self.task.context_id,
                                        artifact=reply_artifact(text), append=bool(self.streamed))
        self.streamed.append(text)
        return event

    def last_chunk(self, reply: str) -> TaskArtifactUpdateEvent:
        """The reply artifact's last chunk: empty when the chunks already make the reply, else
        the whole reply replacing them."""
        whole = "".join(self.streamed)
        if self.streamed and whole == reply:
            return TaskArtifactUpdateEvent(task_id=self.task.id, context_id=self.task.context_id,
                                           artifact=reply_artifact(""), append=True, last_chunk=True)
        return TaskArtifactUpdateEvent(task_id=self.task.id, context_id=self.task.context_id,
                                       artifact=reply_artifact(reply), append=False, last_chunk=True)

    def ends(self, frame: dict[str, Any]) -> bool:
        """Whether ``frame`` ends the watch: the run's end, or a pause after :attr:`paused_before`."""
        if frame.get("run_id") != self.run_id:
            return False
        kind = frame.get("type")
        return kind in RUN_END_TYPES or (kind == PAUSE_TYPE and frame.get("seq", 0) > self.paused_before)

    async def final(self) -> Task:
        """The task as stored now."""
        task = await database_sync_to_async(task_get_sync)(self.caller, self.task.id)
        if task is None:  # the chat was deleted meanwhile
            raise TaskNotFoundError(message=f"Task {self.task.id} was deleted.")
        return task

    async def events(self, frame: dict[str, Any]) -> AsyncIterator[Any]:
        """The A2A events of one frame of this run (none for another run's frame)."""
        if frame.get("run_id") != self.run_id:
            return
        kind, data = frame.get("type"), frame.get("data") or {}
        if kind == "content_token" and data.get("text"):
            yield self.chunk(data["text"])
        elif kind == "run_running":
            yield _status_event(self.task, TaskState.TASK_STATE_WORKING)
        elif kind == "artifact_updated" and data.get("artifact_id"):
            artifact = file_artifact(artifact_id=data["artifact_id"], name=data.get("name") or "artifact",
                                     mime_type=data.get("mime_type") or "application/octet-stream",
                                     base_url=self.caller.base_url)
            yield TaskArtifactUpdateEvent(task_id=self.task.id, context_id=self.task.context_id, artifact=artifact,
                                          last_chunk=True)
        elif kind == "run_completed":
            yield self.last_chunk(data.get("reply") or "".join(self.streamed))
        if self.ends(frame):
            final = await self.final()
            yield _status_event(final, final.status.state,
                                message=final.status.message if final.status.HasField("message") else None)


async def _frames(reader: SessionEventReader, watch: _RunWatch) -> AsyncIterator[dict[str, Any]]:
    """The session's frames (decoded) until the one that ends ``watch`` (yielded too).

    Raises:
        InternalError: the event stream ended first (the token was revoked, the server stops).
    """
    async for item in reader:
        if isinstance(item, Event):
            frame = json.loads(item.text)
            yield frame
            if watch.ends(frame):
                return
        elif isinstance(item, Closed):
            raise InternalError(message=f"The task's event stream ended: {item.reason.replace('_', ' ')}.")


class PlatformRequestHandler(RequestHandler):
    """The A2A operations of the agent named by the URL, for the caller of the call context
    (module docstring). One instance serves every agent and tenant: everything it needs is in
    the context (:func:`.tasks.caller_of`)."""

    def __init__(self) -> None:
        self.task_store = RunTaskStore()
        self.push_config_store = RunPushConfigStore()

    async def _prepare(self, params: SendMessageRequest, context: ServerCallContext) -> _RunWatch:
        """Start the run (or answer the task's approval) a message asks for; the watch of it,
        opened after the task's current events."""
        caller = caller_of(context)
        validate_history_length(params.configuration)
        message = params.message
        text = _message_text(message)
        push = (params.configuration.task_push_notification_config
                if params.configuration.HasField("task_push_notification_config") else None)
        if message.task_id:
            found = await database_sync_to_async(task_get_sync)(caller, message.task_id)
            if found is None:
                raise TaskNotFoundError(message=f"Task {message.task_id} not found.")
            # read before the answer: a pause after it (the next approval) is then always past this seq
            paused_before = await _session_seq(int(found.context_id))
            async with run_start_gate():
                run = await database_sync_to_async(_answer_sync)(caller, message.task_id, message.context_id, text,
                                                                 push)
        else:
            try:
                async with run_start_gate():
                    run = await database_sync_to_async(_start_sync)(caller, message.context_id, text, push)
            except PlatformRefusal as refusal:
                refusal_record(context, refusal)
                raise
            # The task as it started (submitted), from the run as created: read again, a worker
            # may already have finished it, and a stream would then open with the final state
            # before the updates that led to it (replayed from the session's start).
            task = await database_sync_to_async(_task_as_started)(caller, run)
            return _RunWatch(caller=caller, task=task, paused_before=0)
        task = await database_sync_to_async(task_get_sync)(caller, str(run.pk))
        if task is None:
            raise TaskNotFoundError(message=f"Task {run.pk} was deleted.")
        return _RunWatch(caller=caller, task=task, paused_before=paused_before)

    @validate_request_params
    async def on_message_send(self, params: SendMessageRequest, context: ServerCallContext) -> Task | Message:
        """``SendMessage``: the task once its run ends or pauses (or at once with
        ``returnImmediately``)."""
        if params.configuration.return_immediately:
            return apply_history_length((await self._prepare(params, context)).task, params.configuration)
        watch, reader = await self._prepare_read(params, context)
        try:
            await reader.open()
            async for _frame in _frames(reader, watch):
                pass
        finally:
            await reader.close()
        return apply_history_length(await watch.final(), params.configuration)

    async def _prepare_read(self, params: SendMessageRequest,
                            context: ServerCallContext) -> tuple[_RunWatch, SessionEventReader]:
        """:meth:`_prepare` on a stream slot taken first (a refused slot starts no run); the
        watch and its reader (not yet open; its ``close()`` frees the slot)."""
        slot = await _slot(context)
        try:
            watch = await self._prepare(params, context)
        except BaseException:
            await stream_guard.stream_slot_release(user_id=caller_of(context).user_id, slot=slot)
            raise
        return watch, _reader(watch.caller, int(watch.task.context_id), slot)

    @staticmethod
    async def _stream(watch: _RunWatch, reader: SessionEventReader) -> AsyncGenerator[Any, None]:
        """The run's A2A events (after the task itself) until it ends or pauses; closes ``reader``."""
        try:
            await reader.open()
            async for frame in _frames(reader, watch):
                async for event in watch.events(frame):
                    yield event
        finally:
            await reader.close()

    @validate_request_params
    async def on_message_send_stream(self, params: SendMessageRequest,
                                     context: ServerCallContext) -> AsyncGenerator[Any, None]:
        """``SendStreamingMessage``: the task (submitted), then its updates until the run ends or
        pauses (the last event is the final status)."""
        watch, reader = await self._prepare_read(params, context)
        try:
            yield apply_history_length(watch.task, params.configuration)
        except BaseException:
            await reader.close()
            raise
        async for event in self._stream(watch, reader):
            yield event

    @validate_request_params
    async def on_get_task(self, params: GetTaskRequest, context: ServerCallContext) -> Task | None:
        """``GetTask``: the caller's task with at most ``historyLength`` messages."""
        validate_history_length(params)
        task = await self.task_store.get(params.id, context)
        if task is None:
            raise TaskNotFoundError(message=f"Task {params.id} not found.")
        return apply_history_length(task, params)

    @validate_request_params
    async def on_list_tasks(self, params: ListTasksRequest, context: ServerCallContext) -> ListTasksResponse:
        """``ListTasks``: :func:`.tasks.tasks_list_sync`."""
        return await self.task_store.list(params, context)

    @validate_request_params
    async def on_cancel_task(self, params: CancelTaskRequest, context: ServerCallContext) -> Task | None:
        """``CancelTask``: cancel the run; the task after the cancellation took (or after
        :data:`CANCEL_WAIT_SECONDS`, still working, if the worker has not stopped yet)."""
        caller = caller_of(context)
        status = await database_sync_to_async(_cancel_sync)(caller, params.id)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + CANCEL_WAIT_SECONDS
        while status == RunStatus.RUNNING and loop.time() < deadline:
            await asyncio.sleep(0.1)
            status = await database_sync_to_async(_run_status_sync)(caller, int(params.id))
        task = await self.task_store.get(params.id, context)
        if task is None:
            raise TaskNotFoundError(message=f"Task {params.id} not found.")
        return task

    @validate_request_params
    async def on_subscribe_to_task(self, params: SubscribeToTaskRequest,
                                   context: ServerCallContext) -> AsyncGenerator[Any, None]:
        """``SubscribeToTask``: the task, then (unless it waits for input) its updates until its
        run ends or pauses, the reply's chunks from its start. A terminal task is
        UnsupportedOperationError."""
        caller = caller_of(context)
        task = await self.task_store.get(params.id, context)
        if task is None:
            raise TaskNotFoundError(message=f"Task {params.id} not found.")
        if task.status.state in TERMINAL_STATES:
            raise UnsupportedOperationError(
                message=f"Task {params.id} is in a terminal state ({TaskState.Name(task.status.state)}).")
        paused_before = await _session_seq(int(task.context_id))
        task = await self.task_store.get(params.id, context) or task  # read after the seq: no update missed
        if task.status.state == TaskState.TASK_STATE_INPUT_REQUIRED:
            yield task  # nothing follows until someone answers
            return
        reader = _reader(caller, int(task.context_id), await _slot(context))
        try:
            yield task
        except BaseException:
            await reader.close()
            raise
        async for event in self._stream(_RunWatch(caller=caller, task=task, paused_before=paused_before), reader):
            yield event

    @validate_request_params
    async def on_create_task_push_notification_config(self, params: TaskPushNotificationConfig,
                                                      context: ServerCallContext) -> TaskPushNotificationConfig:
        """``CreateTaskPushNotificationConfig``: store the config for the caller's task (the same
        id replaces it; no id: the task's id); the stored config. Raises TaskNotFoundError,
        InvalidParamsError (a URL the outbound rules refuse, a field too long, too many configs)."""
        return await self.push_config_store.set_info(params.task_id, params, context)

    @validate_request_params
    async def on_get_task_push_notification_config(self, params: GetTaskPushNotificationConfigRequest,
                                                   context: ServerCallContext) -> TaskPushNotificationConfig:
        """``GetTaskPushNotificationConfig``: config ``id`` of the caller's task. Raises
        TaskNotFoundError (no such task of the caller's, or no such config: as the SDK's handler)."""
        for config in await self.push_config_store.get_info(params.task_id, context):
            if config.id == params.id:
                return config
        raise TaskNotFoundError(message=f"Task {params.task_id} has no push-notification config {params.id!r}.")

    @validate_request_params
    async def on_list_task_push_notification_configs(
        self, params: ListTaskPushNotificationConfigsRequest, context: ServerCallContext,
    ) -> ListTaskPushNotificationConfigsResponse:
        """``ListTaskPushNotificationConfigs``: every config of the caller's task (at most
        :data:`.push.MAX_CONFIGS_PER_TASK`: one page). Raises TaskNotFoundError."""
        return ListTaskPushNotificationConfigsResponse(
            configs=await self.push_config_store.get_info(params.task_id, context))

    @validate_request_params
    async def on_delete_task_push_notification_config(self, params: DeleteTaskPushNotificationConfigRequest,
                                                      context: ServerCallContext) -> None:
        """``DeleteTaskPushNotificationConfig``: delete config ``id`` of the caller's task (no
        such config: nothing to do, as the SDK's stores answer). Raises TaskNotFoundError."""
        await self.push_config_store.delete_info(params.task_id, context, params.id)

    async def on_get_extended_agent_card(self, params: GetExtendedAgentCardRequest,
                                         context: ServerCallContext) -> AgentCard:
        """``GetExtendedAgentCard``: :func:`.cards.extended_agent_card` of the URL's agent for the
        authenticated caller."""
        caller = caller_of(context)
        card = await database_sync_to_async(_extended_card_sync)(caller)
        if card is None:
            raise TaskNotFoundError(message="This agent is no longer active.")
        return card
