"""The body of ``POST /api/openai/v1/chat/completions``, validated.

The fields follow OpenAI's Chat Completions API. What this API does not do is refused by name
(a 400 ``unsupported_parameter`` naming the field), never ignored: a client must not believe
that a temperature, a second choice or its own tools were applied when they were not.

Accepted: ``model`` (the agent's slug), ``messages`` (``system`` / ``developer`` text, added
after the agent's own system prompt; ``user`` and ``assistant`` text, the last one the user's;
or, last, ``tool`` messages answering the calls of the client's tools that paused a run),
``tools`` (function tools the client runs, :mod:`.client_tools`) with ``tool_choice``
``auto`` / ``none``, ``stream``, ``stream_options.include_usage``, ``user`` (OpenAI's end-user
id for abuse monitoring; the caller is the token's user, so it is informational only),
``metadata`` (string pairs; ``chat_id`` continues a chat), ``response_format`` (``text``,
``json_object``, ``json_schema``: :mod:`.formats`), and the defaults that change nothing:
``n: 1``, ``logprobs: false``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from llm.types import ToolSpec
from sessions.api.openai_compat.client_tools import client_tools_parse, tool_choice_offers
from sessions.api.openai_compat.errors import OpenAIError, bad_request
from sessions.api.openai_compat.formats import format_parse
from sessions.api.openai_compat.images import IMAGES_ONLY_TEXT, ImageInput, image_of, images_check
from sessions.runner.spec import RunRequestOptions

ACCEPTED_FIELDS = frozenset({"model", "messages", "stream", "stream_options", "user", "metadata", "n", "logprobs",
                             "response_format", "tools", "tool_choice"})
"""Top-level fields this API reads (the others are refused by name)."""

INSTRUCTION_ROLES = frozenset({"system", "developer"})
"""Roles whose text is added to the agent's own system prompt for the run (after it)."""

MESSAGE_FIELDS = {
    "user": frozenset({"role", "content", "name"}),
    "assistant": frozenset({"role", "content", "name", "refusal", "tool_calls"}),
    "tool": frozenset({"role", "content", "tool_call_id"}),
}
"""The fields each history message may have (others are refused by name)."""

NO_OP_VALUES: dict[str, tuple[Any, ...]] = {"n": (1, None), "logprobs": (False, None)}
"""Accepted fields whose other values are not supported."""

METADATA_MAX_PAIRS = 16
"""OpenAI's limit on ``metadata``: 16 pairs, keys ≤ 64 and values ≤ 512 characters."""


@dataclass(frozen=True, slots=True)
class ChatRequest:
    """A validated chat-completions request."""

    model: str
    """The agent's slug."""
    history: list[tuple[str, str]]
    """The messages before the last one: ``[(role, text)]``, role ``user`` or ``assistant``."""
    content: str
    """The last (user) message's text."""
    stream: bool
    include_usage: bool
    """``stream_options.include_usage``: a usage chunk after the finish chunk."""
    chat_id: int | None
    """``metadata.chat_id`` or the ``X-Chat-Id`` header: continue that chat with ``content``."""
    client_tools: tuple[ToolSpec, ...] = ()
    """The client's own tools (:mod:`.client_tools`), offered to the model beside the agent's."""
    tool_outputs: dict[str, str] = field(default_factory=dict)
    """``{tool_call_id: output}`` of the trailing ``tool`` messages: the request resumes the
    run those calls paused (``content`` and ``history`` are then empty)."""
    tool_output_params: dict[str, str] = field(default_factory=dict)
    """``{tool_call_id: "messages[i].tool_call_id"}``: where each output was sent (for errors)."""
    instructions: str = ""
    """The ``system`` / ``developer`` messages' text, added after the agent's system prompt."""
    images: tuple[ImageInput, ...] = ()
    """The last message's images (``data:`` URLs, :mod:`.images`)."""
    response_format: dict[str, Any] | None = None
    """``response_format`` as kept with the run (:mod:`.formats`); None: text."""

    def request_options(self) -> dict[str, Any] | None:
        """What the run keeps of the request (``Run.request_options``), or None."""
        return RunRequestOptions(client_tools=self.client_tools, instructions=self.instructions,
                                 response_format=self.response_format).to_json()


def body_common(raw: bytes, accepted: frozenset[str]) -> tuple[dict[str, Any], str, bool]:
    """The checks every request body of this API shares: a JSON object with only ``accepted``
    fields, ``model`` a non-empty string, ``stream`` a boolean. Returns ``(body, model, stream)``.

    Raises:
        OpenAIError: 400 (``invalid_json``, ``unsupported_parameter`` naming the first field
            refused, ``missing_required_parameter``).
    """
    try:
        body = json.loads(raw or b"null")
    except (ValueError, RecursionError) as exc:  # RecursionError: nested deeper than the parser goes
        raise bad_request(f"The body is not valid JSON: {exc}.", code="invalid_json") from exc
    if not isinstance(body, dict):
        raise bad_request("The body must be a JSON object.", code="invalid_json")
    unsupported = sorted(set(body) - accepted)
    if unsupported:
        names = ", ".join(f"`{n}`" for n in unsupported)
        raise OpenAIError(400, f"Unsupported parameter(s): {names}. An agent's instructions, model, sampling and "
                               "tools are set by its configuration; this API does not apply them.",
                          param=unsupported[0], code="unsupported_parameter")
    model = body.get("model")
    if not isinstance(model, str) or not model.strip():
        raise bad_request("`model` is required: the slug of one of your agents (GET /models lists them).",
                          param="model", code="missing_required_parameter")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise bad_request("`stream` must be true or false.", param="stream")
    return body, model.strip(), stream


