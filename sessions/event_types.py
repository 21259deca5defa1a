"""The payload of every session event type: one frozen dataclass per type, the one place the
shapes are written down.

A session event is the frame ``{seq, type, session_id, run_id, data, ts}``
(:mod:`sessions.events`); this module describes ``data``. Each payload class has a
``type`` class attribute (a ``Literal`` of the event's name), one attribute per field (with
its docstring), and is checked by :func:`validate_event`: unknown fields and wrong types are
errors. The README's "Live events" table and the SPA's handlers
(``frontend/static/frontend/*.js``) are checked against these classes by
``sessions/tests/test_event_types.py``; every event the test suite publishes is validated
(``conftest.py``'s autouse fixture), so an emitting module that drifts from its class fails
its own tests.

Event names are API: never rename one that shipped (clients switch on them).

Fields that are ``None`` by default may be absent from the payload (some events have two
variants, e.g. ``run_queued``'s ``{input}`` and ``{resumed: true}``). Every event of a skill's
sub-run also carries :class:`SubRunFields` (``parent_run_id``, ``parent_tool_call_id``).
"""

from __future__ import annotations

import dataclasses
import functools
import json
from typing import Any, ClassVar, Literal

from pydantic import ConfigDict, TypeAdapter, ValidationError
from pydantic.dataclasses import dataclass

_CONFIG = ConfigDict(extra="forbid", strict=True)


def _payload(cls: type) -> type:
    """A frozen, keyword-only pydantic dataclass that forbids unknown fields."""
    return dataclass(frozen=True, kw_only=True, config=_CONFIG)(cls)


class EventPayloadError(ValueError):
    """An event's ``data`` does not match its type's payload class (or the type is unknown).

    Attributes:
        message: What is wrong, for a developer (names the type and the fields).
        extra: ``{"type": <event type>, "errors": [{"loc", "msg"}, ...]}``.
    """

    def __init__(self, message: str, *, extra: dict[str, Any]) -> None:
        super().__init__(message)
        self.message = message
        self.extra = extra


# --- nested items ------------------------------------------------------------------------


@_payload
class ApprovalItem:
    """One pending approval or question, as ``run_awaiting_approval`` lists it."""

    approval_id: int
    """The Approval row's id (``POST /api/v1/approvals/<id>/decide``)."""
    tool_call_id: int | None
    """The tool call waiting for it."""
    kind: str
    """``tool_call`` (approve or deny a call), ``question`` (the model asks the user) or
    ``client_tool`` (a call of a tool the OpenAI-compatible API's client runs: its next request
    brings the output; the approval endpoint refuses it), ``elicitation`` (an MCP server asks
    the user for input: a form or a URL) or ``sampling`` (an MCP server asks to use the
    agent's model: approve or deny)."""
    status: str
    """``pending`` when published."""
    tool_name: str
    """The tool's exposed name."""
    arguments: Any
    """The call's arguments as the model sent them (an object, or the raw text if not JSON)."""
    reason: str
    """Why approval is needed (the policy rule or the tool's reason); may be empty."""
    question: str
    """The question for ``kind == "question"``, else empty."""
    elicitation: dict[str, Any] | None
    """For ``kind == "elicitation"``: ``{mode: "form" | "url", message, schema (form: the
    requested JSON Schema), url (url mode), server (the MCP server's alias), tool}``; else None."""
    expires_at: str
    """ISO 8601 time after which the approval expires."""
    sub_run_id: int | None
    """The skill sub-run the call belongs to, else None."""
    skill: str | None
    """The skill's name when asked inside a skill, else None."""
    approvers: dict[str, Any]
    """Who may decide (the policy rule's approvers, resolved when asked): ``{requester: bool,
    roles: [role, ...], user_ids: [id, ...]}``; ``{}``: the run's user (the default)."""
    on_timeout: str
    """What the expiry does: ``deny`` or ``approve`` the call (the run goes on), or ``""``: the
    run fails ``approval_expired``."""
    sampling: dict[str, Any] | None = None
    """For ``kind == "sampling"`` (an MCP server asks to use the agent's model; approve or
    deny): ``{server, tool, message, requests: [{messages: [{role, text}], system_prompt,
    max_tokens, offers_tools, tools}]}`` (texts cut at 4,000 characters, the last 20
    messages); else None."""
    connection: dict[str, Any] | None = None
    """For ``kind == "connection"`` (an OAuth MCP server's account to connect; the run resumes
    once it is): ``{server, server_id, server_name, auth_mode, tool, retry, message}``; else None."""


