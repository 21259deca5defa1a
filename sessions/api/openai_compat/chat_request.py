"""The body of ``POST /api/openai/v1/chat/completions``, validated.

The fields follow OpenAI's Chat Completions API. What this API does not do is refused by name
(a 400 ``unsupported_parameter`` naming the field), never ignored: a client must not believe
that a temperature, a second choice or its own tools were applied when they were not.

Accepted: ``model`` (the agent's slug), ``messages`` (``user`` and ``assistant`` text; the
last one the user's), ``stream``, ``stream_options.include_usage``, ``user`` (OpenAI's end-user
id for abuse monitoring; the caller is the token's user, so it is informational only),
``metadata`` (string pairs; ``chat_id`` continues a chat), and the defaults that change nothing:
``n: 1``, ``logprobs: false``, ``response_format: {"type": "text"}``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from sessions.api.openai_compat.errors import OpenAIError, bad_request

ACCEPTED_FIELDS = frozenset({"model", "messages", "stream", "stream_options", "user", "metadata", "n", "logprobs",
                             "response_format"})
"""Top-level fields this API reads (the others are refused by name)."""

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


def body_common(raw: bytes, accepted: frozenset[str]) -> tuple[dict[str, Any], str, bool]:
    """The checks every request body of this API shares: a JSON object with only ``accepted``
    fields, ``model`` a non-empty string, ``stream`` a boolean. Returns ``(body, model, stream)``.

    Raises:
        OpenAIError: 400 (``invalid_json``, ``unsupported_parameter`` naming the first field
            refused, ``missing_required_parameter``).
    """
    try:
        body = json.loads(raw or b"null")
    except ValueError as exc:
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
    history, content = _messages(body.get("messages"))
    return ChatRequest(model=model, history=history, content=content, stream=stream,
                       include_usage=_include_usage(body.get("stream_options"), stream=stream),
                       chat_id=_chat_id(body.get("metadata"), chat_id_header))


def _refuse_unsupported_values(body: dict[str, Any]) -> None:
    for name, allowed in NO_OP_VALUES.items():
        if name in body and body[name] not in allowed:
            raise OpenAIError(400, f"Unsupported value for `{name}`: {body[name]!r} (only {allowed[0]!r}).",
                              param=name, code="unsupported_value")
    response_format = body.get("response_format")
    if response_format is not None and response_format != {"type": "text"}:
        raise OpenAIError(400, "Unsupported `response_format`: only {\"type\": \"text\"} is supported.",
                          param="response_format", code="unsupported_value")


def _messages(messages: Any) -> tuple[list[tuple[str, str]], str]:
    if not isinstance(messages, list) or not messages:
        raise bad_request("`messages` must be a non-empty array.", param="messages",
                          code="missing_required_parameter")
    texts = [_message(i, m) for i, m in enumerate(messages)]
    role, content = texts[-1]
    if role != "user":
        raise bad_request("The last message must be the user's.", param=f"messages[{len(texts) - 1}].role")
    if not content.strip():
        raise bad_request("The last message is empty.", param=f"messages[{len(texts) - 1}].content")
    return texts[:-1], content


def _message(index: int, message: Any) -> tuple[str, str]:
    where = f"messages[{index}]"
    if not isinstance(message, dict):
        raise bad_request(f"`{where}` must be an object.", param=where)
    role = message.get("role")
    if role in ("system", "developer", "tool"):
        raise OpenAIError(400, f"`{where}.role` {role!r} is not supported: the agent's own system prompt applies, "
                               "and its tools run on the server.", param=f"{where}.role", code="unsupported_value")
    if role not in ("user", "assistant"):
        raise bad_request(f"`{where}.role` must be 'user' or 'assistant'.", param=f"{where}.role")
    extra = sorted(set(message) - {"role", "content", "name"} - ({"refusal"} if role == "assistant" else set()))
    if extra:
        raise OpenAIError(400, f"Unsupported field(s) in `{where}`: {', '.join(extra)}.", param=f"{where}.{extra[0]}",
                          code="unsupported_parameter")
    return role, _content(where, message.get("content"))


def _content(where: str, content: Any) -> str:
    if isinstance(content, str):
        return content
    if content is None:
        return ""
    if not isinstance(content, list):
        raise bad_request(f"`{where}.content` must be a string or an array of parts.", param=f"{where}.content")
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind != "text" or not isinstance(part.get("text"), str):
            raise OpenAIError(400, f"`{where}.content[{j}]`: only text parts are supported (got {kind!r}).",
                              param=f"{where}.content[{j}]", code="unsupported_value")
        texts.append(part["text"])
    return "\n".join(texts)


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
