"""The body of ``POST /api/openai/v1/responses``, validated.

Accepted: ``model`` (the agent's slug), ``input`` (a string, or message items: ``role``
``user`` or ``assistant``, ``content`` a string or ``input_text`` / ``output_text`` parts; the
last one the user's), ``previous_response_id`` (continues that response's chat), ``stream``,
``store: true`` (every run is stored), ``user``. Everything else is refused by name (a 400
``unsupported_parameter``), as for chat completions: the agent's configuration decides the
model, its instructions, sampling and tools.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sessions.api.openai_compat.chat_request import body_common
from sessions.api.openai_compat.errors import OpenAIError, bad_request
from sessions.api.openai_compat.responses import run_id_of

ACCEPTED_FIELDS = frozenset({"model", "input", "previous_response_id", "stream", "store", "user"})
TEXT_PARTS = frozenset({"input_text", "output_text", "text"})


@dataclass(frozen=True, slots=True)
class ResponsesRequest:
    """A validated ``POST /responses``."""

    model: str
    history: list[tuple[str, str]]
    """The messages before the last: ``[(role, text)]``."""
    content: str
    """The last (user) message."""
    stream: bool
    previous_run_id: int | None
    """The run of ``previous_response_id`` (its chat is continued), or None."""
    previous_response_id: str | None


def responses_request_parse(raw: bytes) -> ResponsesRequest:
    """Parse and check a request body. Raises OpenAIError (400, ``param`` naming the field)."""
    body, model, stream = body_common(raw, ACCEPTED_FIELDS)
    if body.get("store", True) is not True:
        raise OpenAIError(400, "Every response is stored (it is a run of the agent): `store` can only be true.",
                          param="store", code="unsupported_value")
    messages = _input(body.get("input"))
    previous = body.get("previous_response_id")
    previous_run_id = None
    if previous is not None:
        previous_run_id = run_id_of(previous) if isinstance(previous, str) else None
        if previous_run_id is None:
            raise OpenAIError(404, f"No response {previous!r} is yours.", param="previous_response_id",
                              code="previous_response_not_found")
    return ResponsesRequest(model=model, history=messages[:-1], content=messages[-1][1], stream=stream,
                            previous_run_id=previous_run_id, previous_response_id=previous)


def _input(value: Any) -> list[tuple[str, str]]:
    if isinstance(value, str):
        if not value.strip():
            raise bad_request("`input` is empty.", param="input")
        return [("user", value)]
    if not isinstance(value, list) or not value:
        raise bad_request("`input` must be a string or a non-empty array of messages.", param="input",
                          code="missing_required_parameter")
    messages = [_item(i, item) for i, item in enumerate(value)]
    if messages[-1][0] != "user" or not messages[-1][1].strip():
        raise bad_request("The last input item must be a non-empty user message.", param=f"input[{len(value) - 1}]")
    return messages


def _item(index: int, item: Any) -> tuple[str, str]:
    where = f"input[{index}]"
    if not isinstance(item, dict) or item.get("type", "message") != "message":
        kind = item.get("type") if isinstance(item, dict) else type(item).__name__
        raise OpenAIError(400, f"`{where}`: only message items are supported (got {kind!r}).", param=where,
                          code="unsupported_value")
    role = item.get("role")
    if role not in ("user", "assistant"):
        raise OpenAIError(400, f"`{where}.role` {role!r} is not supported: 'user' or 'assistant' (the agent's own "
                               "instructions apply).", param=f"{where}.role", code="unsupported_value")
    content = item.get("content")
    if isinstance(content, str):
        return role, content
    if not isinstance(content, list):
        raise bad_request(f"`{where}.content` must be a string or an array of parts.", param=f"{where}.content")
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in TEXT_PARTS or not isinstance(part.get("text"), str):
            raise OpenAIError(400, f"`{where}.content[{j}]`: only text parts are supported (got {kind!r}).",
                              param=f"{where}.content[{j}]", code="unsupported_value")
        texts.append(part["text"])
    return role, "\n".join(texts)
