"""The behaviours around a run's tool calls: wrapper toolsets, in one ordered list.

Every call of a run goes through :data:`INTERCEPTORS` (outermost first) to the run's named tools
(:class:`capabilities.toolsets.NamedToolset`: unknown names and invalid arguments fail there,
else the tool runs). Each entry is a :class:`capabilities.toolsets.WrapperToolset` subclass,
built as ``cls(wrapped)``; its ``call_tool`` may act before the call goes on, decide it
instead, or change its outcome:

1. :class:`ClientToolset`: a tool the API client runs itself (:class:`ClientTool`) is not run
   here: the call waits for the client's next request (:class:`ClientToolRequested`);
2. :class:`~capabilities.toolsets.ApprovalPolicyToolset`: the binding's rules allow, ask
   (the call waits for a human, nothing recorded as started) or deny;
3. :class:`~sessions.runner.guarding.GuardrailCallToolset`: the agent's tool-call guardrails
   (block the call, or mask its arguments);
4. :class:`CallStartToolset`: the call is recorded as started (``tool_call_started``);
5. :class:`OutputToolset`: NULs cleaned, the result compressed, stored as an artifact when
   still large, framed when untrusted;
6. :class:`~sessions.runner.guarding.GuardrailResultToolset`: the agent's tool-result guardrails
   (block the result, or mask it: what the output wrapper stores and frames is checked);
7. :class:`~capabilities.toolsets.TimeoutToolset`: the agent's per-tool timeout.

A new behaviour around tool calls is one such class plus its line here (the order is the
order calls go through them). The list is read when a run's toolset is built
(:class:`sessions.runner.toolset.Toolset`), so a test may replace it for one run.
"""

from __future__ import annotations

from typing import Any

from capabilities.tools import Tool, ToolContext, ToolError, ToolResult
from capabilities.toolsets import (
    SUCCEEDED,
    AbstractToolset,
    ApprovalPolicyToolset,
    TimeoutToolset,
    ToolInvocation,
    ToolOutcome,
    WrapperToolset,
)
from capabilities.untrusted import frame_untrusted  # the one framing (the knowledge MCP server's too)
from llm.sanitize import clean_json, clean_text
from llm.types import ToolSpec
from sessions.runner.compression import ARTIFACT_MIN_CHARS, artifact_preview, compress_result
from sessions.runner.guarding import GuardrailCallToolset, GuardrailResultToolset
from sessions.runner.tracing import TracingToolset

OWN_ERROR_CODES = frozenset({"invalid_arguments", "unknown_tool"})
"""ToolError codes whose message the platform wrote itself (about the model's own call): not
framed as outside data even for an untrusted tool."""


CLIENT_SOURCE = "client"
"""The :class:`~capabilities.toolsets.ToolOrigin` source of a tool the API client runs."""


class ClientToolRequested(Exception):
    """A call of a tool the API client runs itself: the call waits (an Approval of kind
    ``client_tool``, :func:`sessions.runner.tool_execution.execute_tool_calls`) and the run
    pauses until the client's next request brings its output (as an approval's decision)."""


class ClientTool(Tool):
    """A tool the API client declared (``tools`` of a chat completion or a response): offered
    to the model as an ordinary function (``spec``), never executed on the server
    (:class:`ClientToolset` stops its calls first)."""

    def __init__(self, spec: ToolSpec) -> None:
        self.spec = spec

    async def execute(self, arguments: dict[str, Any], context: ToolContext) -> ToolResult:
        raise ToolError(f"The tool {self.spec.name!r} runs in the API client, not on the server.")


class ClientToolset(WrapperToolset):
    """Outermost: a call of a :class:`ClientTool` (origin source :data:`CLIENT_SOURCE`) with
    arguments that parse raises :class:`ClientToolRequested` (nothing is recorded as started:
    the client runs it). A call whose arguments are not a JSON object goes on and fails below,
    so the model can correct it without a round trip to the client."""

    async def call_tool(self, call: ToolInvocation) -> ToolOutcome:
        origin = call.origin
        if origin is not None and origin.source == CLIENT_SOURCE and call.arguments_error is None:
            raise ClientToolRequested(call.name)
        return await self.wrapped.call_tool(call)


class CallStartToolset(WrapperToolset):
    """Records that the call starts (``call.on_start``: the run store's ``tool_call_start``,
    which publishes ``tool_call_started``) once the policy let it through, before the tool runs
    and outside its timeout."""

    async def call_tool(self, call: ToolInvocation) -> ToolOutcome:
        if call.on_start is not None:
            await call.on_start()
        return await self.wrapped.call_tool(call)


class OutputToolset(WrapperToolset):
    """What the outcome's text becomes before it is recorded and the model reads it.

    Outside text (command output, web pages, MCP results) may hold U+0000, which PostgreSQL
    refuses: cleaned here, where it enters, for the events and rows after it. A successful
    result is compressed (:mod:`sessions.runner.compression`), stored as an artifact when still
    large (``read_artifact`` is then offered for the rest of the run) and framed when its tool
    is untrusted (:func:`capabilities.untrusted.frame_untrusted`); an untrusted tool's error
    text (an MCP server's isError text, a command's stderr) is framed too, unless the platform
    wrote it (:data:`OWN_ERROR_CODES`). The result is kept whole in ``content``; what the model
    reads goes to ``model_content``.
    """

    async def call_tool(self, call: ToolInvocation) -> ToolOutcome:
        outcome = await self.wrapped.call_tool(call)
        outcome.content, outcome.data = clean_text(outcome.content), clean_json(outcome.data)
        outcome.error = clean_text(outcome.error)
        untrusted = call.tool is not None and call.tool.untrusted
        if outcome.status == SUCCEEDED:
            outcome.model_content = await _for_model(call, outcome.content, untrusted=untrusted)
        elif untrusted and outcome.code not in OWN_ERROR_CODES:
            outcome.model_content = f"Error: {frame_untrusted(outcome.error)}"
        return outcome


async def _for_model(call: ToolInvocation, content: str, *, untrusted: bool) -> str | None:
    """What the model reads of a successful result ``content`` (None: ``content`` itself)."""
    text = compress_result(content)
    if len(text) > ARTIFACT_MIN_CHARS:
        is_json = content.lstrip()[:1] in ("{", "[")
        artifact_id = await call.context.artifact_save(
            name=f"{call.name}-{call.context.tool_call_id}.{'json' if is_json else 'txt'}",
            mime_type="application/json" if is_json else "text/plain", data=content.encode("utf-8"),
        )
        text = artifact_preview(text, artifact_id=artifact_id, total_chars=len(content))
        if call.offer_tool is not None:
            call.offer_tool("read_artifact")
    if untrusted:
        text = frame_untrusted(text)
    return None if text == content else text


INTERCEPTORS: tuple[type[WrapperToolset], ...] = (
    ClientToolset,
    ApprovalPolicyToolset,
    TracingToolset,  # execute_tool spans while tracing (sessions/runner/tracing.py)
    GuardrailCallToolset,
    CallStartToolset,
    OutputToolset,
    GuardrailResultToolset,
    TimeoutToolset,
)
"""The wrappers every call of a run goes through, outermost first (see the module docstring)."""


def intercepted(base: AbstractToolset) -> AbstractToolset:
    """``base`` under every wrapper of :data:`INTERCEPTORS` (as it is now), the first outermost."""
    toolset = base
    for wrapper in reversed(INTERCEPTORS):
        toolset = wrapper(toolset)
    return toolset
