"""What one tool call does with what its server sends during it besides progress: log messages
(``notifications/message``) and sampling requests (:mod:`capabilities.mcp.sampling`).

A pooled session is shared by runs (and bindings), but the SDK hands a log message or a
2025-11-25 sampling request to the session, not to a request. The pool ties it to a call
only when exactly one call with hooks is in flight on the session
(:meth:`capabilities.mcp.pool.PooledSession.call_tool_raw`): a log message otherwise goes to the
worker's log at DEBUG, a sampling request is refused (the server may go on without it).
2026-07-28 sampling requests come back in the call's own result, so they are always the call's.

A binding that wants each sampling request approved (``sampling.require_approval``) asks the
person: on 2026-07-28 :meth:`CallHooks.ask_approval` stops the round with the question; on
2025-11-25 the request waits in the call held open (:attr:`CallHooks.held`), and a call that
is not held (a plain connection) is refused.

No Django imports.
"""

from __future__ import annotations

import asyncio
import contextvars
import datetime as dt
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import mcp_types

from capabilities.mcp.binding_config import DEFAULT_LOG_LEVEL, SamplingPolicy, log_level_rank
from capabilities.mcp.sampling import (
    SamplingAnswer,
    SamplingRefused,
    approved_sampling_answers,
    declined_message,
    is_sampling_answer,
    sampling_answer,
    sampling_question,
)
from capabilities.tools import ModelSampler

if TYPE_CHECKING:
    from capabilities.mcp.elicitation import HeldCall

logger = logging.getLogger(__name__)

MAX_LOG_DATA_CHARS = 2_000
"""A log message's ``data`` longer than this (as JSON) is kept as its first characters plus ``…``."""
MAX_LOG_ENTRIES_PER_CALL = 200
"""Log messages kept per call; later ones are counted in one last entry."""
MAX_LOGGER_CHARS = 200
HELD_GRACE_SECONDS = 60
"""A held call whose binding sets ``elicitation_timeout_seconds`` waits this much longer than
the approval lives: the sweeper's decline (every ``RUN_SWEEP_INTERVAL_SECONDS``) normally
reaches the server first, through the resumed run."""


def log_entry(params: mcp_types.LoggingMessageNotificationParams, *, now: dt.datetime | None = None) -> dict[str, Any]:
    """A server's log message as a trace entry: ``{level, logger, data, at}``.

    ``data`` stays the JSON value the server sent when its JSON is at most
    :data:`MAX_LOG_DATA_CHARS` characters; longer, it becomes that many characters of its JSON
    (a string) ending in ``…``. ``logger`` is cut to 200 characters; ``at`` is ISO 8601 (UTC).
    """
    data = params.data
    try:
        text = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        text = repr(data)
    if len(text) > MAX_LOG_DATA_CHARS:
        data = text[:MAX_LOG_DATA_CHARS] + "…"
    elif not isinstance(data, str):
        data = json.loads(text)  # only JSON values are stored
    return {
        "level": str(params.level), "logger": str(params.logger or "")[:MAX_LOGGER_CHARS], "data": data,
        "at": (now or dt.datetime.now(dt.UTC)).isoformat(),
    }


