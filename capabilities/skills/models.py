"""The Skill model: a tenant's named set of instructions an agent can delegate a task to."""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator, RegexValidator
from django.db import models

from tenants.scoping import TenantOwnedModel

SKILL_NAME_PATTERN = r"^[a-zA-Z0-9_-]{1,64}$"
"""A skill's name is its tool name: the OpenAI function-name rule."""


class Skill(TenantOwnedModel):
    """A skill: instructions (Markdown) a bound agent can run as a sub-run through a tool.

    Bound to an agent (``CapabilityBinding`` of kind ``skill``), it is offered to the model as
    a tool named ``name`` with ``description`` and one ``task`` argument. Calling it runs a
    sub-run whose system prompt is ``instructions`` and whose user message is the task, with
    the tools of the calling run that match ``allowed_tools`` (exposed names or fnmatch
    patterns; empty list = no tools), at most ``max_loop_count`` model turns, on
    ``model_route`` if set, else on the agent's route.

    ``source`` keeps the whole SKILL.md the skill was last imported or pasted from ("" when
    edited field by field).
    """

    name = models.CharField(
        max_length=64, validators=[RegexValidator(SKILL_NAME_PATTERN, "Letters, digits, '_' and '-' (at most 64).")],
        help_text="The tool name the model sees.",
    )
    description = models.TextField(help_text="What the skill does and when to use it (the model reads it).")
    instructions = models.TextField(help_text="Markdown: the sub-run's system prompt.")
    allowed_tools = models.JSONField(
        default=list, blank=True,
        help_text=(
            "Tools of the calling run the sub-run may use: exposed names or shell-style patterns "
            '(["web_*", "todo_write"]). Empty: no tools.'
        ),
    )
    model_route = models.ForeignKey(
        "llm.ModelRoute", null=True, blank=True, on_delete=models.SET_NULL, related_name="skills",
        help_text="Route for the sub-run; blank: the calling agent's route.",
    )
    max_loop_count = models.PositiveIntegerField(
        default=8, validators=[MinValueValidator(1), MaxValueValidator(200)],
        help_text="Model turns per sub-run; the last one is offered no tools.",
    )
    source = models.TextField(blank=True, help_text="The SKILL.md this skill was imported from.")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta(TenantOwnedModel.Meta):
        ordering = ["name"]
        constraints = [models.UniqueConstraint(fields=["tenant", "name"], name="skill_unique_name")]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        if not isinstance(self.allowed_tools, list) or not all(
            isinstance(t, str) and t for t in self.allowed_tools
        ):
            raise ValidationError({"allowed_tools": "A JSON list of tool names or patterns."})
        if self.model_route_id and self.tenant_id and self.model_route.tenant_id != self.tenant_id:
            raise ValidationError({"model_route": "Route not found."})
