"""Chat sessions, runs and everything a run records.

A run is one user message and everything the agent did to answer it: model turns (LLMCall
rows, one per attempt), assistant and tool messages, tool calls. Everything needed to resume
a run lives here, in PostgreSQL.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models

from tenants.scoping import TenantOwnedModel


class ChatSession(TenantOwnedModel):
    """A conversation between one user and one agent."""

    agent = models.ForeignKey("agents.AgentInstance", on_delete=models.RESTRICT, related_name="sessions")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="chat_sessions")
    title = models.CharField(max_length=200, blank=True)
    next_position = models.PositiveIntegerField(default=0, help_text="Position of the next message.")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta(TenantOwnedModel.Meta):
        ordering = ["-updated_at", "-id"]
        verbose_name = "chat session"

    def __str__(self) -> str:
        return self.title or f"Session {self.pk}"


class RunStatus(models.TextChoices):
    QUEUED = "queued"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


ACTIVE_RUN_STATUSES = (RunStatus.QUEUED, RunStatus.RUNNING)
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
    INTERNAL = "internal_error", "Internal error"


class Run(TenantOwnedModel):
    """One user message and the agent's work answering it."""

    session = models.ForeignKey(ChatSession, on_delete=models.CASCADE, related_name="runs")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    status = models.CharField(max_length=20, choices=RunStatus.choices, default=RunStatus.QUEUED, db_index=True)
    input = models.TextField()
    reply = models.TextField(blank=True)
    error = models.TextField(blank=True, help_text="Human-readable reason a run failed.")
    reason = models.CharField(max_length=40, blank=True, choices=RunFailureReason.choices)
    loop_count = models.PositiveIntegerField(default=0, help_text="Model turns taken.")
    prompt_tokens = models.PositiveIntegerField(default=0, help_text="Sum over the run's LLM calls.")
    completion_tokens = models.PositiveIntegerField(default=0, help_text="Sum over the run's LLM calls.")
    cost_usd_micros = models.BigIntegerField(default=0, help_text="Sum over the run's LLM calls, micro-USD.")
    attempt = models.PositiveIntegerField(default=0, help_text="Times a worker started this run.")
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta(TenantOwnedModel.Meta):
        ordering = ["created_at", "id"]
        indexes = [models.Index(fields=["session", "status"])]

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
    status = models.CharField(max_length=16, choices=ToolCallStatus.choices, default=ToolCallStatus.PENDING)
    result = models.TextField(blank=True)
    result_data = models.JSONField(null=True, blank=True)
    error = models.TextField(blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    duration_ms = models.PositiveIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta(TenantOwnedModel.Meta):
        ordering = ["run", "turn", "id"]
        constraints = [models.UniqueConstraint(fields=["run", "call_id"], name="toolcall_unique_call")]


class LLMCall(TenantOwnedModel):
    """One attempt at one model turn against one route entry (fallbacks are further rows)."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="llm_calls")
    turn = models.PositiveIntegerField()
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
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta(TenantOwnedModel.Meta):
        ordering = ["run", "created_at", "id"]
        verbose_name = "LLM call"
        indexes = [models.Index(fields=["tenant", "created_at"])]


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