def chat_request_parse(raw: bytes, *, chat_id_header: str | None = None) -> ChatRequest:
    """Parse and check a request body.

    Raises:
        OpenAIError: 400 with ``param`` naming the field at fault: not JSON, a missing or
            malformed field, an unsupported field or value.
    """
    body, model, stream = body_common(raw, ACCEPTED_FIELDS)
    _refuse_unsupported_values(body)
    conversation = _messages(body.get("messages"))
    tools = client_tools_parse(body.get("tools"), nested=True)
    offered = tool_choice_offers(body.get("tool_choice"))
    return ChatRequest(model=model, history=conversation.history, content=conversation.content, stream=stream,
                       include_usage=_include_usage(body.get("stream_options"), stream=stream),
                       chat_id=_chat_id(body.get("metadata"), chat_id_header),
                       client_tools=tools if offered else (), tool_outputs=conversation.tool_outputs,
                       tool_output_params=conversation.params, instructions=conversation.instructions,
                       images=tuple(conversation.images),
                       response_format=format_parse(body.get("response_format"), param="response_format",
                                                    nested=True))


def _refuse_unsupported_values(body: dict[str, Any]) -> None:
    for name, allowed in NO_OP_VALUES.items():
        if name in body and body[name] not in allowed:
            raise OpenAIError(400, f"Unsupported value for `{name}`: {body[name]!r} (only {allowed[0]!r}).",
                              param=name, code="unsupported_value")


@dataclass(frozen=True, slots=True)
class _Conversation:
    history: list[tuple[str, str]]
    content: str
    tool_outputs: dict[str, str]
    instructions: str
    params: dict[str, str] = field(default_factory=dict)
    """``{tool_call_id: the field that carries its output}``."""
    images: list[ImageInput] = field(default_factory=list)
    """The last (user) message's images."""


def _messages(messages: Any) -> _Conversation:
    """The conversation: a new run's history, last user message and instructions (the
    ``system`` / ``developer`` messages), or, when it ends with ``tool`` messages, the outputs
    that resume the run their calls paused (the earlier messages are that run's chat's)."""
    if not isinstance(messages, list) or not messages:
        raise bad_request("`messages` must be a non-empty array.", param="messages",
                          code="missing_required_parameter")
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise bad_request(f"`messages[{i}]` must be an object.", param=f"messages[{i}]")
    first_output = len(messages)
    while first_output > 0 and messages[first_output - 1].get("role") == "tool":
        first_output -= 1
    if first_output < len(messages):
        return _outputs(messages, first_output)
    return _conversation(messages)


def _outputs(messages: list[dict[str, Any]], first: int) -> _Conversation:
    """The trailing ``tool`` messages from ``first`` on, as the outputs that resume a run."""
    outputs = dict(_tool_output(i, messages[i]) for i in range(first, len(messages)))
    params = {messages[i]["tool_call_id"]: f"messages[{i}].tool_call_id" for i in range(first, len(messages))}
    return _Conversation(history=[], content="", tool_outputs=outputs, instructions="", params=params)


def _is_instruction(message: dict[str, Any]) -> bool:
    """Whether ``message`` is a ``system`` or ``developer`` message (a role of another type is not)."""
    role = message.get("role")
    return isinstance(role, str) and role in INSTRUCTION_ROLES


def _conversation(messages: list[dict[str, Any]]) -> _Conversation:
    """A new run's conversation: the last message the user's, the instructions apart."""
    instructions = [_content(f"messages[{i}]", m.get("content")) for i, m in enumerate(messages)
                    if _is_instruction(m)]
    last = len(messages) - 1
    if messages[last].get("role") != "user":
        raise bad_request("The last message must be the user's.", param=f"messages[{last}].role")
    history = [_message(i, m) for i, m in enumerate(messages[:-1]) if not _is_instruction(m)]
    images: list[ImageInput] = []
    content = _message(last, messages[last], images=images)[1]
    if not content.strip() and images:
        content = IMAGES_ONLY_TEXT
    if not content.strip():
        raise bad_request("The last message is empty.", param=f"messages[{last}].content")
    return _Conversation(history=history, content=content, tool_outputs={},
                         instructions="\n\n".join(t for t in instructions if t.strip()),
                         images=images_check(images, param=f"messages[{last}].content"))


