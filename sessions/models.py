"""Chat sessions, runs and everything a run records.

A run is one user message and everything the agent did to answer it: model turns (LLMCall
rows, one per attempt), assistant and tool messages, tool calls. Everything needed to resume
a run lives here, in PostgreSQL.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models

from llm.metering import LLMCallPurpose
from tenants.scoping import TenantOwnedModel


class ChatSession(TenantOwnedModel):
    """A conversation between one user and one agent."""

    agent = models.ForeignKey("agents.AgentInstance", on_delete=models.RESTRICT, related_name="sessions")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="chat_sessions")
    title = models.CharField(max_length=200, blank=True)
    next_position = models.PositiveIntegerField(default=0, help_text="Position of the next message.")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    deleted_at = models.DateTimeField(
        null=True, blank=True, db_index=True,
        help_text="Deleted by its user (soft): hidden from the chat app and the API, kept for the console.",
    )

    class Meta(TenantOwnedModel.Meta):
        ordering = ["-updated_at", "-id"]
        verbose_name = "chat session"

    def __str__(self) -> str:
        return self.title or f"Session {self.pk}"


class RunStatus(models.TextChoices):
    QUEUED = "queued"
    RUNNING = "running"
    AWAITING_APPROVAL = "awaiting_approval"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


ACTIVE_RUN_STATUSES = (RunStatus.QUEUED, RunStatus.RUNNING, RunStatus.AWAITING_APPROVAL)
TERMINAL_RUN_STATUSES = (RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED)


class RunFailureReason(models.TextChoices):
    """Why a run ended ``failed`` (``Run.reason``)."""

    MODEL_UNAVAILABLE = "model_unavailable", "Every route entry failed"
    MODEL_ERROR = "model_error", "The model request was rejected"
    STREAM_INTERRUPTED = "stream_interrupted", "The model's stream broke after it started"
    MAX_LOOP_COUNT = "max_loop_count", "The loop limit was reached without an answer"
    BUDGET_EXCEEDED = "budget_exceeded", "A token or cost budget would be exceeded"
    CONTEXT_WINDOW = "context_window", "The conversation does not fit any route entry"
    TURN_TIMEOUT = "turn_timeout", "A model turn took longer than the agent's turn timeout"
    COMPACTION_FAILED = "compaction_failed", "The conversation could not be compacted to fit"
    CONFIGURATION = "configuration", "The agent's configuration is unusable"
    CAPABILITY_UNAVAILABLE = "capability_unavailable", "A bound capability could not be reached"
    RUN_TIMEOUT = "run_timeout", "The run took longer than the agent's run timeout"
    WORKER_LOST = "worker_lost", "The worker running it died too many times"
    APPROVAL_EXPIRED = "approval_expired", "An approval was not given in time"
    OUTPUT_INVALID = "output_invalid", "The answer did not match the requested format after the repair turns"
    GUARDRAIL_TRIPPED = "guardrail_tripped", "A guardrail of the agent stopped the run"
    INTERNAL = "internal_error", "Internal error"


class RunPurpose(models.TextChoices):
    """Where a run came from (``Run.purpose``): who, if anyone, watches it."""

    CHAT = "chat", "The chat app or the REST API"
    API = "api", "The OpenAI-compatible API, agents over MCP or A2A"
    EVALUATION = "evaluation", "An evaluation experiment's item"
    SCHEDULE = "schedule", "A schedule's slot"
    WEBHOOK = "webhook", "An inbound webhook"


class Run(TenantOwnedModel):
    """One user message and the agent's work answering it.

    A *sub-run* (``parent_tool_call`` set) is a skill's work answering one tool call of
    another run: same session and user, its own messages (excluded from the session's
    history), executed inside the parent's tool call.
    """

    session = models.ForeignKey(ChatSession, on_delete=models.CASCADE, related_name="runs")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    status = models.CharField(max_length=20, choices=RunStatus.choices, default=RunStatus.QUEUED, db_index=True)
    input = models.TextField()
    reply = models.TextField(blank=True)
    error = models.TextField(blank=True, help_text="Human-readable reason a run failed.")
    reason = models.CharField(max_length=40, blank=True, choices=RunFailureReason.choices)
    purpose = models.CharField(
        max_length=12, choices=RunPurpose.choices, default=RunPurpose.CHAT,
        help_text="Where the run came from (its entry point); a sub-run has its parent's.",
    )
    loop_count = models.PositiveIntegerField(default=0, help_text="Model turns taken.")
    prompt_tokens = models.PositiveIntegerField(default=0, help_text="Sum over the run's LLM calls.")
    completion_tokens = models.PositiveIntegerField(default=0, help_text="Sum over the run's LLM calls.")
    cost_usd_micros = models.BigIntegerField(default=0, help_text="Sum over the run's LLM calls, micro-USD.")
    attempt = models.PositiveIntegerField(default=0, help_text="Times a worker started this run.")
    heartbeat_at = models.DateTimeField(
        null=True, blank=True, help_text="Last sign of life of the worker running it (every few seconds)."
    )
    held_back = models.BooleanField(
        default=False, db_default=False,
        help_text="Queued, and its last claim was refused because its tenant had every run slot taken: the next run "
                  "of the tenant to end or pause hands it to a worker (sessions.runs.claim).",
    )
    steer = models.BooleanField(default=False, help_text="Posted to an agent in steer mode while a run was busy.")
    steered_into = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="steered_runs",
        help_text="The running run this message was handed to; this run ends as that one does.",
    )
    parent_tool_call = models.OneToOneField(
        "ToolCall", null=True, blank=True, on_delete=models.CASCADE, related_name="sub_run",
        help_text="Sub-runs (skills): the parent run's tool call this run answers; null for a user's run.",
    )
    depth = models.PositiveSmallIntegerField(
        default=0, help_text="0 for a user's run; a sub-run's is its parent's + 1 (at most SKILL_MAX_DEPTH).",
    )
    skill = models.ForeignKey(
        "capabilities.Skill", null=True, blank=True, on_delete=models.SET_NULL, related_name="runs",
        help_text="Sub-runs: the skill they run.",
    )
    superseded_at = models.DateTimeField(
        null=True, blank=True,
        help_text="Edited or regenerated away (truncation): hidden from the chat, its messages removed from the "
                  "history; the row stays for usage and the console.",
    )
    context = models.JSONField(
        null=True, blank=True,
        help_text="Blocks the bound capabilities added to the model input when the run started (retrieved passages, "
                  "memories): [{source, title, text, data}]; null until the run first starts.",
    )
    attributions = models.JSONField(
        null=True, blank=True,
        help_text="The platform's attribution of an answer that cites none of its passages: [{sentence_start, "
                  "sentence_end, n, chunk_id, score}] (offsets in reply; knowledge.attribution); null: not attempted "
                  "(the answer cites, there was no passage, or attribution failed).",
    )
    request_options = models.JSONField(
        null=True, blank=True,
        help_text="What the API caller asked of this run beside the agent's configuration (the OpenAI-compatible "
                  "API): {client_tools: [{name, description, parameters}], instructions, response_format}; null: "
                  "nothing (sessions.runner.spec.RunRequestOptions).",
    )
    agent_version = models.ForeignKey(
        "agents.AgentVersion", null=True, blank=True, on_delete=models.SET_NULL, related_name="+",
        help_text="The agent's version this run runs, resolved once when the run is created (agents.versions).",
    )
    routing = models.JSONField(
        null=True, blank=True,
        help_text="Runs of agents with routing rules: the model route chosen, each time it changed: [{turn, rule, "
                  "route}] (rule \"\": none matched, the agent's own route; agents.routing).",
    )
    structured = models.JSONField(
        null=True, blank=True,
        help_text="A completed run with an output format (the agent's output schema or the caller's response_format): "
                  "its answer parsed (sessions.runner.structured_output); null otherwise.",
    )
    paused_at = models.DateTimeField(null=True, blank=True, help_text="When it began waiting for an approval.")
    paused_seconds = models.FloatField(default=0.0, help_text="Time spent waiting for approvals (not counted by the run timeout).")
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta(TenantOwnedModel.Meta):
        ordering = ["created_at", "id"]
        indexes = [
            models.Index(fields=["session", "status"]),
            # Every claim counts the tenant's running runs; every finish looks for its queued ones.
            models.Index(fields=["tenant", "status"], name="sessions_run_tenant_status"),
        ]

    def __str__(self) -> str:
        return f"Run {self.pk} ({self.status})"


class MessageRole(models.TextChoices):
    USER = "user"
    ASSISTANT = "assistant"
    TOOL = "tool"


class Message(TenantOwnedModel):
    """One message of the session history, in the canonical (OpenAI chat) shape."""

    session = models.ForeignKey(ChatSession, on_delete=models.CASCADE, related_name="messages")
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="messages")
    position = models.PositiveIntegerField(help_text="Order within the session.")
    role = models.CharField(max_length=16, choices=MessageRole.choices)
    content = models.TextField(blank=True)
    reasoning = models.TextField(blank=True, help_text="Assistant messages: reasoning output, never sent back.")
    tool_calls = models.JSONField(
        default=list, blank=True, help_text="Assistant messages: [{id, name, arguments (JSON text)}]."
    )
    tool_call_id = models.CharField(max_length=100, blank=True, help_text="Tool messages: the call answered.")
    name = models.CharField(max_length=64, blank=True, help_text="Tool messages: the tool's exposed name.")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta(TenantOwnedModel.Meta):
        ordering = ["session", "position"]
        constraints = [models.UniqueConstraint(fields=["session", "position"], name="message_unique_position")]


class ToolCallStatus(models.TextChoices):
    PENDING = "pending"
    AWAITING_APPROVAL = "awaiting_approval"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    CANCELLED = "cancelled"


class ToolCall(TenantOwnedModel):
    """One tool call the model asked for, and what came of it."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="tool_calls")
    turn = models.PositiveIntegerField(help_text="The model turn (0-based) that asked for it.")
    call_id = models.CharField(max_length=100, help_text="The model's id for the call.")
    name = models.CharField(max_length=100, help_text="Exposed name, as the model called it.")
    arguments = models.JSONField(default=dict, blank=True)
    arguments_raw = models.TextField(blank=True, help_text="Arguments as the model wrote them.")
    status = models.CharField(max_length=20, choices=ToolCallStatus.choices, default=ToolCallStatus.PENDING)
    result = models.TextField(blank=True)
    result_data = models.JSONField(null=True, blank=True)
    error = models.TextField(blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    duration_ms = models.PositiveIntegerField(null=True, blank=True)
    server_log = models.JSONField(
        default=list, blank=True,
        help_text="An MCP server's log messages during the call, at or above its binding's log_level: "
                  "[{level, logger, data, at}] (the run trace shows them; the model never sees them).",
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta(TenantOwnedModel.Meta):
        ordering = ["run", "turn", "id"]
        constraints = [models.UniqueConstraint(fields=["run", "call_id"], name="toolcall_unique_call")]


class LLMCall(TenantOwnedModel):
    """One attempt of one model call against one route entry (fallbacks are further rows).

    ``purpose`` says what the call was for: a run's model turn (``turn``: ``run`` and ``turn``
    set), or a call outside a run's turns (a chat title, memory extraction, a knowledge
    search's query rewrite or rerank: ``run`` and ``turn`` empty; ``llm.metering``). ``agent``
    and ``user`` say whom it served, so usage by agent and by user does not need the run.
    The row outlives its run (``run`` set NULL when a purged chat's runs are deleted), its
    agent and its user: spent money stays in the month it was spent.
    """

    run = models.ForeignKey(Run, null=True, blank=True, on_delete=models.SET_NULL, related_name="llm_calls")
    turn = models.PositiveIntegerField(null=True, blank=True, help_text="The run's 0-based turn; empty outside a run.")
    purpose = models.CharField(max_length=16, choices=LLMCallPurpose.choices, default=LLMCallPurpose.TURN)
    agent = models.ForeignKey(
        "agents.AgentInstance", null=True, blank=True, on_delete=models.SET_NULL, related_name="+",
    )
    user = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                             related_name="+")
    attempt = models.PositiveIntegerField(help_text="1-based within the turn, across entries.")
    route_entry = models.ForeignKey(
        "llm.ModelRouteEntry", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    entry_index = models.PositiveIntegerField()
    provider_name = models.CharField(max_length=100)
    model = models.CharField(max_length=200)
    status = models.CharField(max_length=16)
    error_class = models.CharField(max_length=32, blank=True)
    error = models.TextField(blank=True)
    latency_ms = models.PositiveIntegerField(default=0)
    first_token_ms = models.PositiveIntegerField(null=True, blank=True)
    prompt_tokens = models.PositiveIntegerField(default=0)
    completion_tokens = models.PositiveIntegerField(default=0)
    usage_estimated = models.BooleanField(default=False)
    cost_usd_micros = models.BigIntegerField(default=0, help_text="Tokens × the entry's prices, micro-USD.")
    retry_wait_ms = models.PositiveIntegerField(default=0, help_text="Backoff waited before this attempt.")
    rolled_up = models.BooleanField(
        default=False, db_default=False, editable=False,
        help_text="Added to UsageMonth by the statement that wrote it (the runner's turn save); "
                  "the INSERT trigger adds every other call.",
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta(TenantOwnedModel.Meta):
        ordering = ["run", "created_at", "id"]
        verbose_name = "LLM call"
        indexes = [models.Index(fields=["tenant", "created_at"])]


class LLMCallBody(TenantOwnedModel):
    """The exact request and response bodies of one :class:`LLMCall` (one attempt): a tenant's
    "model call record", kept only while its ``Tenant.record_llm_bodies`` is on, for its
    ``llm_body_retention_days`` (:mod:`sessions.llm_bodies`). A table of its own: bodies hold
    whole conversations, and the hot ``LLMCall`` row stays small.

    ``request`` is the JSON body sent to the provider exactly as sent (messages, tools and
    parameters after the adapter's translation; never a header, so never the API key, which
    is also redacted should a body hold it); ``response`` the provider's answer as JSON (a
    stream assembled: content, tool calls, finish reason, usage), empty when none came. Each is
    cut at ``LLM_BODY_MAX_BYTES`` of UTF-8 (``*_truncated``; ``*_bytes`` is the size before
    the cut). Written with its call: in the same statement on the runner's path.
    """

    llm_call = models.OneToOneField(LLMCall, on_delete=models.CASCADE, related_name="body")
    request = models.TextField(help_text="The JSON body sent to the provider, as sent.")
    request_bytes = models.PositiveIntegerField(default=0, help_text="Its size before any cut, bytes of UTF-8.")
    request_truncated = models.BooleanField(default=False)
    response = models.TextField(blank=True, help_text="The answer as JSON (a stream assembled); empty: none came.")
    response_bytes = models.PositiveIntegerField(default=0, help_text="Its size before any cut, bytes of UTF-8.")
    response_truncated = models.BooleanField(default=False)
    created_at = models.DateTimeField(help_text="When the call's row was written; retention counts from here.")

    class Meta(TenantOwnedModel.Meta):
        ordering = ["llm_call"]
        verbose_name = "model call record"
        indexes = [models.Index(fields=["tenant", "created_at"], name="llm_call_body_tenant_created")]


USAGE_MONTH_SHARDS = 8
"""Rows per tenant and month in :class:`UsageMonth` (a transaction writes to shard
``txid_current() % 8``)."""


class UsageMonth(TenantOwnedModel):
    """A tenant's LLM calls of one calendar month (UTC), summed: what the monthly budget is
    checked against on every model turn and metered call, without reading the month's calls.

    Written by PostgreSQL, in the writer's transaction, so the month's sums always equal its
    calls': the runner's turn save adds its LLM call in the same statement (a CTE of
    :data:`sessions.runs.statements.TURN_SAVE_SQL`; the row is written ``rolled_up``), a
    row-level trigger adds every other inserted call (``WHEN NOT rolled_up``: the runner's
    failed attempts, the ORM, :func:`sessions.llm_calls.llm_calls_record`, fixtures; migration
    ``0013_usage_month_runner_counts``), and statement-level triggers move an updated call
    (tokens, cost, ``created_at``, tenant) and subtract a deleted one (migration
    ``0009_usage_month``). A month is spread over :data:`USAGE_MONTH_SHARDS`
    rows, so concurrent runs of one tenant do not queue on one row lock: a transaction writes
    to shard ``txid_current() % 8`` (all its statements to one row, so two transactions never
    wait for each other's rows in opposite orders; concurrent transactions have different
    ids). One shard alone means nothing (it may even be negative after an update); read the
    month as the sum of its shards (:func:`sessions.selectors.tenant_month_cost_usd_micros`).
    """

    month = models.DateField(help_text="The month's first day (UTC).")
    shard = models.PositiveSmallIntegerField(help_text="The writing transaction's id % 8.")
    llm_calls = models.BigIntegerField(default=0)
    prompt_tokens = models.BigIntegerField(default=0)
    completion_tokens = models.BigIntegerField(default=0)
    cost_usd_micros = models.BigIntegerField(default=0)

    class Meta(TenantOwnedModel.Meta):
        ordering = ["tenant", "-month", "shard"]
        verbose_name = "usage month"
        constraints = [
            models.UniqueConstraint(fields=["tenant", "month", "shard"], name="usage_month_tenant_month_shard"),
        ]


class TodoStatus(models.TextChoices):
    PENDING = "pending"
    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"


class TodoPriority(models.TextChoices):
    HIGH = "high"
    MEDIUM = "medium"
    LOW = "low"


class Todo(TenantOwnedModel):
    """An item of the session's todo list, kept by the ``todo_write`` built-in tool."""

    session = models.ForeignKey(ChatSession, on_delete=models.CASCADE, related_name="todos")
    position = models.PositiveIntegerField()
    content = models.CharField(max_length=500)
    status = models.CharField(max_length=16, choices=TodoStatus.choices, default=TodoStatus.PENDING)
    priority = models.CharField(max_length=8, choices=TodoPriority.choices, default=TodoPriority.MEDIUM)

    class Meta(TenantOwnedModel.Meta):
        ordering = ["session", "position"]


class Compaction(TenantOwnedModel):
    """A summary that replaces the session's history up to a cursor.

    History sent to the model = the latest succeeded compaction's summary + the messages
    after its cursor (in (run, position) order). The cursor always follows a complete
    group (a user message, an answer, or an assistant message with all its tool results),
    so tool call/result pairs are never split.
    """

    session = models.ForeignKey(ChatSession, on_delete=models.CASCADE, related_name="compactions")
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="compactions")
    attempt = models.PositiveIntegerField(help_text="1-based within the model turn that needed it.")
    status = models.CharField(max_length=16)
    """succeeded | failed"""
    summary = models.TextField(blank=True)
    cursor_message = models.ForeignKey(
        Message, null=True, blank=True, on_delete=models.CASCADE, related_name="+",
        help_text="The last message the summary covers.",
    )
    messages_summarized = models.PositiveIntegerField(default=0)
    tokens_before = models.PositiveIntegerField(default=0, help_text="Estimated prompt tokens before.")
    tokens_after = models.PositiveIntegerField(default=0, help_text="Estimated prompt tokens after.")
    error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta(TenantOwnedModel.Meta):
        ordering = ["session", "id"]


class Artifact(TenantOwnedModel):
    """A file a run produced: a large tool output, an image from an MCP server, a screenshot.

    The bytes live in PostgreSQL (``content``); tools hand the model a handle
    (``artifact:<id>``) that ``read_artifact`` reads back in slices. Owned by the session's
    tenant and readable by the session's user through ``/api/v1/artifacts/<id>/``.
    """

    session = models.ForeignKey(ChatSession, on_delete=models.CASCADE, related_name="artifacts")
    run = models.ForeignKey(Run, null=True, blank=True, on_delete=models.SET_NULL, related_name="artifacts")
    tool_call = models.ForeignKey(
        ToolCall, null=True, blank=True, on_delete=models.SET_NULL, related_name="artifacts"
    )
    name = models.CharField(max_length=200, help_text="A file name, e.g. 'screenshot.png'.")
    mime_type = models.CharField(max_length=100, default="application/octet-stream")
    size_bytes = models.PositiveBigIntegerField(default=0)
    content = models.BinaryField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta(TenantOwnedModel.Meta):
        ordering = ["session", "id"]

    def __str__(self) -> str:
        return f"artifact:{self.pk} {self.name}"

    @property
    def is_text(self) -> bool:
        return self.mime_type.startswith("text/") or self.mime_type in TEXT_MIME_TYPES


TEXT_MIME_TYPES = frozenset({"application/json", "application/xml", "application/yaml", "application/x-ndjson"})


class ApprovalKind(models.TextChoices):
    TOOL_CALL = "tool_call", "Approve a tool call"
    QUESTION = "question", "Answer the agent's question (ask_user)"
    CLIENT_TOOL = "client_tool", "Run by the API client (its next request brings the result)"
    ELICITATION = "elicitation", "Answer an MCP server's request for input (a form or a URL)"
    SAMPLING = "sampling", "Approve an MCP server's use of the agent's model"
    CONNECTION = "connection", "Connect an account an MCP server needs (OAuth)"


class ApprovalStatus(models.TextChoices):
    PENDING = "pending"
    APPROVED = "approved"
    DENIED = "denied"
    ANSWERED = "answered"
    EXPIRED = "expired"


class ApprovalOnTimeout(models.TextChoices):
    """What an approval's expiry does (the rule's ``on_timeout``)."""

    FAIL_RUN = "", "Fail the run (approval_expired)"
    DENY = "deny", "Deny the call; the run goes on"
    APPROVE = "approve", "Approve the call; the run goes on"


class Approval(TenantOwnedModel):
    """A human decision a run waits for: approve/deny a tool call, or answer a question.

    Created by the runner when a binding's policy says ``ask`` (or a tool raised
    ApprovalRequired, or the model called ``ask_user``); the run then pauses
    (``awaiting_approval``) and no worker holds it. ``POST /api/v1/approvals/<id>/`` records
    the decision; when the run has no pending approval left it is queued again and resumes on
    any worker. Pending approvals past ``expires_at`` expire and fail the run
    (``approval_expired``).

    ``run`` is always a user's run (depth 0): the one that pauses and resumes. A tool call
    inside a skill's sub-run (``sub_run``, the call's own run) pauses the whole tree: the
    sub-runs above the call wait ``awaiting_approval`` inside their parents' calls, and the
    user's run resumes them on any worker once it is decided (``sessions.runner.subrun``).
    """

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="approvals")
    sub_run = models.ForeignKey(
        Run, null=True, blank=True, on_delete=models.CASCADE, related_name="+",
        help_text="The skill's sub-run whose tool call waits; empty for a call of the run itself.",
    )
    tool_call = models.OneToOneField(ToolCall, on_delete=models.CASCADE, related_name="approval")
    kind = models.CharField(max_length=16, choices=ApprovalKind.choices, default=ApprovalKind.TOOL_CALL)
    status = models.CharField(max_length=16, choices=ApprovalStatus.choices, default=ApprovalStatus.PENDING)
    tool_name = models.CharField(max_length=100)
    arguments = models.JSONField(default=dict, blank=True)
    reason = models.TextField(blank=True, help_text="Why approval is needed (the policy rule or the tool's reason).")
    question = models.TextField(blank=True, help_text="ask_user: the question for the user.")
    answer = models.TextField(blank=True, help_text="Denial reason, or the user's answer to a question.")
    elicitation = models.JSONField(
        null=True, blank=True,
        help_text="Kind elicitation: {request: {mode, message, schema, url, server, tool, ...}, action, content} "
                  "(capabilities.mcp.elicitation); action and content once answered.",
    )
    approvers = models.JSONField(
        default=dict, blank=True,
        help_text='Who may decide, resolved when asked: {"requester": bool, "roles": [role, ...], "user_ids": [id, ...]} '
                  "(the rule's approvers; members named by e-mail resolved to users of the tenant). "
                  "Empty: the run's user (the default).",
    )
    on_timeout = models.CharField(
        max_length=8, blank=True, choices=ApprovalOnTimeout.choices, default=ApprovalOnTimeout.FAIL_RUN,
        help_text="What happens at expires_at when nobody decided: the run fails (empty), or the call is denied "
                  "or approved and the run goes on.",
    )
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    decided_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta(TenantOwnedModel.Meta):
        ordering = ["run", "id"]
        indexes = [models.Index(fields=["status", "expires_at"])]

    @property
    def decided_on_timeout(self) -> bool:
        """Decided by its ``on_timeout`` (approved, or expired), not by a person."""
        return self.decided_by_id is None and self.decided_at is not None and self.decided_at >= self.expires_at

    def __str__(self) -> str:
        return f"Approval {self.pk} ({self.kind} {self.tool_name}: {self.status})"

    @property
    def skill_name(self) -> str | None:
        """The name of the skill whose sub-run asked, or None for a call of the run itself (or
        a deleted skill). Load with ``select_related("sub_run__skill")`` to save the queries."""
        if self.sub_run_id is None or self.sub_run.skill is None:
            return None
        return self.sub_run.skill.name


class TaskPushConfig(TenantOwnedModel):
    """An A2A push-notification config of a task (a run, :mod:`sessions.api.a2a.push`): where
    the task's state changes are POSTed (``url``, checked by the outbound address rules when
    set and at every delivery) and how the request authenticates to that receiver (``token``,
    sent as ``X-A2A-Notification-Token``; ``authentication``: ``Authorization: <scheme>
    <credentials>``). Token and credentials are encrypted with the tenant's data key. Set by the
    run's user through A2A; the deliveries are automations' :class:`WebhookDelivery` rows."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="push_configs")
    config_id = models.CharField(max_length=200, help_text="The config's id within its task (the task id if none).")
    url = models.URLField(max_length=2000)
    token_encrypted = models.TextField(blank=True)
    auth_scheme = models.CharField(max_length=64, blank=True, help_text="e.g. Bearer; blank: no Authorization.")
    auth_credentials_encrypted = models.TextField(blank=True)
    base_url = models.CharField(max_length=300, help_text="scheme://host of the A2A request (artifact links).")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta(TenantOwnedModel.Meta):
        ordering = ["run", "id"]
        constraints = [models.UniqueConstraint(fields=["run", "config_id"], name="task_push_config_unique_id")]

    def __str__(self) -> str:
        return f"push config {self.config_id} of task {self.run_id}"


class PinnedResource(TenantOwnedModel):
    """An MCP resource its user pinned to a chat: read at the start of every later run of the chat
    (as a resource attached to one message is, :mod:`capabilities.mcp.attached`), until unpinned.

    ``mcp_server`` is a server of the chat's agent's bindings when pinned; a pin whose server is
    no longer bound (or disabled) is kept but left out of runs (``sessions.pinned_resources``)."""

    session = models.ForeignKey(ChatSession, on_delete=models.CASCADE, related_name="pinned_resources")
    mcp_server = models.ForeignKey("capabilities.McpServer", on_delete=models.CASCADE, related_name="+")
    uri = models.CharField(max_length=2000, help_text="The resource's absolute URI (a template's, filled in).")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta(TenantOwnedModel.Meta):
        ordering = ["session", "id"]
        constraints = [models.UniqueConstraint(fields=["session", "mcp_server", "uri"],
                                               name="pinned_resource_unique_uri")]

    def __str__(self) -> str:
        return f"pin {self.uri} of chat {self.session_id}"
