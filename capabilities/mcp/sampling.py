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

A binding with ``sampling.require_approval`` asks a person before the model is called (an
:class:`~capabilities.tools.InputForUser` whose request has ``type: "sampling"``,
:func:`sampling_question`; the runner makes it an Approval of kind ``sampling`` and pauses the
run durably, as for an elicitation, :mod:`capabilities.mcp.elicitation`). On 2026-07-28 the
call is sent again once decided, with the model's answers (:func:`approved_sampling_answers`)
or failing with :func:`declined_message`; on 2025-11-25 the call is held open in the pool
(:class:`~capabilities.mcp.elicitation.HeldCall`) and the server gets the model's answer or an
MCP error saying the user declined.

The request's messages become our canonical chat messages (text, images; a ``tool_use`` block
an assistant tool call, a ``tool_result`` block a tool message); audio is described, not sent.
The answer is ``CreateMessageResult`` (text) or, when the request offered tools,
``CreateMessageResultWithTools`` with the model's ``tool_use`` blocks (``stopReason:
toolUse``): the server runs its own tools and may ask again. No Django imports.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import mcp_types

from capabilities.mcp.binding_config import SamplingPolicy
from capabilities.naming import EXPOSED_NAME_RE
from capabilities.tools import InputForUser, ModelSampler, SamplingRequest, ToolError
from llm.errors import LLMError, public_error_message
from llm.types import IMAGE_MIME_TYPES, ChatMessage, Completion, ImagePart, ToolCallRequest, ToolSpec

logger = logging.getLogger(__name__)

MAX_SAMPLING_ROUNDS = 10
"""How many ``InputRequiredResult`` rounds of sampling one call may ask for (2026-07-28)."""

MAX_SHOWN_CHARS = 4_000
"""Longest text of one message (or the system prompt) a person is shown when approving."""
MAX_SHOWN_MESSAGES = 20
"""The last this many messages of a request are shown when approving."""

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


def declined_message(server: str, reason: str = "") -> str:
    """What the server (2025-11-25) or the model (2026-07-28: the failed call) reads when the
    person declined a sampling request, or nobody answered in time."""
    why = f" Their reason: {reason}" if reason else ""
    return (f"The user declined MCP server {server!r}'s request to use the agent's model (sampling).{why} "
            "Do not retry it unless the user asks.")


def _shown(text: str) -> str:
    return text if len(text) <= MAX_SHOWN_CHARS else text[:MAX_SHOWN_CHARS] + "…"


def _request_shown(params: mcp_types.CreateMessageRequestParams, policy: SamplingPolicy) -> dict[str, Any]:
    """What a person sees of one request: ``{messages: [{role, text}], system_prompt,
    max_tokens (as capped), offers_tools, tools: [name]}`` (texts cut, the last messages)."""
    offered = _tools_of(params, policy, "") if params.tools else ()
    return {
        "messages": [{"role": m.role, "text": _shown(_text_of(m.content_as_list))}
                     for m in params.messages[-MAX_SHOWN_MESSAGES:]],
        "system_prompt": _shown(params.system_prompt or ""),
        "max_tokens": max(1, min(params.max_tokens, policy.max_tokens)),
        "offers_tools": bool(offered), "tools": [t.name for t in offered],
    }


def sampling_question(requests: dict[str, mcp_types.CreateMessageRequestParams], *, policy: SamplingPolicy,
                      server: str, tool_name: str, protocol: str, request_state: str | None = None) -> InputForUser:
    """The person's approval of a server's sampling request(s) (one round), as
    :class:`InputForUser`.

    Args:
        requests: ``{key: params}`` (2026-07-28: the ``InputRequiredResult`` 's keys; 2025-11-25:
            one request under ``""``).
        policy: The binding's policy (each request must pass it: :func:`sampling_request`).
        protocol: ``input_required`` (2026-07-28) or ``held`` (2025-11-25, the call held open).

    Returns:
        ``InputForUser(request)`` with ``request`` = ``{type: "sampling", protocol, server, tool,
        request_state, message, requests: [{key, params (the MCP JSON), shown}]}``
        (``shown``: :func:`_request_shown`).

    Raises:
        SamplingRefused: a request the binding refuses anyway (nobody is asked).
    """
    items = []
    for key, params in requests.items():
        sampling_request(params, policy, server=server)
        items.append({"key": key, "params": params.model_dump(mode="json", by_alias=True, exclude_none=True),
                      "shown": _request_shown(params, policy)})
    return InputForUser({
        "type": "sampling", "protocol": protocol, "server": server, "tool": tool_name, "request_state": request_state,
        "message": f"The MCP server {server!r} asks to use the agent's model (sampling).", "requests": items,
    })


