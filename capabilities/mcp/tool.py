"""MCP tools as :class:`capabilities.tools.Tool`: one listed MCP tool behind its exposed name.

No Django imports. The runner builds these from a pooled session's catalogue and
``capabilities.naming.assign_exposed_names``; the runner only sees ``Tool``.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import copy
import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

import mcp_types

from capabilities.mcp.binding_config import elicitation_timeout_of, log_level_of, sampling_policy_of
from capabilities.mcp.call_hooks import CallHooks
from capabilities.mcp.config import McpServerConfig, check_timeout_seconds
from capabilities.mcp.elicitation import resume_arguments, resume_refusal
from capabilities.mcp.errors import account_refused
from capabilities.mcp.operations import McpToolInfo, ProgressCallback
from capabilities.mcp.results import render_block, stored_binary, tool_result
from capabilities.mcp.sampling import approved_sampling_answers, declined, is_sampling_answer
from capabilities.naming import EXPOSED_NAME_RE
from capabilities.tools import ConnectionForUser, InputForUser, Tool, ToolContext, ToolError, ToolResult
from llm.types import ToolSpec

logger = logging.getLogger(__name__)

MAX_DESCRIPTION_CHARS = 1_024
"""Longest description offered to the model; longer ones are cut and end with ``...``."""


def cap_description(description: str, *, max_chars: int = MAX_DESCRIPTION_CHARS) -> str:
    """``description`` stripped and cut to at most ``max_chars`` characters (ending ``...`` if cut)."""
    text = description.strip()
    if len(text) <= max_chars:
        return text
    return text[: max_chars - 3].rstrip() + "..."


def normalize_input_schema(schema: Any) -> dict[str, Any]:
    """Make an MCP input schema usable as function ``parameters``: an object schema.

    Args:
        schema: The server's ``inputSchema`` (anything; servers are not trusted).

    Returns:
        A deep copy that has ``"type": "object"`` and a ``"properties"`` dict. A missing or
        non-dict schema, or one whose type is not ``object``, becomes
        ``{"type": "object", "properties": {}}`` (logged at WARNING for the latter).
    """
    if not isinstance(schema, dict) or not schema:
        return {"type": "object", "properties": {}}
    schema_type = schema.get("type", "object")
    if schema_type != "object":
        logger.warning("MCP tool input schema has type %r, not 'object'; offering no parameters", schema_type)
        return {"type": "object", "properties": {}}
    out = copy.deepcopy(schema)
    out["type"] = "object"
    if not isinstance(out.get("properties"), dict):
        out["properties"] = {}
    return out


class McpCaller(Protocol):
    """What an McpTool calls through: a :class:`PooledSession` or an open :class:`McpConnection`."""

    config: McpServerConfig

    async def call_tool_raw(
        self,
        name: str,
        arguments: dict[str, Any],
        *,
        timeout_seconds: float,
        progress: ProgressCallback | None = None,
        resume: dict[str, Any] | None = None,
    ) -> mcp_types.CallToolResult: ...


def _decode_base64(data: str) -> bytes | None:
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        return None


async def result_for_model(
    result: mcp_types.CallToolResult, *, alias: str, tool_name: str, context: ToolContext
) -> ToolResult:
    """Map a successful MCP result to what the model sees, storing binary content as artifacts.

    - text blocks: verbatim, joined with newlines;
    - ``structuredContent``: ``ToolResult.data``; when there is no text block it also leads the
      text as JSON (servers usually repeat it as text themselves);
    - images, audio and embedded blob resources: stored with ``context.artifact_save`` (an
      ``Artifact`` row, an ``artifact_updated`` event; :func:`~capabilities.mcp.results.stored_binary`);
      the model reads ``[image: artifact:<id>, image/png, N bytes]`` or ``[resource <uri>:
      artifact:<id>, application/pdf, N bytes]`` (invalid base64: ``[image image/png: invalid
      base64 data, not stored]``); the chat app shows images and offers the others as downloads;
    - embedded text resources: a summary line followed by their text; resource links: one line
      (``[resource link <uri> "<title>" <type>]``).

    Raises:
        Whatever ``context.artifact_save`` raises (database errors).
    """
    parts: list[str] = []
    has_text = False
    for index, block in enumerate(result.content):
        binary = stored_binary(block, alias=alias, tool_name=tool_name, index=index)
        if binary is not None:  # images, audio, embedded blob resources: artifacts (downloads)
            label, mime_type, encoded, name = binary
            data = _decode_base64(encoded)
            if data is None:
                parts.append(f"[{label} {mime_type}: invalid base64 data, not stored]")
                continue
            artifact_id = await context.artifact_save(name=name, mime_type=mime_type, data=data)
            parts.append(f"[{label}: artifact:{artifact_id}, {mime_type}, {len(data)} bytes]")
            continue
        text, is_text = render_block(block)
        has_text = has_text or is_text
        parts.append(text)
    return tool_result(parts, has_text=has_text, data=result.structured_content)


PROGRESS_MIN_INTERVAL_SECONDS = 0.25
"""A call's progress notifications become at most 4 ``tool_call_progress`` events a second."""


