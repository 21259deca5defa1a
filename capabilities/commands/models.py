"""The Command model: a tenant's slash command, a Markdown template the chat app fills in."""

from __future__ import annotations

import re

from django.core.exceptions import ValidationError
from django.core.validators import RegexValidator
from django.db import models

from tenants.scoping import TenantOwnedModel

COMMAND_NAME_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,63}$"
"""A command's name, typed after ``/``: lowercase letters, digits, ``_`` and ``-``."""
ARGUMENT_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}\Z")
"""A named argument, written ``$name`` or ``${name}`` in the template."""
FREE_TEXT_ARGUMENT = "ARGUMENTS"
"""The reserved argument ``$ARGUMENTS``: everything typed after the command's name."""
MAX_ARGUMENTS = 20
"""The most named arguments one command may declare."""
MAX_TEMPLATE_CHARS = 50_000
"""The longest template (a command is a prompt, not a document)."""


class Command(TenantOwnedModel):
    """A slash command: ``/name`` in the chat app puts ``template`` into the message box, its
    placeholders filled in (:func:`capabilities.commands.rendering.command_render`).

    Bound to an agent (``CapabilityBinding`` of kind ``command``, ``config = {"command": <id>}``),
    it is listed in that agent's chat (``GET /api/v1/agents/<id>/commands/``) beside the prompts
    of the agent's MCP servers. It offers no tool to the model: the person chooses it.

    ``template`` is Markdown with ``$ARGUMENTS`` (what the person typed after the name) and
    ``$name`` / ``${name}`` for each of ``arguments`` (``[{name, description, required}]``);
    ``$$`` is a literal ``$``.
    """

    name = models.CharField(
        max_length=64, validators=[RegexValidator(COMMAND_NAME_PATTERN, "Lowercase letters, digits, '_' and '-' "
                                                                        "(at most 64), starting with a letter or digit.")],
        help_text="Typed after / in the chat: /name.",
    )
    description = models.CharField(max_length=500, blank=True, help_text="Shown in the chat's command list.")
    template = models.TextField(
        help_text="Markdown put into the message box: $ARGUMENTS is what was typed after the name, $name (or ${name}) "
                  "a named argument's value, $$ a literal $.",
    )
    arguments = models.JSONField(
        default=list, blank=True,
        help_text='Named arguments, asked for in a small form: [{"name": "language", "description": "…", '
                  '"required": true}, …].',
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta(TenantOwnedModel.Meta):
        ordering = ["name"]
        constraints = [models.UniqueConstraint(fields=["tenant", "name"], name="command_unique_name")]

    def __str__(self) -> str:
        return f"/{self.name}"

    def clean(self) -> None:
        """Check ``arguments`` (:func:`arguments_errors`) and the template's length.

        Raises:
            ValidationError: ``{field: message}``.
        """
        problem = arguments_errors(self.arguments)
        if problem:
            raise ValidationError({"arguments": problem})
        if len(self.template or "") > MAX_TEMPLATE_CHARS:
            raise ValidationError({"template": f"At most {MAX_TEMPLATE_CHARS:,} characters."})


def arguments_errors(arguments: object) -> str:
    """What is wrong with a command's ``arguments`` ('' when fine).

    Valid: a list of at most :data:`MAX_ARGUMENTS` objects ``{name, description?, required?}``:
    ``name`` as :data:`ARGUMENT_NAME_RE`, not ``ARGUMENTS``, each name once; ``description`` a
    string; ``required`` true or false.
    """
    if not isinstance(arguments, list):
        return 'A JSON list of {"name": ..., "description": ..., "required": true|false} objects.'
    if len(arguments) > MAX_ARGUMENTS:
        return f"At most {MAX_ARGUMENTS} arguments."
    seen: set[str] = set()
    for i, argument in enumerate(arguments, start=1):
        name = argument.get("name") if isinstance(argument, dict) else None
        if not isinstance(name, str) or not ARGUMENT_NAME_RE.match(name):
            return f"Argument {i}: 'name' must be letters, digits and '_' (at most 64), not starting with a digit."
        unknown = sorted(set(argument) - {"name", "description", "required"})
        if unknown:
            return f"Argument {name!r}: unknown keys {unknown} (use name, description, required)."
        if name == FREE_TEXT_ARGUMENT:
            return f"Argument {i}: {FREE_TEXT_ARGUMENT} is reserved: write $ARGUMENTS in the template instead."
        if name in seen:
            return f"Argument {name!r} is declared twice."
        seen.add(name)
        if not isinstance(argument.get("description", ""), str):
            return f"Argument {name!r}: 'description' must be a string."
        if not isinstance(argument.get("required", False), bool):
            return f"Argument {name!r}: 'required' must be true or false."
    return ""