@dataclass(eq=False, slots=True)
class CallHooks:
    """One call's log sink and sampling answerer (created by :class:`capabilities.mcp.tool.McpTool`)."""

    server: str
    """The server's alias (for messages)."""
    tool: str = ""
    """The server's tool name (shown to a person approving a sampling request)."""
    log_level: str = DEFAULT_LOG_LEVEL
    """Keep messages at this level or above (the binding's ``log_level``)."""
    sampling: SamplingPolicy = field(default_factory=SamplingPolicy)
    sample: ModelSampler | None = None
    """The run's model route (``ToolContext.sample``); None: sampling is refused."""
    entries: list[dict[str, Any]] = field(default_factory=list)
    """The log messages kept so far (saved with the call by its tool)."""
    dropped: int = 0
    """Messages past :data:`MAX_LOG_ENTRIES_PER_CALL`."""
    caller_context: contextvars.Context = field(default_factory=contextvars.copy_context)
    """The calling task's context variables (its tenant scope, the run's ports, the trace),
    copied when the hooks are made: a sampling request arrives in the pool's own task and is
    answered in this context."""
    held: HeldCall | None = None
    """The 2025-11-25 call held open while a person approves its sampling request (set by the
    pool); None: such a request cannot be approved here and is refused."""
    elicitation_timeout_seconds: int | None = None
    """The binding's ``elicitation_timeout_seconds`` (None: unset): a held 2025-11-25 call
    waits for the person's answer to its server's ``elicitation/create`` that long plus
    :data:`HELD_GRACE_SECONDS` (:attr:`HeldCall.elicitation_wait_seconds`)."""

    def needs_approval(self) -> bool:
        """Whether a sampling request waits for a person (the binding allows sampling, asks for
        approval, and a run's model could answer)."""
        return self.sampling.allowed and self.sampling.require_approval and self.sample is not None

    def ask_approval(self, requests: dict[str, mcp_types.CreateMessageRequestParams],
                     request_state: str | None) -> None:
        """2026-07-28 (:func:`capabilities.mcp.sampling.answer_sampling_rounds`' ``ask``):
        raise the person's question for the round when the binding wants approval; return
        otherwise.

        Raises:
            InputForUser: the question (:func:`sampling_question`, ``protocol: input_required``).
            SamplingRefused: a request the binding refuses anyway.
        """
        if self.needs_approval():
            raise sampling_question(requests, policy=self.sampling, server=self.server, tool_name=self.tool,
                                    protocol="input_required", request_state=request_state)

    def wants(self, level: str) -> bool:
        """Whether a message at ``level`` is kept."""
        return log_level_rank(level) >= log_level_rank(self.log_level)

    def log(self, params: mcp_types.LoggingMessageNotificationParams) -> None:
        """Keep the server's log message if its level is high enough (bounded, see the constants)."""
        if not self.wants(params.level):
            return
        if len(self.entries) < MAX_LOG_ENTRIES_PER_CALL:
            self.entries.append(log_entry(params))
        else:
            self.dropped += 1

    def take_entries(self) -> list[dict[str, Any]]:
        """The kept messages (and a last ``{level: "warning", logger: "agent-platform", data}``
        entry counting the dropped ones), emptied."""
        entries, self.entries = self.entries, []
        if self.dropped:
            entries.append({"level": "warning", "logger": "agent-platform",
                            "data": f"{self.dropped} more log messages of this call were not kept",
                            "at": dt.datetime.now(dt.UTC).isoformat()})
            self.dropped = 0
        return entries

    async def answer_sampling(self, params: mcp_types.CreateMessageRequestParams) -> SamplingAnswer:
        """The answer to the server's sampling request (:func:`sampling_answer`), computed in
        :attr:`caller_context` (a task of its own, cancelled with the one awaiting it)."""
        if self.needs_approval():
            return await self._held_answer(params)
        answer = sampling_answer(params, policy=self.sampling, sample=self.sample, server=self.server)
        return await asyncio.get_running_loop().create_task(answer, context=self.caller_context.copy())

    async def _held_answer(self, params: mcp_types.CreateMessageRequestParams) -> SamplingAnswer:
        """2025-11-25 with approval: the held call waits for the person; their decision's
        answer (the model's, or an error saying they declined; declined after the held call's
        wait)."""
        try:
            question = sampling_question({"": params}, policy=self.sampling, server=self.server, tool_name=self.tool,
                                         protocol="held")
        except SamplingRefused as exc:
            return mcp_types.ErrorData(code=mcp_types.INVALID_REQUEST, message=str(exc))
        if self.held is None:
            return mcp_types.ErrorData(code=mcp_types.INVALID_REQUEST, message=(
                f"MCP server {self.server!r}: each sampling request needs a person's approval, which cannot be "
                "asked for this call (several calls of the session in flight, or a connection outside the pool)."))
        timeout_answer = mcp_types.ErrorData(code=mcp_types.INVALID_REQUEST, message=declined_message(self.server))
        return await self.held.ask(params, question=question, timeout_answer=timeout_answer)


def held_reply(answer: dict[str, Any], hooks: CallHooks | None) -> Callable[[], Awaitable[SamplingAnswer]] | None:
    """For a held 2025-11-25 call (:func:`capabilities.mcp.elicitation.held_call_answer`): what
    makes the server's answer to a decided sampling approval (``answer``; the model is called
    by the resumed run, ``hooks.sample``), or None for an elicitation's answer."""
    if not is_sampling_answer(answer):
        return None

    async def reply() -> SamplingAnswer:
        sample, policy, server = (hooks.sample, hooks.sampling, hooks.server) if hooks is not None else (None, None, "")
        replies = await approved_sampling_answers(answer, policy=policy or SamplingPolicy(), sample=sample,
                                                  server=server or str((answer.get("request") or {}).get("server")))
        return next(iter(replies.values()), mcp_types.ErrorData(code=mcp_types.INVALID_REQUEST,
                                                                message="No sampling request was asked."))

    return reply


def only_call(hooks: set[CallHooks], what: str, alias: str) -> CallHooks | None:
    """The one call in flight with hooks, or None (logged at DEBUG: ``what`` could not be tied
    to one call)."""
    if len(hooks) == 1:
        return next(iter(hooks))
    logger.debug("MCP server %r: %s with %d calls in flight; not tied to a call", alias, what, len(hooks))
    return None


LoggingCallback = Callable[[mcp_types.LoggingMessageNotificationParams], Awaitable[None]]
SamplingCallback = Callable[[Any, mcp_types.CreateMessageRequestParams], Awaitable[SamplingAnswer]]
