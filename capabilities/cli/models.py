"""The ``CliCommand`` model: an admin-defined command line the tenant's agents can be bound to.

Imported at the end of ``capabilities/models.py`` so Django registers it in the
``capabilities`` app. Rules for the template and schema: :mod:`capabilities.cli.template`.
"""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator, RegexValidator
from django.db import models

from capabilities.cli.template import template_errors
from tenants.scoping import TenantOwnedModel


def _default_schema() -> dict:
    return {"type": "object", "properties": {}, "required": []}


MAX_OUTPUT_BYTES_LIMIT = 16 * 1024 * 1024
"""Largest ``max_output_bytes`` an admin may set (16 MiB per stream)."""


class CliCommand(TenantOwnedModel):
    """A command line (argv template + parameter schema) run in the bubblewrap sandbox.

    ``env`` may hold secrets: stored encrypted with the tenant's data key
    (``tenants.crypto``), decrypted only by the runner, never returned or logged.
    """

    name = models.CharField(
        max_length=64,
        validators=[RegexValidator(r"^[a-zA-Z0-9_-]{1,64}$", "Letters, digits, '-' and '_' (the tool name).")],
        help_text="The tool name the model calls.",
    )
    description = models.TextField(
        blank=True, help_text="What the model reads: what the command does and when to call it.",
    )
    argv_template = models.JSONField(
        default=list,
        help_text=(
            'JSON list of strings, e.g. ["factor", "--", "{n}"]. {name} is a placeholder (a whole element or part '
            "of one); each element stays one argument; no shell. Element 0 is the program."
        ),
    )
    parameters_schema = models.JSONField(
        default=_default_schema,
        help_text=(
            'JSON Schema of the parameters: {"type": "object", "properties": {"n": {"type": "integer"}}, '
            '"required": ["n"]}. Types string, integer, number, boolean, or an enum.'
        ),
    )
    timeout_seconds = models.FloatField(
        default=30.0, validators=[MinValueValidator(0.1), MaxValueValidator(3600)],
        help_text="Killed (with its children) after this long.",
    )
    max_output_bytes = models.PositiveIntegerField(
        default=64 * 1024, validators=[MinValueValidator(1), MaxValueValidator(MAX_OUTPUT_BYTES_LIMIT)],
        help_text="Kept of stdout and of stderr, each; the rest is cut with a marker.",
    )
    allow_network = models.BooleanField(default=False, help_text="Let the sandbox use the network.")
    env_encrypted = models.TextField(blank=True, editable=False)
    unsandboxed = models.BooleanField(
        default=False,
        help_text=(
            "DANGER: always run directly on the worker, without the bubblewrap sandbox (no network, file "
            "system or user isolation). Only for trusted commands on workers without bubblewrap."
        ),
    )
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta(TenantOwnedModel.Meta):
        ordering = ["name"]
        constraints = [models.UniqueConstraint(fields=["tenant", "name"], name="clicommand_unique_name")]
        verbose_name = "CLI command"

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        """Raises ValidationError for a template or schema that breaks the rules."""
        errors = template_errors(self.argv_template, self.parameters_schema)
        if errors:
            raise ValidationError(errors)