class ProgressThrottle:
    """Which of one call's progress notifications are published: the first, then at most one
    per :data:`PROGRESS_MIN_INTERVAL_SECONDS`, and always the one that reaches its total (the
    bar's end). A dropped update is not sent later: the next one carries newer numbers.

    Args:
        clock: Monotonic seconds (``time.monotonic``; a test's own clock).
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._last: float | None = None

    def admit(self, done: float, total: float | None) -> bool:
        """Whether to publish the update ``done`` (of ``total``, if known)."""
        now = self._clock()
        finished = total is not None and total > 0 and done >= total
        if self._last is not None and now - self._last < PROGRESS_MIN_INTERVAL_SECONDS and not finished:
            return False
        self._last = now
        return True


def _cancelling() -> bool:
    """The current task is being cancelled (nothing more is awaited for it)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


async def _save_log(hooks: CallHooks, context: ToolContext) -> None:
    """Store the log messages the call kept (the run trace's); a failure is logged, not raised."""
    entries = hooks.take_entries()
    if not entries or context.store is None:
        return
    try:
        await context.store.tool_call_log_save(tool_call_id=context.tool_call_id, entries=entries)
    except Exception:  # noqa: BLE001 - the trace loses the messages, the call keeps its result
        logger.warning("MCP server %r: could not store %d log messages of tool call %s", hooks.server,
                       len(entries), context.tool_call_id, exc_info=True)