@_payload
class TodoItem:
    """One entry of the session's todo list."""

    content: str
    """The task's text (≤ 500 characters)."""
    status: Literal["pending", "in_progress", "completed"]
    """Where the task stands."""
    priority: Literal["low", "medium", "high"]
    """How important it is."""


@_payload
class AttributionItem:
    """One answer sentence the platform matched to a passage the run was given (the answer
    cited none), as ``run_completed`` lists it (:mod:`knowledge.attribution`)."""

    sentence_start: int
    """Where the sentence starts in ``reply`` (a character offset, 0-based)."""
    sentence_end: int
    """Where it ends (exclusive)."""
    n: int
    """The passage's citation number in the run (its ``citations``' ``n``)."""
    chunk_id: int
    """The passage's chunk (``GET /api/v1/knowledge/chunks/<id>/``)."""
    score: float
    """The cosine of the sentence's and the passage's embeddings (≥ the attribution threshold)."""


# --- payloads ----------------------------------------------------------------------------


@_payload
class SubRunFields:
    """Fields every event of a skill's sub-run carries besides its own (None otherwise)."""

    parent_run_id: int | None = None
    """The run whose skill call started this sub-run."""
    parent_tool_call_id: int | None = None
    """The skill tool call of the parent run."""


SUBRUN_FIELDS: frozenset[str] = frozenset(f.name for f in dataclasses.fields(SubRunFields))
"""Field names of :class:`SubRunFields` (documented once, below the README table)."""


@_payload
class RunQueued(SubRunFields):
    """The run was queued: a new message (``{input}``) or a paused run resumed (``{resumed}``)."""

    type: ClassVar[Literal["run_queued"]] = "run_queued"
    input: str | None = None
    """The user's message text (a new run)."""
    resumed: bool | None = None
    """True when a run whose approvals were all decided is queued again."""


@_payload
class RunRunning(SubRunFields):
    """A worker started (or resumed) the run, or a message was steered into a running run."""

    type: ClassVar[Literal["run_running"]] = "run_running"
    attempt: int | None = None
    """The run's attempt number (1, then +1 per resume after a worker loss or approval)."""
    steered_into: int | None = None
    """For a message handed to a running run: that run's id (this event's ``run_id`` is the message's run)."""
    skill: str | None = None
    """A skill's sub-run: the skill's name."""
    agent: str | None = None
    """A sub-agent's sub-run (capability kind ``agent``): the called agent's name."""
    depth: int | None = None
    """A sub-run: its depth (1 for a skill called by the user's run)."""
    task: str | None = None
    """A sub-run: the task the parent run gave the skill."""


@_payload
class RunAwaitingApproval(SubRunFields):
    """The run paused: a human must decide one or more approvals (or answer a question)."""

    type: ClassVar[Literal["run_awaiting_approval"]] = "run_awaiting_approval"
    approvals: list[ApprovalItem]
    """The pending approvals."""


@_payload
class ApprovalResolved(SubRunFields):
    """An approval was decided (approved, denied, answered)."""

    type: ClassVar[Literal["approval_resolved"]] = "approval_resolved"
    approval_id: int
    """The Approval row's id."""
    tool_call_id: int | None
    """The tool call it was for."""
    status: str
    """``approved``, ``denied`` or ``answered``."""
    sub_run_id: int | None
    """The skill sub-run it belongs to, else None."""


@_payload
class ToolCallProgress(SubRunFields):
    """A running tool reported progress (a CLI command's output, a long MCP call)."""

    type: ClassVar[Literal["tool_call_progress"]] = "tool_call_progress"
    tool_call_id: int | None
    """The tool call."""
    message: str
    """A line for the user (a CLI command: the output text since the previous event)."""
    progress: int | float | None
    """Units done so far, if known (a CLI command: characters of output so far)."""
    total: int | float | None
    """Units in all, if known."""
    stream: Literal["stdout", "stderr"] | None = None
    """A CLI command's output: which stream ``message`` came from."""


