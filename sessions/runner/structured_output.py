"""A run's answer in a required format: the agent's output JSON Schema
(``AgentInstance.output_schema``) or the format its API caller asked for
(``Run.request_options.response_format``, which replaces the agent's for that run); both are
:attr:`sessions.runner.spec.RunSpec.output_format`.

``{"type": "json_object"}``: the answer must be one JSON object; ``{"type": "json_schema",
"name", "schema", "strict"}``: a JSON value valid against ``schema`` (JSON Schema, checked with
``jsonschema``'s validator for the schema's own ``$schema``, draft 2020-12 by default; one
validator per schema is kept, :func:`_validator`). The model is told so in the system prompt
(:func:`format_system_note`), and route entries with native JSON-schema mode
(``ModelRouteEntry.json_schema_mode``) also get it as the request's ``response_format``
(:func:`native_response_format`; the provider then constrains decoding); its answer is checked
when it comes (:func:`output_problem`: a Markdown code fence around it is taken off). An answer
that does not parse or validate gets up to ``RunSpec.output_repairs`` repair turns (the agent's
``output_repairs``, default :data:`MAX_REPAIR_TURNS`): the next model turn sees the problem as a
user note after its answer (:func:`repair_note`; not stored). The repair turns spent survive a
worker's death: a resumed run counts them from its stored answers (:func:`repairs_spent`: each
answer without tool calls of the run but the last was answered by a repair turn). Then the run
fails ``output_invalid`` naming the last problem. A completed run's parsed answer is stored as
``Run.structured`` (the REST API's ``structured`` field).
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterable
from typing import Any

from jsonschema import validators

MAX_REPAIR_TURNS = 2
"""Repair turns by default (an agent's ``output_repairs`` default, and an API caller's format's)."""

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
    validator = _validator(json.dumps(schema, sort_keys=True))
    error = next(iter(sorted(validator.iter_errors(value), key=lambda e: list(e.absolute_path))), None)
    if error is None:
        return None
    where = "/".join(str(p) for p in error.absolute_path)
    return f"it does not match the schema at {f'/{where}' if where else 'the top level'}: {error.message}."


@functools.lru_cache(maxsize=256)
def _validator(schema_text: str) -> Any:
    """The validator of the schema whose canonical JSON is ``schema_text`` (built once: building
    one costs far more than most checks)."""
    schema = json.loads(schema_text)
    return validators.validator_for(schema)(schema)


def parsed_answer(text: str) -> Any:
    """The JSON value of an answer that :func:`output_problem` accepted (after :func:`unfenced`)."""
    return json.loads(unfenced(text))


def native_response_format(response_format: dict[str, Any]) -> dict[str, Any]:
    """``response_format`` as an OpenAI-compatible request's ``response_format`` for constrained
    decoding: ``{"type": "json_object"}``, or ``{"type": "json_schema", "json_schema": {"name",
    "schema", "strict"}}`` (OpenAI's chat completions shape, which llama.cpp's ``llama-server``
    and vLLM take too). The name is cut to OpenAI's ``^[a-zA-Z0-9_-]{1,64}$``."""
    if response_format.get("type") == "json_object":
        return {"type": "json_object"}
    name = re.sub(r"[^a-zA-Z0-9_-]", "_", str(response_format.get("name") or "answer"))[:64] or "answer"
    return {"type": "json_schema", "json_schema": {
        "name": name, "schema": response_format.get("schema") or {}, "strict": bool(response_format.get("strict")),
    }}


def repairs_spent(rows: Iterable[Any], *, run_id: int, tail_is_answer: bool) -> int:
    """Repair turns a resumed run has already spent, from its stored messages: its assistant
    messages without tool calls (each an answer that was refused, or the last one, about to be
    checked again when ``tail_is_answer``). ``rows``: history rows (``run_id``, ``role``,
    ``tool_calls``)."""
    answers = sum(1 for r in rows if r.run_id == run_id and r.role == "assistant" and not r.tool_calls)
    return max(0, answers - (1 if tail_is_answer else 0))