class McpTool(Tool):
    """One tool of an MCP server, offered to the model under ``exposed_name``.

    Calls go through ``connection`` (in the runner: the server's :class:`PooledSession`, which
    reconnects on its own; in tests also an open :class:`McpConnection`).
    """

    untrusted = True  # results come from an outside server

    def __init__(
        self,
        *,
        connection: McpCaller,
        info: McpToolInfo,
        exposed_name: str,
        call_timeout_seconds: float,
        binding_config: dict[str, Any] | None = None,
        account: dict[str, Any] | None = None,
    ) -> None:
        """Wrap a listed tool.

        Args:
            connection: A pooled session or open connection of the server that listed ``info``.
            info: The tool as the server listed it.
            exposed_name: The name the model sees (from ``assign_exposed_names``);
                must match ``^[a-zA-Z0-9_-]{1,64}$``.
            call_timeout_seconds: Bound on each call, positive and finite (a pooled session
                also applies the server's own ``call_timeout_seconds``; the shorter wins).
            binding_config: The binding's ``config`` (:mod:`capabilities.mcp.binding_config`:
                the server's log level kept, the time a person has to answer its
                elicitations, its sampling policy); None: the defaults.
            account: For a server reached with a person's (or the tenant's) OAuth connection:
                ``{server_id, server_name, auth_mode}``; a call the server refuses the account
                for then waits for the account to be connected again (:class:`ConnectionForUser`).
                None: such a call fails.

        Raises:
            ValueError: ``exposed_name`` or ``call_timeout_seconds`` is invalid.
        """
        if not EXPOSED_NAME_RE.match(exposed_name):
            raise ValueError(f"exposed_name must match ^[a-zA-Z0-9_-]{{1,64}}$, got {exposed_name!r}")
        check_timeout_seconds(call_timeout_seconds, what="call_timeout_seconds")
        self.connection = connection
        self.info = info
        self.call_timeout_seconds = call_timeout_seconds
        self.log_level = log_level_of(binding_config)
        self.sampling = sampling_policy_of(binding_config)
        self.elicitation_timeout_seconds = elicitation_timeout_of(binding_config)
        self.account = account
        description = info.description or (
            f"Tool {info.name!r} of the MCP server {connection.config.alias!r}."
        )
        self.spec = ToolSpec(
            name=exposed_name,
            description=cap_description(description),
            parameters=normalize_input_schema(info.input_schema),
        )

    async def execute(self, arguments: dict[str, Any], context: ToolContext) -> ToolResult:
        """Call the MCP tool (by its server name) with the model's arguments.

        Server progress notifications become ``tool_call_progress`` events
        (``context.progress``; at most 4 a second, :class:`ProgressThrottle`); images and audio
        become artifacts (see :func:`result_for_model`). Through a pooled session, the server's
        log messages at or above the binding's ``log_level`` are stored on the call
        (``context.store``: the run trace) and its sampling requests are answered by
        ``context.sample`` as the binding allows (:mod:`capabilities.mcp.call_hooks`). The
        server gets no tenant/session ids.

        Args:
            arguments: The model's arguments; the MCP server validates them.
            context: The call's context (progress events, artifacts).

        Returns:
            ``ToolResult(content, data)`` as mapped by :func:`result_for_model`.

        Raises:
            ToolError: ``mcp_tool_error`` (the tool reported an error: its text), ``timeout``
                (after ``call_timeout_seconds``), ``mcp_error`` (protocol/transport failure),
                ``mcp_connect_error`` or ``mcp_unavailable`` (circuit breaker open),
                ``elicitation_declined`` (the person refused to open the page a server asked for),
                ``sampling_declined`` (the person denied a 2026-07-28 server's sampling request).
            InputForUser: The server asks the person (form or URL elicitation, or the approval
                of a sampling request when the binding wants it); the call is executed again
                with ``context.input_answer`` once answered. An elicitation carries the
                binding's ``elicitation_timeout_seconds`` (``timeout_seconds``).
            ConnectionForUser: The server refused the OAuth account (``account`` set): the call,
                which did not run, waits for the account to be connected again, then is made again.
        """

        throttle = ProgressThrottle()

        async def progress(done: float, total: float | None, message: str | None) -> None:
            if not throttle.admit(done, total):
                return
            await context.progress(message or f"{self.info.name}: {done:g}" + (f"/{total:g}" if total else ""),
                                   progress=done, total=total)

        options: dict[str, Any] = {}
        answer = context.input_answer
        if answer is not None:  # executed again after the person answered the server
            options["resume"] = await self._resume(answer, context)
        hooks = None
        if getattr(self.connection, "holds_calls", False):  # a pooled session: 2025-11-25 calls may be held
            options["hold_key"] = context.tool_call_id
            if answer is not None and (answer.get("request") or {}).get("protocol") == "held":
                options["input_answer"] = answer
            options["hooks"] = hooks = CallHooks(server=self.connection.config.alias, tool=self.info.name,
                                                 log_level=self.log_level, sampling=self.sampling,
                                                 sample=context.sample,
                                                 elicitation_timeout_seconds=self.elicitation_timeout_seconds)
        try:
            result = await self.connection.call_tool_raw(
                self.info.name, arguments, timeout_seconds=self.call_timeout_seconds, progress=progress, **options
            )
        except InputForUser as exc:  # the person has the binding's time to answer the server
            if exc.request.get("type") != "sampling":
                exc.timeout_seconds = self.elicitation_timeout_seconds
            raise
        except ToolError as exc:
            refused = account_refused(exc) if self.account is not None else None
            if refused is None:
                raise
            raise ConnectionForUser({
                "type": "connection", **self.account, "server": self.connection.config.alias, "tool": self.info.name,
                "retry": True, "message": exc.message}) from exc
        finally:
            if hooks is not None and not _cancelling():
                await _save_log(hooks, context)
        return await result_for_model(
            result, alias=self.connection.config.alias, tool_name=self.info.name, context=context
        )

    async def _resume(self, answer: dict[str, Any], context: ToolContext) -> dict[str, Any] | None:
        """The retried call's ``resume`` for the person's answer (None: the call is made as it
        was, or the held call gets the answer). A 2026-07-28 sampling approval: the model
        answers the approved requests here (``context.sample``).

        Raises:
            ToolError: ``elicitation_declined`` (a URL the person would not open);
                ``sampling_declined`` (a sampling request the person denied, or nobody approved
                in time); ``sampling_refused`` (an approved request the binding or the model
                could not answer).
        """
        refusal = resume_refusal(answer)
        if refusal is not None:
            raise ToolError(refusal, code="elicitation_declined")
        request = answer.get("request") or {}
        if not is_sampling_answer(answer):
            return resume_arguments(answer) or None
        if request.get("protocol") != "input_required":
            return None
        alias = self.connection.config.alias
        replies = await approved_sampling_answers(answer, policy=self.sampling, sample=context.sample, server=alias)
        for reply in replies.values():
            if isinstance(reply, mcp_types.ErrorData):
                raise ToolError(reply.message, code="sampling_declined" if declined(reply) else "sampling_refused")
        return {"input_responses": replies, "request_state": request.get("request_state")}
