"""A2A tasks over the platform's runs: a task *is* a run.

- ``Task.id`` = the run's id, ``Task.contextId`` = its chat session's id (the conversation).
- ``Task.status.state`` from the run's status (:data:`STATE_OF_STATUS`): queued → submitted,
  running → working, awaiting_approval → input-required, completed / failed / cancelled →
  completed / failed / canceled. A failed run's status carries an agent message with its error;
  a paused run's, the pending approvals (what the caller may answer, :func:`pending_approvals_text`).
- ``Task.history``: the run's user message, then the agent's reply once there is one.
- ``Task.artifacts``: the reply (artifact ``reply``, one text part) and each file the run stored
  (artifact ``artifact-<id>``, one part whose ``url`` is the platform's download,
  ``GET /api/v1/artifacts/<id>/content``, same token).

:class:`RunTaskStore` is the a2a-sdk's ``TaskStore`` over those rows: reads only (a run's rows
are written by the run lifecycle, never through the store), always within the caller of the
call context (:class:`A2ACaller`: the token's tenant and user, the agent of the URL), so a task
of another tenant, user or agent is "not found" like a missing one, and tasks outlive the
process that started them.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime

from a2a.server.context import ServerCallContext
from a2a.server.tasks import TaskStore
from a2a.types.a2a_pb2 import (
    Artifact as A2AArtifact,
)
from a2a.types.a2a_pb2 import (
    ListTasksRequest,
    ListTasksResponse,
    Message,
    Part,
    Role,
    Task,
    TaskState,
    TaskStatus,
)
from a2a.utils.constants import DEFAULT_LIST_TASKS_PAGE_SIZE, MAX_LIST_TASKS_PAGE_SIZE
from a2a.utils.errors import InternalError, InvalidParamsError, UnsupportedOperationError
from a2a.utils.task import apply_history_length, validate_history_length, validate_page_size
from channels.db import database_sync_to_async
from django.db.models import QuerySet

from sessions.models import Approval, ApprovalStatus, Artifact, Run, RunStatus
from tenants.scoping import tenant_scope

STATE_OF_STATUS: dict[str, int] = {
    RunStatus.QUEUED: TaskState.TASK_STATE_SUBMITTED,
    RunStatus.RUNNING: TaskState.TASK_STATE_WORKING,
    RunStatus.AWAITING_APPROVAL: TaskState.TASK_STATE_INPUT_REQUIRED,
    RunStatus.COMPLETED: TaskState.TASK_STATE_COMPLETED,
    RunStatus.FAILED: TaskState.TASK_STATE_FAILED,
    RunStatus.CANCELLED: TaskState.TASK_STATE_CANCELED,
}
"""A run's status → the A2A task state (``TaskState`` enum value)."""

TERMINAL_STATES = frozenset({TaskState.TASK_STATE_COMPLETED, TaskState.TASK_STATE_FAILED,
                             TaskState.TASK_STATE_CANCELED, TaskState.TASK_STATE_REJECTED})
"""The task states nothing follows (a terminal task cannot be cancelled or subscribed to)."""

REPLY_ARTIFACT_ID = "reply"
"""The artifact that carries the agent's reply (streamed as chunks, whole in the stored task)."""

CALLER_KEY = "platform_a2a_caller"
"""Where the call context's ``state`` holds the :class:`A2ACaller` (set by :mod:`.app`)."""


@dataclass(frozen=True, slots=True)
class A2ACaller:
    """Who calls, and which agent: fixed by the API token and the URL before the SDK sees the
    request (:mod:`.app`)."""

    tenant_id: int
    user_id: int
    membership_id: int
    token_id: int
    agent_id: int
    agent_slug: str
    base_url: str
    """``scheme://host`` of the request (the artifacts' download URLs start with it)."""
    version: int | None = None
    """The agent's version the URL pins (``/a2a/<slug>@<n>/``): new runs use it; None: the published one."""


REFUSAL_KEY = "platform_a2a_refusal"
"""Where the call context's ``state`` (and the ASGI scope) hold the request's :class:`RefusalBox`."""


class PlatformRefusal(InternalError):
    """A refusal of the platform's own, not the protocol's: over a throttle, too many open
    answers. The handler records it in the request's :class:`RefusalBox` and :mod:`.app` answers
    it as the HTTP ``status`` with ``Retry-After`` (seconds) and ``{"message", "extra"}``,
    whatever the binding (A2A has no error code for it; the SDK would answer an internal error)."""

    def __init__(self, status: int, message: str, retry_after: int) -> None:
        super().__init__(message=message)
        self.status, self.retry_after = status, retry_after


@dataclass(slots=True)
class RefusalBox:
    """The refusal of one request, if any (set by the handler, read by the app)."""

    refusal: PlatformRefusal | None = None


