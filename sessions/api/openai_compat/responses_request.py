"""The body of ``POST /api/openai/v1/responses``, validated.

Accepted: ``model`` (the agent's slug), ``input`` (a string, or items: messages of ``role``
``user`` or ``assistant`` with ``content`` a string or ``input_text`` / ``output_text`` parts,
``system`` / ``developer`` messages added to the instructions; earlier ``function_call`` /
``function_call_output`` items of a conversation given whole, kept as text; the last item the
user's message, or ``function_call_output`` items answering the calls of the client's tools
that paused a run), ``instructions`` (added after the agent's own system prompt), ``tools``
(function tools the client runs, :mod:`.client_tools`) with ``tool_choice`` ``auto`` /
``none``, ``text.format`` (``text``, ``json_object``, ``json_schema``: :mod:`.formats`),
``previous_response_id`` (continues that response's chat, or the run its tool outputs
resume), ``stream``, ``store: true`` (every run is stored), ``user``. Everything else is refused
by name (a 400 ``unsupported_parameter``), as for chat completions.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from llm.types import ToolSpec
from sessions.api.openai_compat.chat_request import body_common
from sessions.api.openai_compat.client_tools import client_tools_parse, tool_choice_offers
from sessions.api.openai_compat.errors import OpenAIError, bad_request
from sessions.api.openai_compat.formats import responses_text_parse
from sessions.api.openai_compat.images import IMAGES_ONLY_TEXT, ImageInput, image_of, images_check
from sessions.api.openai_compat.responses import response_ref_of
from sessions.runner.spec import RunRequestOptions

ACCEPTED_FIELDS = frozenset({"model", "input", "previous_response_id", "stream", "store", "user", "instructions",
                             "tools", "tool_choice", "text"})
TEXT_PARTS = frozenset({"input_text", "output_text", "text"})
INSTRUCTION_ROLES = frozenset({"system", "developer"})


@dataclass(frozen=True, slots=True)
class ResponsesRequest:
    """A validated ``POST /responses``."""

    model: str
    history: list[tuple[str, str]]
    """The messages before the last: ``[(role, text)]``."""
    content: str
    """The last (user) message ("" when the request brings tool outputs)."""
    stream: bool
    previous_run_id: int | None
    """The run of ``previous_response_id`` (its chat is continued), or None."""
    previous_response_id: str | None
    client_tools: tuple[ToolSpec, ...] = ()
    """The client's own tools, offered to the model beside the agent's."""
    tool_outputs: dict[str, str] = field(default_factory=dict)
    """``{call_id: output}`` of the trailing ``function_call_output`` items: the request resumes
    the run those calls paused."""
    tool_output_params: dict[str, str] = field(default_factory=dict)
    """``{call_id: "input[i].call_id"}`` (for errors)."""
    instructions: str = ""
    """``instructions`` and the ``system`` / ``developer`` items, added after the agent's prompt."""
    response_format: dict[str, Any] | None = None
    """``text.format`` as kept with the run (:mod:`.formats`); None: text."""
    images: tuple[ImageInput, ...] = ()
    """The last user message's images (``input_image`` with a ``data:`` URL, :mod:`.images`)."""

    def request_options(self) -> dict[str, Any] | None:
        """What the run keeps of the request (``Run.request_options``), or None."""
        return RunRequestOptions(client_tools=self.client_tools, instructions=self.instructions,
                                 response_format=self.response_format).to_json()


def responses_request_parse(raw: bytes) -> ResponsesRequest:
    """Parse and check a request body. Raises OpenAIError (400, ``param`` naming the field)."""
    body, model, stream = body_common(raw, ACCEPTED_FIELDS)
    if body.get("store", True) is not True:
        raise OpenAIError(400, "Every response is stored (it is a run of the agent): `store` can only be true.",
                          param="store", code="unsupported_value")
    parsed = _input(body.get("input"))
    previous = body.get("previous_response_id")
    previous_run_id = None
    if previous is not None:
        ref = response_ref_of(previous) if isinstance(previous, str) else None
        if ref is None:
            raise OpenAIError(404, f"No response {previous!r} is yours.", param="previous_response_id",
                              code="previous_response_not_found")
        previous_run_id = ref[0]
    tools = client_tools_parse(body.get("tools"), nested=False)
    offered = tool_choice_offers(body.get("tool_choice"))
    return ResponsesRequest(model=model, history=parsed.history, content=parsed.content, stream=stream,
                            previous_run_id=previous_run_id, previous_response_id=previous,
                            client_tools=tools if offered else (), tool_outputs=parsed.outputs,
                            tool_output_params=parsed.params,
                            instructions=_instructions(body.get("instructions"), parsed.instructions),
                            response_format=responses_text_parse(body.get("text")), images=tuple(parsed.images))


