"""The one Tool interface every capability kind implements.

A tool is what the model can call: an exposed name, a description (a prompt: the model reads
it), a JSON Schema for its arguments, and an async ``execute``. MCP tools, built-in tools,
CLI commands and browser operations all implement :class:`Tool`; the runner knows nothing
else about them.
"""

from __future__ import annotations

import abc
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from llm.types import ChatMessage, Completion, ToolSpec


class ApprovalRequired(Exception):
    """Raised by a tool that found, while executing, that this call needs a human's approval.

    Example: ``browser_type`` into a password field. The runner turns the call into an
    approval request (the run pauses ``awaiting_approval``, the worker is freed); once
    approved, the call is executed again with ``ToolContext.approved`` set. A tool must raise
    this before it has any side effect.
    """

    def __init__(self, reason: str, *, rule: Mapping[str, Any] | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        """Shown to the approver: why this call needs approval."""
        self.rule = rule
        """The approval rule that asked (``{pattern, action, approvers?, message?,
        timeout_seconds?, on_timeout?}``, :func:`capabilities.toolsets.approval_rule`), or None
        when the tool itself asks: then the run's user decides within the default timeout."""


class QuestionForUser(Exception):
    """Raised by a tool (``ask_user``) to pause the run until the user answers ``question``.

    The runner records a pending question (an Approval of kind ``question``) and pauses the
    run like an approval; the user's answer becomes the call's result. The tool is not called
    again.
    """

    def __init__(self, question: str) -> None:
        super().__init__(question)
        self.question = question


class InputForUser(Exception):
    """Raised by a tool whose server asks the person for input (an MCP server's elicitation:
    a form to fill in, or a URL to open).

    The runner records a pending Approval of kind ``elicitation`` holding ``request`` and
    pauses the run like an approval (no worker holds it). Once the person answered (or the
    wait ended: a decline), the call is executed again with ``ToolContext.input_answer`` set
    to ``{"request": request, "action": "accept" | "decline" | "cancel", "content": {...}}``.

    A request with ``type: "sampling"`` asks the person to approve the server's use of the
    agent's model instead (:func:`capabilities.mcp.sampling.sampling_question`): its Approval
    is of kind ``sampling``, decided approve or deny, and the answer is ``{"request", "action":
    "accept" | "decline", "reason"}``.
    """

    def __init__(self, request: dict[str, Any]) -> None:
        super().__init__(request.get("message", ""))
        self.request = request
        """JSON: ``{mode: "form" | "url", message, schema, url, server, tool, ...}``
        (:mod:`capabilities.mcp.elicitation`)."""
        self.timeout_seconds: int | None = None
        """How long the person has to answer (the binding's ``elicitation_timeout_seconds``,
        set by the MCP tool); None: the ``APPROVAL_TTL_SECONDS`` setting. Unanswered by then,
        the server gets ``decline``."""


class ConnectionForUser(Exception):
    """Raised by a tool that cannot go on until a person connects an account: an OAuth MCP
    server nobody has connected yet (its stand-in ``<alias>__connect`` tool,
    :mod:`capabilities.mcp_oauth.runs`), or one whose server refused the account during a call.

    The runner records a pending Approval of kind ``connection`` holding ``request`` and pauses
    the run like an approval (no worker holds it); the chat app shows a card with Connect and
    Continue without. The connection being made answers it (the run resumes); declined, the
    call fails saying so. ``request["retry"]``: the call is executed again once connected (a
    refused call; it had not run), else the call's result says the server's tools are ready
    (the stand-in). In a run nobody watches the call fails with ``request["message"]``.
    """

    def __init__(self, request: dict[str, Any]) -> None:
        super().__init__(request.get("message", ""))
        self.request = request
        """JSON: ``{type: "connection", server (alias), server_id, server_name, auth_mode
        ("oauth_user" | "oauth_tenant"), message, tool, retry}``."""


class ToolError(Exception):
    """A tool failed in a way the model should hear about.

    The message goes back to the model as the failed tool call's result, so write it for the
    model: say what went wrong and, where possible, what to do instead.
    """

    def __init__(self, message: str, *, code: str = "tool_error") -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        """Short machine-readable reason, e.g. ``mcp_error``, ``timeout``, ``invalid_arguments``."""


@dataclass(frozen=True, slots=True)
class ToolResult:
    """What a successful tool call returns."""

    content: str
    """Text the model sees as the tool result."""
    data: Any = None
    """Optional structured result (JSON-serialisable), stored beside the text and shown in the UI."""


@dataclass(frozen=True, slots=True)
class StoredArtifact:
    """An artifact as :meth:`SessionStore.artifact_create` stored it."""

    artifact_id: int
    name: str
    """File name, at most 200 characters (cut)."""
    mime_type: str
    size_bytes: int
    """Bytes stored (the data is cut at the store's limit, 20 MiB for the session store)."""


@dataclass(frozen=True, slots=True)
class SamplingRequest:
    """A model call a tool's outside server asked for during the call (MCP sampling), made
    through the run's model route by :attr:`ToolContext.sample`."""

    messages: tuple[ChatMessage, ...]
    """The conversation to complete (a system message first when the server gave a prompt)."""
    tools: tuple[ToolSpec, ...] = ()
    """Tools offered to the model (the server runs them: their calls come back in the answer)."""
    max_output_tokens: int = 1024
    """The answer's cap, in tokens."""
    source: str = ""
    """Who asked (an MCP server's alias), for messages."""


ModelSampler = Callable[[SamplingRequest], Awaitable[Completion]]
"""``await sample(request)``: the run's model route answers ``request`` (its LLM calls recorded
with purpose ``sampling``, counted in the run's usage and budgets).

Raises:
    ToolError: ``budget_exceeded`` when the request would exceed the run's or the tenant's budget
        (no model called).
    llm.errors.LLMError: every route entry failed.
"""


class SessionStore(Protocol):
    """The session data tools may touch, given to them through :class:`ToolContext` (a port).

    ``capabilities`` sits below ``sessions`` in the layer order (ARCHITECTURE.md, "Layers";
    enforced by import-linter), so a tool never imports ``sessions``: the runner passes its
    implementation (:class:`sessions.tool_store.SessionToolStore`) as ``ToolContext.store``.
    Every method runs on the event loop and does its own database work off it. Tenant scoping
    is the caller's: the runner has set the tenant scope for the current task.
    """

    async def artifact_create(
        self, *, tenant_id: int, session_id: int, run_id: int | None, tool_call_id: int | None,
        name: str, mime_type: str, data: bytes,
    ) -> StoredArtifact:
        """Store ``data`` as an artifact of the session (and call); publish nothing.

        Raises:
            Whatever the database raises (e.g. the session does not exist).
        """
        ...

    async def artifact_text(self, *, session_id: int, artifact_id: int) -> tuple[str, str, str | None] | None:
        """``(name, mime_type, text)`` of an artifact of this session (``text`` None: binary).

        Returns None when the session has no artifact ``artifact_id`` (another session's is
        "not found" too).
        """
        ...

    async def tool_call_log_save(self, *, tool_call_id: int, entries: list[dict[str, Any]]) -> None:
        """Append ``entries`` (``{level, logger, data, at}``: an outside server's log messages
        during the call) to the call's ``server_log`` (shown in the run trace, never to the model).
        """
        ...

    async def todos_replace(self, *, session_id: int, todos: list[dict[str, str]]) -> list[dict[str, str]]:
        """Replace the session's todo list with ``todos`` (``{content, status, priority}``, validated).

        Returns:
            The list as stored.
        """
        ...


def _no_store() -> SessionStore:
    raise ToolError("This tool needs the session's storage, which is not available here.", code="unavailable")


@dataclass(slots=True)
class ToolContext:
    """What a tool may know about the call it serves.

    Built by the runner for each call. Tools must not reach for tenant data outside
    ``tenant_id``; the runner has already set the tenant scope for the current task.
    """

    tenant_id: int
    session_id: int
    run_id: int
    tool_call_id: int
    """Primary key of the ToolCall row."""
    publish: Callable[[str, dict[str, Any]], Awaitable[None]] = field(default=None)  # type: ignore[assignment]
    """``await publish(event_type, data)`` puts an event on the session stream."""
    user_id: int | None = None
    """The user whose message started the run (browser commands go to this user's devices)."""
    approved: bool = False
    """True when a human approved this very call (after the tool raised ApprovalRequired, or
    the binding's policy said ``ask``)."""
    depth: int = 0
    """Sub-run depth: 0 for a user's run, 1 for a skill called from it, and so on."""
    input_answer: dict[str, Any] | None = None
    """The person's answer to this call's elicitation (:class:`InputForUser`), when the call is
    executed again after it: ``{"request", "action", "content"}``; None otherwise."""
    store: SessionStore | None = None
    """The session's artifacts and todos (the runner's :class:`SessionStore`); None outside a
    run, where tools that need it fail with ToolError ``unavailable``."""
    sample: ModelSampler | None = None
    """The run's model route for a tool's server that asks for a completion (MCP sampling);
    None outside a run (the server's request is then refused)."""

    def session_store(self) -> SessionStore:
        """The :attr:`store`.

        Raises:
            ToolError: ``unavailable`` when this context has none.
        """
        return self.store if self.store is not None else _no_store()

    async def progress(self, message: str, *, progress: float | None = None, total: float | None = None) -> None:
        """Publish a ``tool_call_progress`` event for this call.

        Args:
            message: Human-readable status ("42 lines of output", "connecting…").
            progress: Units done so far, if known. total: Units in all, if known.
        """
        if self.publish is None:
            return
        await self.publish("tool_call_progress", {
            "tool_call_id": self.tool_call_id, "message": message, "progress": progress, "total": total,
        })

    async def artifact_save(self, *, name: str, mime_type: str, data: bytes) -> int:
        """Store ``data`` as an artifact of this session and call; publish ``artifact_updated``.

        Returns:
            The artifact id (the model reads it back with ``read_artifact``).

        Raises:
            ToolError: ``unavailable`` when this context has no :attr:`store`.
        """
        artifact = await self.session_store().artifact_create(
            tenant_id=self.tenant_id, session_id=self.session_id, run_id=self.run_id,
            tool_call_id=self.tool_call_id, name=name, mime_type=mime_type, data=data,
        )
        if self.publish is not None:
            await self.publish("artifact_updated", {
                "artifact_id": artifact.artifact_id, "name": artifact.name, "mime_type": artifact.mime_type,
                "size_bytes": artifact.size_bytes, "tool_call_id": self.tool_call_id,
            })
        return artifact.artifact_id


class Tool(abc.ABC):
    """A callable capability as the model sees it."""

    spec: ToolSpec
    """Exposed name, description and argument schema."""

    untrusted: bool = False
    """True when results come from outside the platform (web pages, MCP servers, CLI output):
    the runner then frames them as data with a per-call nonce before the model sees them
    (:func:`sessions.runner.tool_execution.frame_untrusted`)."""

    call_first: bool = False
    """True when a run's first model turn must call this tool (tool choice = its name; the
    choice goes back to auto after that turn): e.g. ``knowledge_search`` of a binding with
    ``search_first`` (:func:`sessions.runner.turn.turn_tool_choice`)."""

    @abc.abstractmethod
    async def execute(self, arguments: dict[str, Any], context: ToolContext) -> ToolResult:
        """Run the tool.

        Args:
            arguments: The model's arguments, already parsed from JSON (not yet schema-checked).
            context: Ids of the tenant, session, run and tool call, and an event publisher.

        Returns:
            The result the model sees.

        Raises:
            ToolError: A failure the model should be told about (recorded as a failed call).
            ApprovalRequired: This call needs a human's approval first (raised before any
                side effect; the call is executed again once approved).
        """
