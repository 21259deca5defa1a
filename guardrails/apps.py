"""The guardrails app: per-agent checks at a run's input, tool calls, tool results and output
(issue 39, "Guardrails"). docs/admin-guide.md, "Guardrails"."""

from django.apps import AppConfig


class GuardrailsConfig(AppConfig):
    name = "guardrails"
    verbose_name = "Guardrails"