@_payload
class ArtifactUpdated(SubRunFields):
    """A tool stored an artifact (``{artifact_id, name, mime_type, size_bytes, tool_call_id}``) or
    ``doc_write`` wrote a document (``{document_id, title, op, version}``)."""

    type: ClassVar[Literal["artifact_updated"]] = "artifact_updated"
    artifact_id: int | None = None
    """The artifact (``GET /api/v1/artifacts/<id>/``)."""
    name: str | None = None
    """The artifact's file name."""
    mime_type: str | None = None
    """Its media type."""
    size_bytes: int | None = None
    """Its size in bytes."""
    tool_call_id: int | None = None
    """The tool call that stored it."""
    document_id: int | None = None
    """A document written by ``doc_write``."""
    title: str | None = None
    """The document's title."""
    op: Literal["create", "append", "patch"] | None = None
    """What ``doc_write`` did."""
    version: int | None = None
    """The document's version after the write."""

    def __post_init__(self) -> None:
        artifact = (self.artifact_id, self.name, self.mime_type, self.size_bytes)
        document = (self.document_id, self.title, self.op, self.version)
        if any(v is not None for v in document) and any(v is not None for v in (*artifact, self.tool_call_id)):
            raise ValueError("an artifact_updated event is an artifact's or a document's, not both")
        if None in artifact and None in document:
            raise ValueError("artifact_updated needs {artifact_id, name, mime_type, size_bytes} "
                             "or {document_id, title, op, version}")


@_payload
class ContentToken(SubRunFields):
    """Streamed answer text since the previous event (append them)."""

    type: ClassVar[Literal["content_token"]] = "content_token"
    text: str
    """The text."""


@_payload
class ReasoningToken(SubRunFields):
    """Streamed reasoning text since the previous event (append them)."""

    type: ClassVar[Literal["reasoning_token"]] = "reasoning_token"
    text: str
    """The text."""


@_payload
class ToolCallStarted(SubRunFields):
    """A tool call started."""

    type: ClassVar[Literal["tool_call_started"]] = "tool_call_started"
    tool_call_id: int
    """The ToolCall row's id."""
    name: str
    """The tool's exposed name."""
    arguments: Any
    """The arguments (an object; the raw text when the model sent invalid JSON)."""


@_payload
class ToolCallSucceeded(SubRunFields):
    """A tool call returned."""

    type: ClassVar[Literal["tool_call_succeeded"]] = "tool_call_succeeded"
    tool_call_id: int
    """The ToolCall row's id."""
    name: str
    """The tool's exposed name."""
    result: str
    """The result text as recorded (truncated to the recorded maximum)."""
    duration_ms: int
    """How long the call took, in milliseconds."""
    data: Any = None
    """The tool's structured result (``ToolCall.result_data``), absent when the tool gave
    none; e.g. ``knowledge_search``'s ``{"citations": [{n, knowledge_base_id, document_id,
    document_title, chunk_id, position, heading, score, snippet}]}``."""


@_payload
class ToolCallFailed(SubRunFields):
    """A tool call failed or timed out."""

    type: ClassVar[Literal["tool_call_failed"]] = "tool_call_failed"
    tool_call_id: int
    """The ToolCall row's id."""
    name: str
    """The tool's exposed name."""
    error: str
    """Why it failed."""
    status: Literal["failed", "timed_out"]
    """The call's final status."""
    duration_ms: int
    """How long the call took, in milliseconds."""


@_payload
class BrowserOperation(SubRunFields):
    """A browser tool call's progress: ``started``, then its end."""

    type: ClassVar[Literal["browser_operation"]] = "browser_operation"
    tool_call_id: int | None
    """The tool call."""
    op: str
    """The browser operation (``navigate``, ``click``, ...)."""
    params: dict[str, Any]
    """Its parameters as shown to the user."""
    status: Literal["started", "succeeded", "failed", "awaiting_approval"]
    """Where the operation stands."""
    url: str
    """The page's URL after the operation (empty until it succeeded)."""
    backend: Literal["extension", "server"] | None = None
    """Which backend ran it (``succeeded`` only)."""
    error_code: str | None = None
    """Why it failed or waits (``failed`` / ``awaiting_approval`` only)."""


@_payload
class TodoUpdated(SubRunFields):
    """The session's todo list was replaced."""

    type: ClassVar[Literal["todo_updated"]] = "todo_updated"
    todos: list[TodoItem]
    """The whole list, in order."""