def refusal_record(context: ServerCallContext, refusal: PlatformRefusal) -> None:
    """Keep ``refusal`` for the app to answer (the request's :class:`RefusalBox`)."""
    box = context.state.get(REFUSAL_KEY)
    if isinstance(box, RefusalBox):
        box.refusal = refusal


def caller_of(context: ServerCallContext) -> A2ACaller:
    """The caller the app put in ``context.state``. Raises UnsupportedOperationError when
    there is none (the app authenticates every call, so this is a wiring error)."""
    caller = context.state.get(CALLER_KEY)
    if not isinstance(caller, A2ACaller):
        raise UnsupportedOperationError(message="This call carries no authenticated caller.")
    return caller


def run_id_of(task_id: str) -> int | None:
    """The run id a task id names (its decimal id), or None for anything else."""
    task_id = (task_id or "").strip()
    if not task_id.isdigit() or len(task_id) > 18:
        return None
    return int(task_id)


def caller_runs(caller: A2ACaller) -> QuerySet[Run]:
    """The caller's tasks: the user's own top-level runs (not a skill's sub-runs) of the agent,
    in chats not deleted. Requires the caller's tenant scope."""
    return Run.objects.filter(
        session__user_id=caller.user_id, session__agent_id=caller.agent_id, session__deleted_at__isnull=True,
        parent_tool_call__isnull=True,
    )


def _text_message(*, message_id: str, role: int, text: str, run: Run) -> Message:
    return Message(message_id=message_id, role=role, parts=[Part(text=text)], task_id=str(run.pk),
                   context_id=str(run.session_id))


def _approval_line(approval: Approval) -> str:
    if approval.question:
        return f"- approval {approval.pk}: question: {approval.question}"
    reason = f" ({approval.reason})" if approval.reason else ""
    return f"- approval {approval.pk}: may I call `{approval.tool_name}` with {approval.arguments!r}?{reason}"


def pending_approvals_text(approvals: Iterable[Approval]) -> str:
    """What a paused run waits for, for the caller: one line per pending approval, then how to
    answer (send a message to the task: the answer to a question; ``approve`` or ``deny`` (a
    reason may follow) for a tool call)."""
    lines = [_approval_line(a) for a in approvals]
    return "\n".join([
        "The agent waits for a decision:", *lines,
        "Answer with a message to this task: the answer to the question, or `approve` / `deny <reason>` for a "
        "tool call (the first pending one is decided).",
    ])


def _status(run: Run, approvals: list[Approval]) -> TaskStatus:
    state = STATE_OF_STATUS[run.status]
    status = TaskStatus(state=state)
    when: datetime = run.finished_at or run.paused_at or run.started_at or run.created_at
    status.timestamp.FromDatetime(when)
    if state == TaskState.TASK_STATE_FAILED:
        status.message.CopyFrom(_text_message(message_id=f"run-{run.pk}-error", role=Role.ROLE_AGENT,
                                              text=run.error or "The run failed.", run=run))
    elif state == TaskState.TASK_STATE_INPUT_REQUIRED:
        status.message.CopyFrom(_text_message(message_id=f"run-{run.pk}-pause-{approvals[0].pk if approvals else 0}",
                                              role=Role.ROLE_AGENT, text=pending_approvals_text(approvals), run=run))
    return status


def file_artifact(*, artifact_id: int, name: str, mime_type: str, base_url: str) -> A2AArtifact:
    """The A2A artifact of a file the run stored: ``artifact-<id>``, one part whose ``url`` is
    its download (``<base_url>/api/v1/artifacts/<id>/content``, the same API token)."""
    url = f"{base_url}/api/v1/artifacts/{artifact_id}/content"
    return A2AArtifact(artifact_id=f"artifact-{artifact_id}", name=name,
                       parts=[Part(url=url, filename=name, media_type=mime_type)])


def reply_artifact(text: str) -> A2AArtifact:
    """The reply artifact holding ``text`` (one text part)."""
    return A2AArtifact(artifact_id=REPLY_ARTIFACT_ID, name="reply", parts=[Part(text=text)])


def task_of_run(run: Run, caller: A2ACaller) -> Task:
    """The A2A task of ``run`` (see the module docstring). Reads the run's pending approvals and
    artifacts (two queries). Requires the caller's tenant scope."""
    approvals = (list(Approval.objects.filter(run=run, status=ApprovalStatus.PENDING).order_by("id"))
                 if run.status == RunStatus.AWAITING_APPROVAL else [])
    task = Task(id=str(run.pk), context_id=str(run.session_id), status=_status(run, approvals))
    task.history.append(_text_message(message_id=f"run-{run.pk}-input", role=Role.ROLE_USER, text=run.input, run=run))
    if run.reply:
        task.history.append(_text_message(message_id=f"run-{run.pk}-reply", role=Role.ROLE_AGENT, text=run.reply,
                                          run=run))
        task.artifacts.append(reply_artifact(run.reply))
    files = Artifact.objects.filter(run=run).only("pk", "name", "mime_type").order_by("id")
    task.artifacts.extend(file_artifact(artifact_id=a.pk, name=a.name, mime_type=a.mime_type, base_url=caller.base_url)
                          for a in files)
    task.metadata.update({"run_status": run.status, **({"reason": run.reason} if run.reason else {})})
    return task


