"""The automations app: runs started without a person typing (issue 40, "Schedules" and
"Webhooks"): cron schedules per agent and inbound webhook triggers per agent."""

from django.apps import AppConfig


class AutomationsConfig(AppConfig):
    name = "automations"
    verbose_name = "Schedules and webhooks"
