"""Argv templates and parameter schemas of CLI commands: the rules, and rendering an argv.

No Django imports: the model's ``clean()``, the tool and the tests all use these functions.

Template rules (checked by :func:`template_errors`):

- A template is a JSON list of 1..256 strings; element 0 is the program (a bare name looked
  up on the sandbox's ``PATH``, or an absolute path) and may not contain a placeholder: the
  model never chooses the program.
- ``{name}`` (``name`` matching ``[A-Za-z_][A-Za-z0-9_]*``) is a placeholder. It may be a
  whole element (``"{count}"``) or part of one (``"--format={fmt}"``, ``"+{format}"``);
  either way the element stays exactly **one** argv element after substitution: values are
  never split, globbed or passed through a shell. ``{{`` and ``}}`` are literal braces; any
  other brace is literal too (``"print({})"`` needs no escaping).
- Every placeholder must be a property of the parameter schema, and be ``required`` there or
  have a ``default``.
- A literal ``--`` element ends option parsing for most programs; placeholders after it are
  positional even when their value starts with ``-``.

Option injection rule (enforced by :func:`render_argv`): a *string* value that would make an
element start with ``-`` (the placeholder is at the start of its element and the value
starts with ``-``) is refused, unless the element comes after a literal ``--`` element or
the schema property sets ``"x-allow-leading-dash": true``. Numbers are exempt (a negative
number cannot name a file or an option value). Values containing a NUL byte are refused (an
argv element cannot hold one).

Schema rules (checked by :func:`schema_errors`): a JSON Schema (draft 2020-12) of
``"type": "object"`` whose properties each have ``type`` string, integer, number or boolean,
or an ``enum`` of such values. Arguments are validated with the ``jsonschema`` library.

Rendering (:func:`render_value`): strings as they are; integers in decimal; numbers as
Python's shortest round-trip ``repr`` (``0.1``, ``1e-07``), an integral float under an
``integer`` schema as an integer (``3.0`` → ``3``); booleans as ``true`` / ``false``.
"""

from __future__ import annotations

import re
from typing import Any

import jsonschema
from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match

PLACEHOLDER_RE = re.compile(r"\{\{|\}\}|\{([A-Za-z_][A-Za-z0-9_]*)\}")
"""Matches ``{{``, ``}}`` (escapes) or a placeholder ``{name}`` (group 1)."""

MAX_TEMPLATE_ELEMENTS = 256
MAX_ARGV_BYTES = 128 * 1024
"""Largest rendered argv (sum of UTF-8 element lengths); Linux caps one element at 128 KiB too."""

ALLOW_LEADING_DASH = "x-allow-leading-dash"
"""Schema property keyword that lets a string value start an element with ``-``."""

_SCALAR_TYPES = {"string", "integer", "number", "boolean"}


class ArgumentsInvalid(ValueError):
    """The model's arguments do not fit the schema or the rendering rules (message for the model)."""


def leading_dash_error(name: str) -> str:
    """The message refusing a value of ``name`` that would start an argv element with ``-``
    (option injection). The same rule, and words, for a model's argument (:func:`render_argv`)
    and a tenant's template parameter (:func:`capabilities.catalogue.parameters_errors`)."""
    return f"{name}: the value may not start with '-' (it would be read as an option). Pass it without the leading dash."


def placeholders(element: str) -> list[str]:
    """Placeholder names in one template element, in order (escapes ``{{``/``}}`` skipped)."""
    return [m.group(1) for m in PLACEHOLDER_RE.finditer(element) if m.group(1)]


def template_errors(argv_template: Any, parameters_schema: Any) -> dict[str, list[str]]:
    """What is wrong with a template and its schema (``{}`` when both are valid).

    Returns:
        ``{"argv_template": [...], "parameters_schema": [...]}`` with only non-empty lists.
    """
    errors: dict[str, list[str]] = {}
    schema_problems = schema_errors(parameters_schema)
    if schema_problems:
        errors["parameters_schema"] = schema_problems
    template_problems: list[str] = []
    if not isinstance(argv_template, list) or not argv_template or not all(isinstance(a, str) for a in argv_template):
        return {**errors, "argv_template": ["A non-empty JSON list of strings, e.g. [\"factor\", \"--\", \"{n}\"]."]}
    if len(argv_template) > MAX_TEMPLATE_ELEMENTS:
        template_problems.append(f"At most {MAX_TEMPLATE_ELEMENTS} elements.")
    program = argv_template[0]
    if not program.strip():
        template_problems.append("Element 0 must name the program.")
    if placeholders(program):
        template_problems.append("Element 0 (the program) may not contain a placeholder.")
    if any("\0" in a for a in argv_template):
        template_problems.append("Elements may not contain NUL bytes.")
    if not schema_problems:
        properties = parameters_schema.get("properties", {})
        required = set(parameters_schema.get("required", []))
        for name in sorted({p for element in argv_template for p in placeholders(element)}):
            if name not in properties:
                template_problems.append(f"Placeholder {{{name}}} is not a property of the parameter schema.")
            elif name not in required and "default" not in properties[name]:
                template_problems.append(f"Placeholder {{{name}}} must be required or have a default in the schema.")
    if template_problems:
        errors["argv_template"] = template_problems
    return errors


