"""Filling in a tenant command's template (no Django imports).

Placeholders (as Claude Code's custom slash commands write them, plus named arguments):

- ``$ARGUMENTS`` (or ``${ARGUMENTS}``): what the person typed after ``/name``; when the
  template has no ``$ARGUMENTS`` and something was typed, it is added after the text, after a
  blank line, so nothing typed is lost;
- ``$name`` / ``${name}``: the value of the declared argument ``name`` ("" when an optional
  one is left empty);
- ``$$``: a literal ``$``.

Any other ``$word`` (``$5``, ``$HOME``, an undeclared name) stays as written.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from capabilities.commands.models import FREE_TEXT_ARGUMENT

_PLACEHOLDER = re.compile(r"\$(?:(\$)|\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))")
MAX_VALUE_CHARS = 20_000
"""The longest value of one argument."""


class CommandArgumentsError(ValueError):
    """The values given for a command do not fit its arguments; ``message`` names them
    (``Missing required argument 'language'.``), ``missing`` / ``unknown`` list them."""

    def __init__(self, message: str, *, missing: Sequence[str] = (), unknown: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.message = message
        self.missing = list(missing)
        self.unknown = list(unknown)


def uses_free_text(template: str) -> bool:
    """Whether ``template`` has a ``$ARGUMENTS`` placeholder."""
    return any((m.group(2) or m.group(3)) == FREE_TEXT_ARGUMENT for m in _PLACEHOLDER.finditer(template))


def command_arguments(template: str, declared: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The arguments the chat app asks for: ``[{name, description, required}]``, the declared
    ones in order, then ``ARGUMENTS`` (optional free text) when the template uses it."""
    listed = [{"name": a["name"], "description": a.get("description", ""), "required": bool(a.get("required", False))}
              for a in declared]
    if uses_free_text(template):
        listed.append({"name": FREE_TEXT_ARGUMENT, "description": "Free text after the command.", "required": False})
    return listed


def arguments_check(declared: Sequence[Mapping[str, Any]], values: Mapping[str, Any], *,
                    free_text: bool = True) -> dict[str, str]:
    """``values`` checked against the ``declared`` arguments (``[{name, required}]``) and
    returned as strings (surrounding whitespace kept).

    Args:
        declared: The arguments (an MCP prompt's or a command's).
        values: ``{name: value}`` from the request.
        free_text: ``ARGUMENTS`` is accepted besides the declared names.

    Raises:
        CommandArgumentsError: a value that is not a string (or is longer than
            :data:`MAX_VALUE_CHARS`), a name not declared, a required argument missing or blank.
    """
    names = {a["name"] for a in declared} | ({FREE_TEXT_ARGUMENT} if free_text else set())
    _values_are_strings(values)
    unknown = sorted(set(values) - names)
    if unknown:
        raise CommandArgumentsError(f"Unknown argument{'s' if len(unknown) > 1 else ''}: "
                                    f"{', '.join(repr(n) for n in unknown)}.", unknown=unknown)
    missing = [a["name"] for a in declared if a.get("required") and not str(values.get(a["name"], "")).strip()]
    if missing:
        raise CommandArgumentsError(f"Missing required argument{'s' if len(missing) > 1 else ''}: "
                                    f"{', '.join(repr(n) for n in missing)}.", missing=missing)
    return {name: str(value) for name, value in values.items()}


def _values_are_strings(values: Mapping[str, Any]) -> None:
    """Raises CommandArgumentsError for a value that is not a string or is too long."""
    for name, value in values.items():
        if not isinstance(value, str):
            raise CommandArgumentsError(f"Argument {name!r} must be a string.")
        if len(value) > MAX_VALUE_CHARS:
            raise CommandArgumentsError(f"Argument {name!r} is longer than {MAX_VALUE_CHARS:,} characters.")


def command_render(template: str, declared: Sequence[Mapping[str, Any]], values: Mapping[str, Any]) -> str:
    """``template`` with its placeholders filled in from ``values`` (see the module docstring).

    Args:
        template: The command's Markdown.
        declared: Its named arguments ``[{name, description, required}]``.
        values: ``{name: value}``; ``ARGUMENTS``: the free text.

    Returns:
        The text for the message box.

    Raises:
        CommandArgumentsError: see :func:`arguments_check`.
    """
    checked = arguments_check(declared, values)
    names = {a["name"] for a in declared} | {FREE_TEXT_ARGUMENT}
    free_text = checked.get(FREE_TEXT_ARGUMENT, "")

    def fill(match: re.Match[str]) -> str:
        if match.group(1):
            return "$"
        name = match.group(2) or match.group(3)
        return checked.get(name, "") if name in names else match.group(0)

    text = _PLACEHOLDER.sub(fill, template)
    if free_text.strip() and not uses_free_text(template):
        text = f"{text.rstrip()}\n\n{free_text.strip()}"
    return text
