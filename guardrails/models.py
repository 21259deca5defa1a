"""A guardrail: one ordered check of an agent at one point of its runs.

The checks themselves are :mod:`guardrails.checks`; a run reads its agent's guardrails once, at
the claim (live rows for the draft, the version's snapshot otherwise: :mod:`guardrails.specs`).
docs/admin-guide.md, "Guardrails".
"""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.db import models

from tenants.scoping import TenantOwnedModel


class GuardrailPoint(models.TextChoices):
    """Where in a run a guardrail checks."""

    INPUT = "input", "Input (the user's message, before the first model call)"
    TOOL_CALL = "tool_call", "Tool call (its arguments, before the tool runs)"
    TOOL_RESULT = "tool_result", "Tool result (after the tool ran, before the model reads it)"
    OUTPUT = "output", "Output (the answer, before it is final)"


class GuardrailKind(models.TextChoices):
    """What a guardrail checks (``config`` per kind: :data:`guardrails.checks.CONFIG_KEYS`)."""

    DENY_LIST = "deny_list", "Deny-list of words or phrases"
    REGEX = "regex", "Regular expression"
    PII = "pii", "Personal data (emails, phone numbers, IBANs, card numbers)"
    MAX_LENGTH = "max_length", "Maximum length"
    JSON_SCHEMA = "json_schema", "JSON Schema"
    MODEL_CHECK = "model_check", "Model check with a rubric"


class GuardrailAction(models.TextChoices):
    """What a match does: end the run (``block``), or replace the matches (``mask``: tool calls'
    arguments and tool results only; deny-list, regex and PII kinds only)."""

    BLOCK = "block", "Block: the run ends failed (guardrail_tripped)"
    MASK = "mask", "Mask the matches and go on"


class FailurePolicy(models.TextChoices):
    """What happens when the guardrail cannot run (its model is down, its pattern is broken)."""

    FAIL_CLOSED = "fail_closed", "Fail closed: treat it as tripped"
    FAIL_OPEN = "fail_open", "Fail open: let the text through"


MASKABLE_POINTS = frozenset({GuardrailPoint.TOOL_CALL, GuardrailPoint.TOOL_RESULT})
MASKABLE_KINDS = frozenset({GuardrailKind.DENY_LIST, GuardrailKind.REGEX, GuardrailKind.PII})


class Guardrail(TenantOwnedModel):
    """One check of ``agent``'s runs at ``point``; an agent's guardrails at one point run in
    ``position`` order (then id), and the first that trips ends the run.

    ``config`` by kind: ``deny_list`` ``{"words": [...]}`` (case-insensitive, whole words);
    ``regex`` ``{"pattern": "..."}`` (Python syntax, case-sensitive unless ``(?i)``); ``pii``
    ``{"types": ["email", "phone", "iban", "card"]}`` (default all four); ``max_length``
    ``{"max_chars": n}``; ``json_schema`` ``{"schema": {...}}`` (the text must be JSON valid
    against it); ``model_check`` ``{"rubric": "..."}`` with ``route`` set.
    """

    agent = models.ForeignKey("agents.AgentInstance", on_delete=models.CASCADE, related_name="guardrails")
    name = models.CharField(max_length=100, help_text="Shown to the user when it trips.")
    point = models.CharField(max_length=16, choices=GuardrailPoint.choices)
    kind = models.CharField(max_length=16, choices=GuardrailKind.choices)
    position = models.PositiveIntegerField(default=0, help_text="Order among the agent's guardrails at this point.")
    enabled = models.BooleanField(default=True)
    action = models.CharField(max_length=8, choices=GuardrailAction.choices, default=GuardrailAction.BLOCK)
    on_error = models.CharField(max_length=12, choices=FailurePolicy.choices, default=FailurePolicy.FAIL_CLOSED,
                                help_text="When the guardrail cannot run (fail closed by default).")
    config = models.JSONField(default=dict, blank=True, help_text="The kind's settings (see the admin guide).")
    message = models.CharField(max_length=500, blank=True,
                               help_text="Plain-language message shown in the chat when it trips (default: a generic one).")
    route = models.ForeignKey("llm.ModelRoute", on_delete=models.SET_NULL, null=True, blank=True, related_name="+",
                              help_text="model_check: the model route that judges the text.")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["agent_id", "point", "position", "id"]
        constraints = [models.UniqueConstraint(fields=["agent", "name"], name="guardrail_unique_name_per_agent")]

    def __str__(self) -> str:
        return f"{self.name} ({self.point}, {self.kind})"

    def clean(self) -> None:
        """Check the kind's ``config`` (:func:`guardrails.checks.config_problem`), the action, and
        that the agent and the route are the tenant's.

        Raises:
            ValidationError: by field, with a message that says what is wrong.
        """
        from guardrails.checks import config_problem

        errors: dict[str, str] = {}
        problem = config_problem(self.kind, self.config)
        if problem:
            errors["config"] = problem
        if self.action == GuardrailAction.MASK and (self.point not in MASKABLE_POINTS or self.kind not in MASKABLE_KINDS):
            errors["action"] = ("mask is for deny_list, regex and pii guardrails at tool_call or tool_result; "
                                "use block elsewhere.")
        if self.kind == GuardrailKind.MODEL_CHECK and self.route_id is None:
            errors["route"] = "A model_check guardrail needs a model route."
        errors.update(self._tenant_errors())
        if errors:
            raise ValidationError(errors)

    def _tenant_errors(self) -> dict[str, str]:
        """``agent`` or ``route`` not of the guardrail's tenant (the agent's, for a new row)."""
        errors: dict[str, str] = {}
        agent_tenant = self.agent.tenant_id if self.agent_id is not None else None
        if self.tenant_id is not None and agent_tenant is not None and agent_tenant != self.tenant_id:
            errors["agent"] = "The agent is not one of the tenant's."
        tenant_id = self.tenant_id or agent_tenant
        if self.route_id is not None and tenant_id is not None:
            route_model = type(self).route.field.related_model
            route_tenant = route_model.all_tenants.filter(pk=self.route_id).values_list("tenant_id", flat=True).first()
            if route_tenant != tenant_id:
                errors["route"] = "The route is not one of the tenant's."
        return errors