def _tool_output(index: int, message: dict[str, Any]) -> tuple[str, str]:
    """``(tool_call_id, output text)`` of a ``tool`` message."""
    where = f"messages[{index}]"
    call = message.get("tool_call_id")
    if not isinstance(call, str) or not call:
        raise bad_request(f"`{where}.tool_call_id` is required: the id of the call it answers.",
                          param=f"{where}.tool_call_id", code="missing_required_parameter")
    return call, _content(where, message.get("content"))


def _message(index: int, message: dict[str, Any], *, images: list[ImageInput] | None = None) -> tuple[str, str]:
    """A history message as ``(role, text)``: a ``tool`` message and an assistant's tool calls
    of an earlier round become the assistant's text (the new chat records no calls of its own)."""
    where = f"messages[{index}]"
    role = message.get("role")
    if role not in ("user", "assistant", "tool"):
        raise bad_request(f"`{where}.role` must be 'system', 'developer', 'user', 'assistant' or 'tool'.",
                          param=f"{where}.role")
    allowed = MESSAGE_FIELDS[role]
    extra = sorted(set(message) - allowed)
    if extra:
        raise OpenAIError(400, f"Unsupported field(s) in `{where}`: {', '.join(extra)}.", param=f"{where}.{extra[0]}",
                          code="unsupported_parameter")
    text = _content(where, message.get("content"), images=images)
    if role == "tool":
        return "assistant", f"[Output of tool call {message.get('tool_call_id')}]: {text}"
    if role == "assistant" and message.get("tool_calls"):
        text = "\n".join([text, *_calls_text(where, message["tool_calls"])]).strip()
    return role, text


def _calls_text(where: str, calls: Any) -> list[str]:
    if not isinstance(calls, list):
        raise bad_request(f"`{where}.tool_calls` must be an array.", param=f"{where}.tool_calls")
    lines = []
    for j, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise bad_request(f"`{where}.tool_calls[{j}].function.name` is required.",
                              param=f"{where}.tool_calls[{j}].function")
        lines.append(f"[Called tool {function['name']} ({call.get('id')}) with {function.get('arguments') or '{}'}]")
    return lines


def _content(where: str, content: Any, *, images: list[ImageInput] | None = None) -> str:
    """A message's text; its ``image_url`` parts go to ``images`` (None: images are refused here)."""
    if isinstance(content, str):
        return content
    if content is None:
        return ""
    if not isinstance(content, list):
        raise bad_request(f"`{where}.content` must be a string or an array of parts.", param=f"{where}.content")
    texts = []
    for j, part in enumerate(content):
        text = _part(f"{where}.content[{j}]", part, images)
        if text is not None:
            texts.append(text)
    return "\n".join(texts)


def _part(where: str, part: Any, images: list[ImageInput] | None) -> str | None:
    """A text part's text, or None for an image part (added to ``images``)."""
    kind = part.get("type") if isinstance(part, dict) else None
    if kind == "image_url" and images is not None:
        image_url = part.get("image_url")
        url = image_url.get("url") if isinstance(image_url, dict) else image_url
        images.append(image_of(url, param=f"{where}.image_url.url", index=len(images)))
        return None
    if kind != "text" or not isinstance(part.get("text"), str):
        where_images = " (images: in the last user message only)" if kind == "image_url" else ""
        raise OpenAIError(400, f"`{where}`: only text parts are supported here{where_images} (got {kind!r}).",
                          param=where, code="unsupported_value")
    return part["text"]


def _include_usage(options: Any, *, stream: bool) -> bool:
    if options is None:
        return False
    if not stream:
        raise bad_request("`stream_options` is only allowed with `stream: true`.", param="stream_options")
    if not isinstance(options, dict) or set(options) - {"include_usage"}:
        raise OpenAIError(400, "`stream_options` supports `include_usage` only.", param="stream_options",
                          code="unsupported_parameter")
    include = options.get("include_usage", False)
    if not isinstance(include, bool):
        raise bad_request("`stream_options.include_usage` must be true or false.",
                          param="stream_options.include_usage")
    return include


def _metadata_ok(metadata: Any) -> bool:
    """At most :data:`METADATA_MAX_PAIRS` string pairs, keys ≤ 64 and values ≤ 512 characters."""
    return isinstance(metadata, dict) and len(metadata) <= METADATA_MAX_PAIRS and all(
        isinstance(k, str) and isinstance(v, str) and len(k) <= 64 and len(v) <= 512 for k, v in metadata.items()
    )


def _chat_id(metadata: Any, header: str | None) -> int | None:
    if metadata is not None and not _metadata_ok(metadata):
        raise bad_request("`metadata` must be at most 16 string pairs (keys ≤ 64, values ≤ 512 characters).",
                          param="metadata")
    raw = (metadata or {}).get("chat_id") or header
    if raw is None or raw == "":
        return None
    if not str(raw).isdigit() or len(str(raw)) > 18:
        raise bad_request("`metadata.chat_id` must be the id of one of your chats.", param="metadata.chat_id")
    return int(raw)
