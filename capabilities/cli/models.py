"""The ``CliCommand`` model: an operator's CLI template enabled for a tenant, bindable to agents.

Imported at the end of ``capabilities/models.py`` so Django registers it in the
``capabilities`` app. Rules for argv templates and schemas: :mod:`capabilities.cli.template`
and :mod:`capabilities.catalogue`.
"""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator, RegexValidator
from django.db import models

from tenants.scoping import TenantOwnedModel


def _default_schema() -> dict:
    return {"type": "object", "properties": {}, "required": []}


MAX_OUTPUT_BYTES_LIMIT = 16 * 1024 * 1024
"""Largest ``max_output_bytes`` an admin may set (16 MiB per stream)."""


class CliCommand(TenantOwnedModel):
    """A CLI command of a tenant: an operator's template (:class:`~capabilities.catalogue.ProgramTemplate`
    of kind ``cli``) enabled for the tenant under a tool name, with its parameters and secrets.

    The tenant chooses the template, fills its parameters and secrets (``env``: only the names
    the template declares; stored encrypted with the tenant's data key, decrypted only by the
    runner, never returned or logged), and may lower the template's timeout and output cap. The
    program, argv, argument schema and sandbox profile are the template's.
    """

    name = models.CharField(
        max_length=64,
        validators=[RegexValidator(r"^[a-zA-Z0-9_-]{1,64}$", "Letters, digits, '-' and '_' (the tool name).")],
        help_text="The tool name the model calls.",
    )
    template = models.ForeignKey(
        "capabilities.ProgramTemplate", on_delete=models.PROTECT, null=True, blank=True, related_name="+",
        limit_choices_to={"kind": "cli", "enabled": True},
        help_text="The program, from the operator's catalogue.",
    )
    parameters = models.JSONField(default=dict, blank=True, help_text="Values of the template's tenant parameters.")
    description = models.TextField(
        blank=True, help_text="What the model reads: what the command does and when to call it (blank: the template's).",
    )
    timeout_seconds = models.FloatField(
        default=30.0, validators=[MinValueValidator(0.1), MaxValueValidator(3600)],
        help_text="Killed (with its children) after this long; at most the template's limit.",
    )
    max_output_bytes = models.PositiveIntegerField(
        default=64 * 1024, validators=[MinValueValidator(1), MaxValueValidator(MAX_OUTPUT_BYTES_LIMIT)],
        help_text="Kept of stdout and of stderr, each; the rest is cut with a marker. At most the template's.",
    )
    env_encrypted = models.TextField(blank=True, editable=False)
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta(TenantOwnedModel.Meta):
        ordering = ["name"]
        constraints = [models.UniqueConstraint(fields=["tenant", "name"], name="clicommand_unique_name")]
        verbose_name = "CLI command"

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        """Raises ValidationError: no template, a template of another kind or not offered to the
        tenant, parameters that do not fit it, or limits above the template's."""
        from capabilities.catalogue import TemplateKind, parameters_errors

        template = self.template
        if template is None:
            raise ValidationError({"template": "Choose a program from the operator's catalogue."})
        if template.kind != TemplateKind.CLI:
            raise ValidationError({"template": "This template is not a CLI command."})
        if self.tenant_id and not template.available_to(self.tenant_id):
            raise ValidationError({"template": "This template is not available to the tenant."})
        problems = parameters_errors(template, self.parameters)
        if problems:
            raise ValidationError({"parameters": problems})
        errors = {}
        if self.timeout_seconds and self.timeout_seconds > template.timeout_seconds:
            errors["timeout_seconds"] = f"At most the template's {template.timeout_seconds:g} s."
        if self.max_output_bytes and self.max_output_bytes > template.max_output_bytes:
            errors["max_output_bytes"] = f"At most the template's {template.max_output_bytes} bytes."
        if errors:
            raise ValidationError(errors)