def _instructions(value: Any, from_items: list[str]) -> str:
    if value is not None and not isinstance(value, str):
        raise bad_request("`instructions` must be a string.", param="instructions")
    return "\n\n".join(t for t in [value or "", *from_items] if t.strip())


@dataclass(slots=True)
class _Input:
    history: list[tuple[str, str]] = field(default_factory=list)
    content: str = ""
    outputs: dict[str, str] = field(default_factory=dict)
    params: dict[str, str] = field(default_factory=dict)
    instructions: list[str] = field(default_factory=list)
    images: list[ImageInput] = field(default_factory=list)


def _input(value: Any) -> _Input:
    if isinstance(value, str):
        if not value.strip():
            raise bad_request("`input` is empty.", param="input")
        return _Input(content=value)
    if not isinstance(value, list) or not value:
        raise bad_request("`input` must be a string or a non-empty array of items.", param="input",
                          code="missing_required_parameter")
    for index, item in enumerate(value):
        if not isinstance(item, dict):
            raise bad_request(f"`input[{index}]` must be an object.", param=f"input[{index}]")
    first_output = len(value)
    while first_output > 0 and value[first_output - 1].get("type") == "function_call_output":
        first_output -= 1
    if first_output < len(value):
        return _outputs(value, first_output)
    return _conversation(value)


def _conversation(value: list[dict[str, Any]]) -> _Input:
    """A new run's input items: the last one the user's message (its images kept apart)."""
    parsed = _Input()
    last = len(value) - 1
    for index, item in enumerate(value):
        _history_item(parsed, index, item, images=parsed.images if index == last else None)
    if parsed.images and not parsed.history[-1][1].strip():
        parsed.history[-1] = ("user", IMAGES_ONLY_TEXT)
    if not parsed.history or value[last].get("role") != "user" or not parsed.history[-1][1].strip():
        raise bad_request("The last input item must be a non-empty user message.", param=f"input[{last}]")
    parsed.content = parsed.history.pop()[1]
    images_check(parsed.images, param=f"input[{last}].content")
    return parsed


def _outputs(items: list[dict[str, Any]], first: int) -> _Input:
    """The trailing ``function_call_output`` items (the earlier items are the paused run's chat's)."""
    parsed = _Input()
    for index in range(first, len(items)):
        call, output = items[index].get("call_id"), items[index].get("output")
        if not isinstance(call, str) or not call:
            raise bad_request(f"`input[{index}].call_id` is required: the id of the call it answers.",
                              param=f"input[{index}].call_id", code="missing_required_parameter")
        parsed.outputs[call] = _text(f"input[{index}].output", output, parts=TEXT_PARTS)
        parsed.params[call] = f"input[{index}].call_id"
    return parsed


def _history_item(parsed: _Input, index: int, item: dict[str, Any], *, images: list[ImageInput] | None) -> None:
    """Add one input item to the conversation (``images``: where the item's images go; None:
    images are refused in it)."""
    where = f"input[{index}]"
    kind = item.get("type", "message")
    if kind == "function_call":
        parsed.history.append(("assistant", f"[Called tool {item.get('name')} ({item.get('call_id')}) with "
                                            f"{item.get('arguments') or '{}'}]"))
    elif kind == "function_call_output":
        output = _text(f"{where}.output", item.get("output"), parts=TEXT_PARTS)
        parsed.history.append(("assistant", f"[Output of tool call {item.get('call_id')}]: {output}"))
    elif kind != "message":
        raise OpenAIError(400, f"`{where}`: only message and function call items are supported (got {kind!r}).",
                          param=where, code="unsupported_value")
    elif isinstance(item.get("role"), str) and item["role"] in INSTRUCTION_ROLES:
        parsed.instructions.append(_text(f"{where}.content", item.get("content"), parts=TEXT_PARTS))
    elif item.get("role") in ("user", "assistant"):
        parsed.history.append((item["role"], _text(f"{where}.content", item.get("content"), parts=TEXT_PARTS,
                                                   images=images if item["role"] == "user" else None)))
    else:
        raise bad_request(f"`{where}.role` must be 'system', 'developer', 'user' or 'assistant'.",
                          param=f"{where}.role")


def _text(where: str, content: Any, *, parts: frozenset[str], images: list[ImageInput] | None = None) -> str:
    """A string, or the text of an array of text parts; ``input_image`` parts go to ``images``
    (None: refused here)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad_request(f"`{where}` must be a string or an array of parts.", param=where)
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "input_image" and images is not None:
            images.append(image_of(part.get("image_url"), param=f"{where}[{j}].image_url", index=len(images)))
            continue
        if kind not in parts or not isinstance(part.get("text"), str):
            where_images = " (images: in the last user message only)" if kind == "input_image" else ""
            raise OpenAIError(400, f"`{where}[{j}]`: only text parts are supported here{where_images} (got {kind!r}).",
                              param=f"{where}[{j}]", code="unsupported_value")
        texts.append(part["text"])
    return "\n".join(texts)