@_payload
class ModelRetry(SubRunFields):
    """The router retries the same route entry (``{entry_index, ...}``), or a broken stream
    restarts the turn (``{turn, error_class, turn_restarted: true}``: drop the text streamed so far)."""

    type: ClassVar[Literal["model_retry"]] = "model_retry"
    error_class: str
    """The error's class (``rate_limited``, ``timeout``, ``stream_interrupted``, ...)."""
    entry_index: int | None = None
    """The route entry retried."""
    provider_name: str | None = None
    """Its provider's name."""
    model: str | None = None
    """Its model."""
    attempt: int | None = None
    """The attempt about to start (2 for the first retry)."""
    wait_seconds: int | float | None = None
    """Seconds waited before it."""
    turn: int | None = None
    """A restarted turn: its number."""
    turn_restarted: bool | None = None
    """True when the turn restarts after a broken stream."""


@_payload
class ModelFallback(SubRunFields):
    """The router moved from one route entry to the next."""

    type: ClassVar[Literal["model_fallback"]] = "model_fallback"
    from_entry_index: int
    """The entry left."""
    from_model: str
    """Its model."""
    to_entry_index: int
    """The entry tried next."""
    to_model: str
    """Its model."""
    error_class: str
    """Why (an error class, or ``cooldown``, ``context_window``, ``no_tool_support`` for a skipped entry)."""


@_payload
class CompactionRunning(SubRunFields):
    """The history is being summarized."""

    type: ClassVar[Literal["compaction_running"]] = "compaction_running"
    attempt: int
    """The compaction attempt in this turn (1, 2, ...)."""
    tokens_before: int
    """Estimated tokens of the history before."""
    messages: int
    """Messages being summarized."""


@_payload
class CompactionCompleted(SubRunFields):
    """A compaction ended: ``ok`` with the new size, or not with its ``error``."""

    type: ClassVar[Literal["compaction_completed"]] = "compaction_completed"
    ok: bool
    """Whether the history was summarized."""
    compaction_id: int
    """The Compaction row's id."""
    attempt: int
    """The compaction attempt in this turn."""
    tokens_before: int | None = None
    """Estimated tokens before (``ok`` only)."""
    tokens_after: int | None = None
    """Estimated tokens after (``ok`` only)."""
    messages: int | None = None
    """Messages summarized (``ok`` only)."""
    error: str | None = None
    """Why it failed (not ``ok`` only)."""


@_payload
class RunCompleted(SubRunFields):
    """The run ended with a reply."""

    type: ClassVar[Literal["run_completed"]] = "run_completed"
    reply: str
    """The final answer."""
    attributions: list[AttributionItem] | None = None
    """The platform's attribution of an answer that cites none of its passages (absent: not
    attempted); also ``Run.attributions`` in the REST session detail."""
    steered_into: int | None = None
    """For a message steered into another run: that run's id."""


@_payload
class RunFailed(SubRunFields):
    """The run failed."""

    type: ClassVar[Literal["run_failed"]] = "run_failed"
    error: str
    """What went wrong, for the user."""
    reason: str
    """The failure reason (``model_error``, ``loop_limit``, ``internal_error``, ...)."""
    steered_into: int | None = None
    """For a message steered into another run: that run's id."""


@_payload
class RunCancelled(SubRunFields):
    """The run was cancelled."""

    type: ClassVar[Literal["run_cancelled"]] = "run_cancelled"
    reason: str
    """``cancelled_by_user``."""
    steered_into: int | None = None
    """For a message steered into another run: that run's id."""


@_payload
class CapabilityUnavailable(SubRunFields):
    """A bound capability could not be reached at the run's start and is left out of it."""

    type: ClassVar[Literal["capability_unavailable"]] = "capability_unavailable"
    source: Literal["mcp", "a2a"]
    """The capability kind (``a2a``: a remote A2A agent whose card could not be fetched)."""
    alias: str
    """The capability's alias (the MCP server's; the remote A2A agent's name)."""
    error: str
    """Why (≤ 2000 characters)."""


@_payload
class AgentHandoff(SubRunFields):
    """A handoff: the run's agent handed the chat to another agent (a binding of kind ``agent``
    with ``handoff: true``), which answered this run and answers the chat's later messages."""

    type: ClassVar[Literal["agent_handoff"]] = "agent_handoff"
    from_agent: str
    """The name of the agent that handed the chat over."""
    to_agent: str
    """The name of the agent that has the chat now."""
    to_agent_id: int
    """Its id."""


@_payload
class SessionTitled(SubRunFields):
    """The chat got its title from the model, after its first exchange (a user-renamed chat
    never does). ``run_id``: the run of that exchange."""

    type: ClassVar[Literal["session_titled"]] = "session_titled"
    title: str
    """The chat's new title (at most 200 characters)."""


