"""Tools the API client runs itself (``tools`` of a chat completion or a response).

They are offered to the model beside the agent's own tools
(:class:`sessions.runner.interceptors.ClientTool`). When the model calls one, the run pauses
durably, as for an approval (an Approval of kind ``client_tool``; no worker holds it), and the
answer ends with the calls (``finish_reason: "tool_calls"``; ``function_call`` items). The
client's next request brings the outputs (``tool`` messages; ``function_call_output`` items),
which resume that same run (:func:`sessions.services.client_tool_outputs_submit`). A call's id
is ``call_<ToolCall primary key>`` (stable: the same in the stream, the stored response and
the next request).

Names: OpenAI's function-name rule (``^[a-zA-Z0-9_-]{1,64}$``), unique, and none the agent's
tools may have: a built-in tool's name, or a name with ``__`` (the agent's MCP tools are
``<server>__<tool>``). A clash the API cannot tell in advance (a CLI command or skill of the
same bare name) fails the run ``configuration`` with the name (its own check,
:func:`sessions.runner.toolset.client_tools_add`).
"""

from __future__ import annotations

from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from capabilities.builtin.registry import builtin_names
from capabilities.naming import EXPOSED_NAME_RE, QUALIFIER
from llm.types import ToolSpec
from sessions.api.openai_compat.errors import OpenAIError, bad_request

MAX_CLIENT_TOOLS = 128
"""OpenAI's limit on the number of tools of one request."""
MAX_DESCRIPTION_CHARS = 10_000
TOOL_CHOICES = ("auto", "none")
"""The ``tool_choice`` values applied (``required`` and a named function are refused by name)."""
EMPTY_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}


def call_id(tool_call_pk: int) -> str:
    """The id a client sees for a tool call: ``call_<pk>``."""
    return f"call_{tool_call_pk}"


def call_pk_of(value: Any) -> int | None:
    """The ToolCall primary key in ``call_<pk>``, or None when ``value`` is not one of ours."""
    if not isinstance(value, str) or not value.startswith("call_"):
        return None
    raw = value.removeprefix("call_")
    return int(raw) if raw.isdigit() and len(raw) <= 18 else None


def tool_choice_offers(value: Any, *, param: str = "tool_choice") -> bool:
    """Whether ``tool_choice`` lets the client's tools be offered: ``auto`` (or absent) yes,
    ``none`` no. Raises OpenAIError 400 ``unsupported_value`` for anything else."""
    if value is None or value in TOOL_CHOICES:
        return value != "none"
    raise OpenAIError(400, f"Unsupported `{param}`: only 'auto' and 'none' (the agent decides when to call a tool).",
                      param=param, code="unsupported_value")


def client_tools_parse(value: Any, *, nested: bool) -> tuple[ToolSpec, ...]:
    """The client's function tools, checked.

    Args:
        value: ``tools`` as sent: chat completions' ``[{type: function, function: {name,
            description, parameters, strict}}]`` (``nested``), or the Responses API's
            ``[{type: function, name, description, parameters, strict}]``.
        nested: Whether each tool's fields sit under ``function``.

    Returns:
        The tools as offered to the model (``strict`` is not applied: the arguments are the
        model's, checked by the client).

    Raises:
        OpenAIError: 400 naming the field: not a list, too many, not a function tool, a
            malformed name, a duplicate, a name the agent's tools may have
            (``tool_name_conflict``), a ``parameters`` that is not a JSON Schema object.
    """
    if value is None:
        return ()
    if not isinstance(value, list) or len(value) > MAX_CLIENT_TOOLS:
        raise bad_request(f"`tools` must be an array of at most {MAX_CLIENT_TOOLS} tools.", param="tools")
    specs: list[ToolSpec] = []
    for index, tool in enumerate(value):
        spec = _tool(index, tool, nested=nested)
        if any(s.name == spec.name for s in specs):
            raise bad_request(f"Two tools are named {spec.name!r}.", param=_where(index, "name", nested=nested))
        specs.append(spec)
    return tuple(specs)


def _where(index: int, field: str, *, nested: bool) -> str:
    return f"tools[{index}].function.{field}" if nested else f"tools[{index}].{field}"


def _tool(index: int, tool: Any, *, nested: bool) -> ToolSpec:
    if not isinstance(tool, dict) or tool.get("type") != "function":
        kind = tool.get("type") if isinstance(tool, dict) else type(tool).__name__
        raise OpenAIError(400, f"`tools[{index}]`: only function tools are supported (got {kind!r}).",
                          param=f"tools[{index}].type", code="unsupported_value")
    fields = tool.get("function") if nested else tool
    if not isinstance(fields, dict):
        raise bad_request(f"`tools[{index}].function` must be an object.", param=f"tools[{index}].function")
    name = _name(fields.get("name"), _where(index, "name", nested=nested))
    description = fields.get("description") or ""
    if not isinstance(description, str) or len(description) > MAX_DESCRIPTION_CHARS:
        raise bad_request(f"A tool's description is text of at most {MAX_DESCRIPTION_CHARS} characters.",
                          param=_where(index, "description", nested=nested))
    parameters = _parameters(fields.get("parameters"), _where(index, "parameters", nested=nested))
    return ToolSpec(name=name, description=description, parameters=parameters)


def _name(name: Any, param: str) -> str:
    if not isinstance(name, str) or not EXPOSED_NAME_RE.match(name):
        raise bad_request("A tool's name must match ^[a-zA-Z0-9_-]{1,64}$.", param=param)
    if QUALIFIER in name or name in builtin_names():
        raise OpenAIError(400, f"The tool name {name!r} clashes with the agent's own tools (built-in tool names and "
                               f"names with {QUALIFIER!r} are theirs); rename it.", param=param,
                          code="tool_name_conflict")
    return name


def _parameters(parameters: Any, param: str) -> dict[str, Any]:
    if parameters is None:
        return dict(EMPTY_PARAMETERS)
    if not isinstance(parameters, dict):
        raise bad_request("A tool's `parameters` must be a JSON Schema object.", param=param)
    try:
        Draft202012Validator.check_schema(parameters)
    except SchemaError as exc:
        raise bad_request(f"A tool's `parameters` is not a valid JSON Schema: {exc.message}.", param=param) from exc
    return parameters
