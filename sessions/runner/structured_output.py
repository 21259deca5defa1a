"""A run's answer in the format its API caller asked for (``Run.request_options.response_format``).

``{"type": "json_object"}``: the answer must be one JSON object; ``{"type": "json_schema",
"name", "schema", "strict"}``: a JSON value valid against ``schema`` (JSON Schema, checked with
``jsonschema``'s validator for the schema's own ``$schema``, draft 2020-12 by default). The
model is told so in the system prompt (:func:`format_system_note`); its answer is checked when it
comes (:func:`output_problem`: a Markdown code fence around it is taken off). An answer that does
not parse or validate gets up to :data:`MAX_REPAIR_TURNS` repair turns: the next model turn sees
the problem as a user note after its answer (:func:`repair_note`; not stored: a run resumed on
another worker checks its last answer again); then the run fails ``output_invalid`` naming the
last problem. No provider-side constrained decoding is asked for: this works with any model of
the route.
"""

from __future__ import annotations

import json
import re
from typing import Any

from jsonschema import validators

MAX_REPAIR_TURNS = 2
"""Model turns spent on repairing an answer that does not match the format, at most."""

_FENCE = re.compile(r"^```[a-zA-Z0-9_-]*\s*\n(?P<body>.*?)\n?```$", re.DOTALL)


def format_system_note(response_format: dict[str, Any]) -> str:
    """The system prompt's paragraph asking for the format."""
    if response_format.get("type") == "json_object":
        return "Answer with one JSON object and nothing else: no prose before or after it, no code fence."
    schema = json.dumps(response_format.get("schema") or {}, separators=(",", ":"))
    name = response_format.get("name") or "answer"
    return (f"Answer with one JSON value and nothing else (no prose before or after it, no code fence) that is "
            f"valid against this JSON Schema, named {name!r}: {schema}")


def repair_note(problem: str) -> str:
    """The user note of a repair turn."""
    return f"Your last answer cannot be used: {problem} Answer again with only the corrected JSON."


def unfenced(text: str) -> str:
    """``text`` without surrounding whitespace and a Markdown code fence around it, if it has one."""
    text = text.strip()
    found = _FENCE.match(text)
    return found.group("body").strip() if found else text


def output_problem(response_format: dict[str, Any], text: str) -> str | None:
    """What is wrong with answer ``text`` for ``response_format`` (one sentence for the model and
    the caller), or None when it matches (after :func:`unfenced`)."""
    try:
        value = json.loads(unfenced(text))
    except ValueError as exc:
        return f"it is not valid JSON ({exc})."
    if response_format.get("type") == "json_object":
        return None if isinstance(value, dict) else "it must be a JSON object."
    schema = response_format.get("schema") or {}
    validator = validators.validator_for(schema)(schema)
    error = next(iter(sorted(validator.iter_errors(value), key=lambda e: list(e.absolute_path))), None)
    if error is None:
        return None
    where = "/".join(str(p) for p in error.absolute_path)
    return f"it does not match the schema at {f'/{where}' if where else 'the top level'}: {error.message}."