@_payload
class DocumentStatusChanged(SubRunFields):
    """A document the user added to their own knowledge base from this chat ("Add to
    knowledge") changed status, or moved on while embedding. ``run_id``: null."""

    type: ClassVar[Literal["document_status_changed"]] = "document_status_changed"
    document_id: int
    """The document (``GET /api/v1/knowledge-bases/<knowledge_base_id>/documents/<document_id>/``)."""
    knowledge_base_id: int
    """Its knowledge base (the user's own)."""
    title: str
    """The document's title."""
    status: Literal["queued", "parsing", "embedding", "ready", "failed"]
    """Where its ingestion (or re-embedding) is."""
    status_reason: str
    """Why it failed; '' otherwise."""
    chunk_count: int
    """Its chunks (0 before parsing)."""
    embedded_count: int
    """Chunks embedded so far."""
    progress: float
    """``embedded_count / chunk_count`` (0–1; 1 when ready), as the document API's ``progress``."""


@_payload
class GuardrailTripped(SubRunFields):
    """A guardrail of the agent stopped the run (``run_failed`` with reason ``guardrail_tripped``
    follows); ``retracted``: the answer streamed so far is withdrawn (an output guardrail)."""

    type: ClassVar[Literal["guardrail_tripped"]] = "guardrail_tripped"
    guardrail: str
    """The guardrail's name."""
    point: Literal["input", "tool_call", "tool_result", "output"]
    """Where it checked."""
    kind: str
    """Its kind (``deny_list``, ``regex``, ``pii``, ``max_length``, ``json_schema``, ``model_check``)."""
    message: str
    """The plain-language message for the user (the run's ``error``)."""
    retracted: bool
    """True when the streamed answer text is withdrawn: clients replace it with a retraction notice."""


EVENT_PAYLOADS: dict[str, type] = {
    cls.type: cls
    for cls in (
        GuardrailTripped, RunQueued, RunRunning, RunCompleted, RunFailed, RunCancelled, ContentToken, ReasoningToken,
        ToolCallStarted, ToolCallSucceeded, ToolCallFailed, TodoUpdated, ModelRetry, ModelFallback,
        CompactionRunning, CompactionCompleted, RunAwaitingApproval, ApprovalResolved, ToolCallProgress,
        ArtifactUpdated, BrowserOperation, CapabilityUnavailable, SessionTitled, DocumentStatusChanged, AgentHandoff,
    )
}
"""Event type name → its payload class."""

EVENT_TYPES: frozenset[str] = frozenset(EVENT_PAYLOADS)
"""Every event type name. Names are API: never rename one that shipped."""


def payload_fields(event_type: str) -> frozenset[str]:
    """The field names of ``event_type``'s payload, without :data:`SUBRUN_FIELDS`.

    Raises:
        KeyError: an unknown event type.
    """
    return frozenset(f.name for f in dataclasses.fields(EVENT_PAYLOADS[event_type])) - SUBRUN_FIELDS


@functools.cache
def _adapter(cls: type) -> TypeAdapter:
    return TypeAdapter(cls)


def validate_event(event_type: str, data: dict[str, Any]) -> Any:
    """Check ``data`` against ``event_type``'s payload class.

    ``data`` is checked as a client receives it: strictly (no coercion: ``"1"`` is not an int,
    ``1`` is not a bool), as JSON (so a ``StrEnum`` member is its string).

    Returns:
        The payload instance.

    Raises:
        EventPayloadError: unknown type, a missing or unknown field, a wrong type, or data that
            is not a JSON object.
    """
    cls = EVENT_PAYLOADS.get(event_type)
    if cls is None:
        raise EventPayloadError(f"unknown event type {event_type!r}", extra={"type": event_type, "errors": []})
    if not isinstance(data, dict):
        raise EventPayloadError(f"{event_type}: data must be an object, got {type(data).__name__}",
                                extra={"type": event_type, "errors": []})
    try:
        return _adapter(cls).validate_json(json.dumps(data))
    except ValidationError as exc:
        errors = [{"loc": ".".join(str(p) for p in e["loc"]), "msg": e["msg"]} for e in exc.errors()]
        detail = "; ".join(f"{e['loc'] or '(payload)'}: {e['msg']}" for e in errors)
        raise EventPayloadError(f"{event_type}: {detail}", extra={"type": event_type, "errors": errors}) from None