def task_get_sync(caller: A2ACaller, task_id: str) -> Task | None:
    """The caller's task ``task_id``, or None (missing, or another tenant's, user's or agent's)."""
    run_id = run_id_of(task_id)
    if run_id is None:
        return None
    with tenant_scope(caller.tenant_id):
        run = caller_runs(caller).filter(pk=run_id).first()
        return None if run is None else task_of_run(run, caller)


def _page_after(page_token: str) -> int | None:
    """The run id a page token continues after (tokens are ``base64url("run:<id>")``)."""
    if not page_token:
        return None
    try:
        raw = base64.urlsafe_b64decode(page_token + "=" * (-len(page_token) % 4)).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raw = ""
    prefix, _, number = raw.partition(":")
    if prefix != "run" or not number.isdigit():
        raise InvalidParamsError(message=f"Invalid page token {page_token!r}.")
    return int(number)


def _page_token(run_id: int) -> str:
    return base64.urlsafe_b64encode(f"run:{run_id}".encode()).decode().rstrip("=")


STATUSES_OF_STATE: dict[int, list[str]] = {}
for _status_name, _state in STATE_OF_STATUS.items():
    STATUSES_OF_STATE.setdefault(_state, []).append(_status_name)


def _filtered(runs: QuerySet[Run], params: ListTasksRequest) -> QuerySet[Run]:
    if params.context_id:
        if not params.context_id.isdigit():
            return runs.none()
        runs = runs.filter(session_id=int(params.context_id))
    if params.status != TaskState.TASK_STATE_UNSPECIFIED:
        runs = runs.filter(status__in=STATUSES_OF_STATE.get(params.status, []))
    if params.HasField("status_timestamp_after"):
        after = params.status_timestamp_after.ToDatetime(tzinfo=UTC)
        runs = runs.filter(created_at__gt=after)
    return runs


def tasks_list_sync(caller: A2ACaller, params: ListTasksRequest) -> ListTasksResponse:
    """A page of the caller's tasks, newest first (by run id): filtered by ``contextId``,
    ``status`` and ``statusTimestampAfter`` (the run's creation), ``pageSize`` 1–100 (default
    50), ``pageToken`` from the previous page, ``historyLength`` and ``includeArtifacts`` applied.

    Raises:
        InvalidParamsError: a bad page size, page token or history length.
    """
    validate_history_length(params)
    if params.HasField("page_size"):
        validate_page_size(params.page_size)
    size = min(params.page_size or DEFAULT_LIST_TASKS_PAGE_SIZE, MAX_LIST_TASKS_PAGE_SIZE)
    after = _page_after(params.page_token)
    with tenant_scope(caller.tenant_id):
        runs = _filtered(caller_runs(caller), params)
        total = runs.count()
        if after is not None:
            runs = runs.filter(pk__lt=after)
        page = list(runs.order_by("-pk")[: size + 1])
        tasks = [task_of_run(run, caller) for run in page[:size]]
    response = ListTasksResponse(page_size=size, total_size=total,
                                 next_page_token=_page_token(page[size - 1].pk) if len(page) > size else "")
    for task in tasks:
        if not params.include_artifacts:
            task.ClearField("artifacts")
        response.tasks.append(apply_history_length(task, params))
    return response


class RunTaskStore(TaskStore):
    """The a2a-sdk's ``TaskStore`` over the platform's runs (module docstring): ``get`` and
    ``list`` read the caller's runs; ``save`` and ``delete`` refuse (UnsupportedOperationError:
    a task changes only as its run does, and a run is deleted with its chat)."""

    async def save(self, task: Task, context: ServerCallContext) -> None:  # noqa: D102
        raise UnsupportedOperationError(message="Tasks are runs: they change only as the run does.")

    async def get(self, task_id: str, context: ServerCallContext) -> Task | None:  # noqa: D102
        return await database_sync_to_async(task_get_sync)(caller_of(context), task_id)

    async def list(self, params: ListTasksRequest, context: ServerCallContext) -> ListTasksResponse:  # noqa: D102
        return await database_sync_to_async(tasks_list_sync)(caller_of(context), params)

    async def delete(self, task_id: str, context: ServerCallContext) -> None:  # noqa: D102
        raise UnsupportedOperationError(message="A task is deleted with its chat, in the chat app.")