def is_sampling_answer(answer: dict[str, Any] | None) -> bool:
    """Whether a stored answer (``{request, action, ...}``) is to a :func:`sampling_question`."""
    return isinstance(answer, dict) and (answer.get("request") or {}).get("type") == "sampling"


async def approved_sampling_answers(answer: dict[str, Any], *, policy: SamplingPolicy, sample: ModelSampler | None,
                                    server: str) -> dict[str, SamplingAnswer]:
    """The answers to the requests of a decided :func:`sampling_question`.

    Args:
        answer: ``{"request": <the question's request>, "action": "accept" | "decline",
            "reason"}`` (``decline``: denied, or nobody answered in time).

    Returns:
        ``{key: answer}``: the model's results once approved (:func:`sampling_answer`, run in
        order; its ``ErrorData`` when refused or failed), else ``ErrorData`` saying the user
        declined (:func:`declined_message`) for every key. Never raises for those.
    """
    request = answer.get("request") or {}
    items = [i for i in request.get("requests") or () if isinstance(i, dict)]
    if answer.get("action") != "accept":
        message = declined_message(server, str(answer.get("reason") or ""))
        return {str(i.get("key", "")): mcp_types.ErrorData(code=mcp_types.INVALID_REQUEST, message=message)
                for i in items}
    asked = dataclasses.replace(policy, require_approval=False)
    replies: dict[str, SamplingAnswer] = {}
    for item in items:
        params = mcp_types.CreateMessageRequestParams.model_validate(item.get("params") or {})
        replies[str(item.get("key", ""))] = await sampling_answer(params, policy=asked, sample=sample, server=server)
    return replies


def declined(reply: SamplingAnswer) -> bool:
    """Whether ``reply`` is the error of a request the person declined."""
    return isinstance(reply, mcp_types.ErrorData) and reply.message.startswith("The user declined")


SamplingRetry = Callable[[dict[str, Any], "str | None"], Awaitable[Any]]
"""``await retry(input_responses, request_state)``: the call sent again with the answers."""


SamplingAsk = Callable[[dict[str, mcp_types.CreateMessageRequestParams], "str | None"], None]
"""``ask(requests, request_state)``: raises :class:`InputForUser` when a person must approve
the round first (:func:`sampling_question`), :class:`SamplingRefused` for a request refused
anyway; returns when the round is answered at once."""


async def answer_sampling_rounds(result: Any, *, answer: Callable[[Any], Awaitable[SamplingAnswer]],
                                 retry: SamplingRetry, server: str, ask: SamplingAsk | None = None) -> Any:
    """2026-07-28: while ``result`` is an ``InputRequiredResult`` asking only for sampling,
    answer every request with ``answer(params)`` and ``retry`` the call with the responses;
    return the first other result (a final result, or a request for the person: an
    elicitation, which the caller asks).

    Raises:
        ToolError: ``sampling_refused`` (a request refused: this wire cannot tell the server,
            so the call fails with the reason); ``mcp_error`` after :data:`MAX_SAMPLING_ROUNDS`.
        InputForUser: ``ask`` wants a person to approve the round (the call is sent again
            with the answers once decided: :func:`approved_sampling_answers`).
    """
    for _ in range(MAX_SAMPLING_ROUNDS):
        requests = result.input_requests if isinstance(result, mcp_types.InputRequiredResult) else None
        if not requests or not all(isinstance(r, mcp_types.CreateMessageRequest) for r in requests.values()):
            return result
        if ask is not None:
            try:
                ask({key: r.params for key, r in requests.items()}, result.request_state)
            except SamplingRefused as exc:
                raise ToolError(str(exc), code="sampling_refused") from None
        responses: dict[str, Any] = {}
        for key, request in requests.items():
            reply = await answer(request.params)
            if isinstance(reply, mcp_types.ErrorData):
                raise ToolError(reply.message, code="sampling_refused")
            responses[key] = reply
        result = await retry(responses, result.request_state)
    raise ToolError(f"MCP server {server!r} asked for sampling more than {MAX_SAMPLING_ROUNDS} times in one call.",
                    code="mcp_error")
