"""MCP sampling: a server's ``sampling/createMessage`` during one of our tool calls, answered by
the run's own model route (:attr:`capabilities.tools.ToolContext.sample`) when the binding
allows it (:class:`~capabilities.mcp.binding_config.SamplingPolicy`).

Two wires carry the request (spec: "Sampling", MCP 2025-11-25; SEP-2322 for 2026-07-28):

- 2025-11-25 and earlier: a standalone server-to-client request inside the open call; the pool
  ties it to the one call in flight on the session (:mod:`capabilities.mcp.call_hooks`) and
  answers it, or answers an MCP error the server may handle (the call goes on);
- 2026-07-28: an ``InputRequiredResult`` whose ``input_requests`` hold the
  ``CreateMessageRequest`` s; they are answered and the call sent again with the responses
  (:func:`answer_sampling_rounds`). That wire has no way to refuse one request, so a refusal
  fails the call with the reason (the model reads it).

The request's messages become our canonical chat messages (text, images; a ``tool_use`` block
an assistant tool call, a ``tool_result`` block a tool message); audio is described, not sent.
The answer is ``CreateMessageResult`` (text) or, when the request offered tools,
``CreateMessageResultWithTools`` with the model's ``tool_use`` blocks (``stopReason:
toolUse``): the server runs its own tools and may ask again. No Django imports.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import mcp_types

from capabilities.mcp.binding_config import SamplingPolicy
from capabilities.naming import EXPOSED_NAME_RE
from capabilities.tools import ModelSampler, SamplingRequest, ToolError
from llm.errors import LLMError, public_error_message
from llm.types import IMAGE_MIME_TYPES, ChatMessage, Completion, ImagePart, ToolCallRequest, ToolSpec

logger = logging.getLogger(__name__)

MAX_SAMPLING_ROUNDS = 10
"""How many ``InputRequiredResult`` rounds of sampling one call may ask for (2026-07-28)."""

SamplingAnswer = mcp_types.CreateMessageResult | mcp_types.CreateMessageResultWithTools | mcp_types.ErrorData


class SamplingRefused(Exception):
    """A sampling request this binding does not answer; ``str(exc)`` says why (for the server,
    and for the model when the call fails on it)."""


def _text_of(blocks: list[Any]) -> str:
    parts = []
    for block in blocks:
        if isinstance(block, mcp_types.TextContent):
            parts.append(block.text)
        elif isinstance(block, (mcp_types.ImageContent, mcp_types.AudioContent)):
            parts.append(f"[{block.type} {block.mime_type}]")
        else:
            parts.append(f"[{getattr(block, 'type', 'content')}]")
    return "\n".join(p for p in parts if p)


def _tool_results(blocks: list[Any]) -> list[ChatMessage]:
    """The ``tool_result`` blocks of a message, each a tool message."""
    return [ChatMessage(role="tool", tool_call_id=b.tool_use_id, content=_text_of(list(b.content)) or "(no output)")
            for b in blocks if isinstance(b, mcp_types.ToolResultContent)]


def _message_of(message: mcp_types.SamplingMessage) -> list[ChatMessage]:
    """One sampling message as canonical chat messages (a tool result block is its own message)."""
    blocks = message.content_as_list
    out = _tool_results(blocks)
    rest = [b for b in blocks if not isinstance(b, (mcp_types.ToolResultContent, mcp_types.ToolUseContent))]
    calls = tuple(ToolCallRequest(id=b.id, name=b.name, arguments=json.dumps(b.input))
                  for b in blocks if isinstance(b, mcp_types.ToolUseContent))
    if not (rest or calls or not out):
        return out
    if message.role == "assistant":
        return [*out, ChatMessage(role="assistant", content=_text_of(rest), tool_calls=calls)]
    images = tuple(ImagePart(mime_type=b.mime_type, data=b.data) for b in rest
                   if isinstance(b, mcp_types.ImageContent) and b.mime_type in IMAGE_MIME_TYPES and b.data)
    return [*out, ChatMessage(role="user", content=_text_of(rest), images=images)]


def _tools_of(params: mcp_types.CreateMessageRequestParams, policy: SamplingPolicy, server: str) -> tuple[ToolSpec, ...]:
    """The tools the request offers the model (none when ``toolChoice`` is ``none``).

    Raises:
        SamplingRefused: tools offered but the binding does not allow tool use, or a tool name
            no model API takes.
    """
    tools = params.tools or []
    mode = params.tool_choice.mode if params.tool_choice is not None else None
    if not tools or mode == "none":
        return ()
    if not policy.allow_tools:
        raise SamplingRefused(f"MCP server {server!r} asked the agent's model to use tools while sampling, "
                              "which this agent's binding does not allow (sampling.allow_tools).")
    for tool in tools:
        if not EXPOSED_NAME_RE.match(tool.name):
            raise SamplingRefused(f"Sampling tool name {tool.name[:80]!r} is not a valid model tool name "
                                  "([a-zA-Z0-9_-], at most 64 characters).")
    return tuple(ToolSpec(name=t.name, description=t.description or "", parameters=dict(t.input_schema))
                 for t in tools)


def sampling_request(params: mcp_types.CreateMessageRequestParams, policy: SamplingPolicy, *,
                     server: str) -> SamplingRequest:
    """The model call for a server's sampling request under ``policy``.

    ``max_tokens`` is capped by ``policy.max_tokens``; ``modelPreferences``, ``temperature``,
    ``stopSequences``, ``metadata`` and ``includeContext`` are ignored (the agent's route and
    settings decide; the spec lets a client ignore them).

    Raises:
        SamplingRefused: the binding does not allow sampling, or the request's tools.
    """
    if not policy.allowed:
        raise SamplingRefused(f"MCP server {server!r} asked to use the agent's model (sampling), which this "
                              "agent's binding does not allow.")
    tools = _tools_of(params, policy, server)
    messages: list[ChatMessage] = [ChatMessage(role="system", content=params.system_prompt)] if params.system_prompt else []
    for message in params.messages:
        messages += _message_of(message)
    if not any(m.role != "system" for m in messages):
        raise SamplingRefused("The sampling request has no messages.")
    return SamplingRequest(messages=tuple(messages), tools=tools, source=server,
                           max_output_tokens=max(1, min(params.max_tokens, policy.max_tokens)))


def sampling_result(completion: Completion, *, with_tools: bool) -> SamplingAnswer:
    """The MCP result for the model's answer: text, or (``with_tools``: the request offered
    tools) an array with the text and one ``tool_use`` block per tool call."""
    message = completion.message
    stop = "maxTokens" if completion.finish_reason == "length" else "endTurn"
    if not with_tools:
        return mcp_types.CreateMessageResult(role="assistant", content=mcp_types.TextContent(text=message.content),
                                             model=completion.model, stop_reason=stop)
    blocks: list[Any] = [mcp_types.TextContent(text=message.content)] if message.content else []
    for call in message.tool_calls:
        try:
            arguments = call.parsed_arguments()
        except ValueError:
            arguments = {}
        blocks.append(mcp_types.ToolUseContent(id=call.id, name=call.name, input=arguments))
    return mcp_types.CreateMessageResultWithTools(
        role="assistant", content=blocks or [mcp_types.TextContent(text="")], model=completion.model,
        stop_reason="toolUse" if message.tool_calls else stop,
    )


async def sampling_answer(params: mcp_types.CreateMessageRequestParams, *, policy: SamplingPolicy,
                          sample: ModelSampler | None, server: str) -> SamplingAnswer:
    """Answer a server's sampling request: the model's result, or an ``ErrorData`` saying why
    not (refused by the binding, no model here, the run's budget, every route entry failed).
    Never raises for those."""
    try:
        if sample is None:
            raise SamplingRefused(f"MCP server {server!r} asked to use a model outside a run; refused.")
        request = sampling_request(params, policy, server=server)
        completion = await sample(request)
    except SamplingRefused as exc:
        return mcp_types.ErrorData(code=mcp_types.INVALID_REQUEST, message=str(exc))
    except ToolError as exc:
        return mcp_types.ErrorData(code=mcp_types.INVALID_REQUEST, message=exc.message)
    except LLMError as exc:
        logger.info("MCP server %r: sampling failed: %s", server, exc)
        text = public_error_message(getattr(exc, "error_class", "") or "other")
        return mcp_types.ErrorData(code=mcp_types.INTERNAL_ERROR, message=f"The model could not answer: {text}")
    return sampling_result(completion, with_tools=bool(request.tools))


SamplingRetry = Callable[[dict[str, Any], "str | None"], Awaitable[Any]]
"""``await retry(input_responses, request_state)``: the call sent again with the answers."""


async def answer_sampling_rounds(result: Any, *, answer: Callable[[Any], Awaitable[SamplingAnswer]],
                                 retry: SamplingRetry, server: str) -> Any:
    """2026-07-28: while ``result`` is an ``InputRequiredResult`` asking only for sampling,
    answer every request with ``answer(params)`` and ``retry`` the call with the responses;
    return the first other result (a final result, or a request for the person: an
    elicitation, which the caller asks).

    Raises:
        ToolError: ``sampling_refused`` (a request refused: this wire cannot tell the server,
            so the call fails with the reason); ``mcp_error`` after :data:`MAX_SAMPLING_ROUNDS`.
    """
    for _ in range(MAX_SAMPLING_ROUNDS):
        requests = result.input_requests if isinstance(result, mcp_types.InputRequiredResult) else None
        if not requests or not all(isinstance(r, mcp_types.CreateMessageRequest) for r in requests.values()):
            return result
        responses: dict[str, Any] = {}
        for key, request in requests.items():
            reply = await answer(request.params)
            if isinstance(reply, mcp_types.ErrorData):
                raise ToolError(reply.message, code="sampling_refused")
            responses[key] = reply
        result = await retry(responses, result.request_state)
    raise ToolError(f"MCP server {server!r} asked for sampling more than {MAX_SAMPLING_ROUNDS} times in one call.",
                    code="mcp_error")
