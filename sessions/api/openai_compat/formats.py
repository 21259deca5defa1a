"""The answer's format a caller asks for: chat completions' ``response_format``, the Responses
API's ``text.format``.

``{"type": "text"}`` (or nothing): free text. ``{"type": "json_object"}``: one JSON object.
``{"type": "json_schema", ...}``: a JSON value valid against the given JSON Schema (``name``:
OpenAI's name rule; ``schema``: checked as a schema of its own ``$schema`` draft, 2020-12 by
default; ``strict`` is kept and changes nothing: every answer is validated). The run checks
the answer and repairs it (:mod:`sessions.runner.structured_output`); an answer that still does
not match fails the run ``output_invalid``, answered as :data:`VALIDATION_FAILED_CODE`.
"""

from __future__ import annotations

import re
from typing import Any

from jsonschema import validators
from jsonschema.exceptions import SchemaError

from sessions.api.openai_compat.errors import OpenAIError, bad_request

VALIDATION_FAILED_CODE = "json_schema_validation_failed"
"""The error ``code`` of a run whose answer did not match the format (run reason ``output_invalid``)."""
NAME_RE = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


def _unsupported(param: str, kind: Any) -> OpenAIError:
    return OpenAIError(400, f"Unsupported format type {kind!r}: 'text', 'json_object' or 'json_schema'.",
                       param=param, code="unsupported_value")


def format_parse(value: Any, *, param: str, nested: bool) -> dict[str, Any] | None:
    """The format to keep with the run (``{"type": "json_object"}`` or ``{"type":
    "json_schema", "name", "schema", "strict"}``), or None for text.

    Args:
        value: ``response_format`` (``nested``: a json_schema's fields under ``json_schema``) or
            ``text.format`` (its fields beside ``type``).
        param: The field's name, for the errors.

    Raises:
        OpenAIError: 400 naming the field: not an object, another type, a json_schema without a
            valid ``name`` or whose ``schema`` is not a JSON Schema.
    """
    if value is None:
        return None
    if not isinstance(value, dict):
        raise bad_request(f"`{param}` must be an object.", param=param)
    kind = value.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind != "json_schema":
        raise _unsupported(f"{param}.type", kind)
    fields = value.get("json_schema") if nested else value
    where = f"{param}.json_schema" if nested else param
    if not isinstance(fields, dict):
        raise bad_request(f"`{where}` must be an object.", param=where)
    return {"type": "json_schema", "name": _name(fields.get("name"), f"{where}.name"),
            "schema": _schema(fields.get("schema"), f"{where}.schema"), "strict": bool(fields.get("strict"))}


def _name(name: Any, param: str) -> str:
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise bad_request("The format's `name` is required and must match ^[a-zA-Z0-9_-]{1,64}$.", param=param)
    return name


def _schema(schema: Any, param: str) -> dict[str, Any]:
    if not isinstance(schema, dict):
        raise bad_request("The format's `schema` must be a JSON Schema object.", param=param)
    try:
        validators.validator_for(schema).check_schema(schema)
    except SchemaError as exc:
        raise bad_request(f"The format's `schema` is not a valid JSON Schema: {exc.message}.", param=param) from exc
    return schema


def responses_text_parse(text: Any) -> dict[str, Any] | None:
    """The format of the Responses API's ``text`` (``{"format": {...}}``; see :func:`format_parse`).
    Raises OpenAIError 400 naming the field."""
    if text is None:
        return None
    if not isinstance(text, dict) or set(text) - {"format"}:
        raise OpenAIError(400, "`text` supports `format` only.", param="text", code="unsupported_parameter")
    return format_parse(text.get("format"), param="text.format", nested=False)


def format_echo(response_format: dict[str, Any] | None) -> dict[str, Any]:
    """The Responses API's ``text.format`` of a response, from the format kept with its run."""
    if response_format is None:
        return {"type": "text"}
    if response_format["type"] == "json_object":
        return {"type": "json_object"}
    return {"type": "json_schema", "name": response_format["name"], "schema": response_format["schema"],
            "strict": response_format["strict"], "description": None}