def schema_errors(schema: Any) -> list[str]:
    """What is wrong with a parameter schema (``[]`` when it is valid); see the module rules."""
    if not isinstance(schema, dict):
        return ['A JSON object, e.g. {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}.']
    try:
        Draft202012Validator.check_schema(schema)
    except jsonschema.SchemaError as exc:
        return [f"Not a valid JSON Schema: {exc.message}"]
    problems = []
    if schema.get("type") != "object":
        problems.append('The schema needs "type": "object".')
    properties = schema.get("properties", {})
    if not isinstance(properties, dict):
        return problems + ['"properties" must be an object.']
    for name, prop in properties.items():
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            problems.append(f"Property {name!r}: names are letters, digits and '_' (not starting with a digit).")
        if not isinstance(prop, dict):
            problems.append(f"Property {name!r}: must be an object.")
            continue
        if "enum" in prop:
            if not all(isinstance(v, (str, int, float, bool)) for v in prop["enum"]):
                problems.append(f"Property {name!r}: enum values must be strings, numbers or booleans.")
        elif prop.get("type") not in _SCALAR_TYPES:
            problems.append(f"Property {name!r}: type must be one of string, integer, number, boolean (or an enum).")
        if "default" in prop:
            try:
                Draft202012Validator(prop).validate(prop["default"])
            except jsonschema.ValidationError as exc:
                problems.append(f"Property {name!r}: the default is invalid: {exc.message}")
    return problems


def validate_arguments(schema: dict[str, Any], arguments: dict[str, Any]) -> dict[str, Any]:
    """Check ``arguments`` against ``schema``; return them with schema defaults filled in.

    Raises:
        ArgumentsInvalid: The jsonschema message of the most relevant error, with its path.
    """
    validator = Draft202012Validator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER)
    error = best_match(validator.iter_errors(arguments))
    if error is not None:
        where = "/".join(str(p) for p in error.absolute_path)
        raise ArgumentsInvalid(f"{where + ': ' if where else ''}{error.message}")
    values = dict(arguments)
    for name, prop in schema.get("properties", {}).items():
        if name not in values and isinstance(prop, dict) and "default" in prop:
            values[name] = prop["default"]
    return values


def render_value(value: Any, prop: dict[str, Any] | None = None) -> str:
    """One validated value as argv text (see the module's rendering rules).

    Raises:
        ArgumentsInvalid: The value is not a string, number or boolean.
    """
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        try:
            return str(value)
        except ValueError as exc:  # over Python's int-to-str digit limit (4300 digits)
            raise ArgumentsInvalid("The integer is too large to pass as an argument.") from exc
    if isinstance(value, float):
        if value.is_integer() and (prop or {}).get("type") == "integer":
            return str(int(value))
        return repr(value)
    if isinstance(value, str):
        return value
    raise ArgumentsInvalid(f"Cannot pass a {type(value).__name__} as a command-line argument.")


def render_argv(argv_template: list[str], schema: dict[str, Any], arguments: dict[str, Any]) -> list[str]:
    """Validate ``arguments`` and substitute them into the template: one element per element.

    Args:
        argv_template: A template valid under :func:`template_errors`.
        schema: Its parameter schema.
        arguments: The model's arguments (parsed JSON).

    Returns:
        The argv, ``len(argv) == len(argv_template)``.

    Raises:
        ArgumentsInvalid: Schema violation, a missing value, option injection (module rule),
            a NUL byte, or an argv larger than ``MAX_ARGV_BYTES``.
    """
    values = validate_arguments(schema, arguments)
    properties = schema.get("properties", {})
    argv: list[str] = []
    after_double_dash = False
    for element in argv_template:
        def substitute(match: re.Match[str], element: str = element, after_double_dash: bool = after_double_dash) -> str:
            name = match.group(1)
            if name is None:
                return match.group(0)[0]
            if name not in values:
                raise ArgumentsInvalid(f"Missing required parameter {name!r}.")
            prop = properties.get(name, {})
            text = render_value(values[name], prop)
            if "\0" in text:
                raise ArgumentsInvalid(f"{name}: the value may not contain a NUL character.")
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise ArgumentsInvalid(f"{name}: the value is not valid Unicode text ({exc.reason}).") from exc
            if (
                match.start() == 0 and text.startswith("-") and isinstance(values[name], str)
                and not after_double_dash and not prop.get(ALLOW_LEADING_DASH, False)
            ):
                raise ArgumentsInvalid(leading_dash_error(name))
            return text

        argv.append(PLACEHOLDER_RE.sub(substitute, element))
        if element == "--":
            after_double_dash = True
    size = sum(len(a.encode("utf-8")) for a in argv)
    if size > MAX_ARGV_BYTES:
        raise ArgumentsInvalid(f"The command line would be {size} bytes; the limit is {MAX_ARGV_BYTES}.")
    return argv
