"""The automations app: runs started without a person typing and events sent to other systems
(issue 40, "Schedules" and "Webhooks"): cron schedules per agent, inbound webhook triggers per
agent, outbound webhook subscriptions per tenant."""

from typing import Any

from django.apps import AppConfig

RUN_EVENTS = {"run_completed": "run.completed", "run_failed": "run.failed"}
"""The session events of a run's end that outbound subscriptions receive, by their names there."""


def run_end_to_subscribers(tenant_id: int, run_id: int, event_type: str, data: dict[str, Any]) -> None:
    """The run-end observer (:data:`sessions.runs.ending.run_end_observers`): a completed or
    failed run becomes a ``run.completed`` / ``run.failed`` event of its tenant."""
    name = RUN_EVENTS.get(event_type)
    if name is None:
        return
    from automations.outbound import event_emit

    event_emit(tenant_id=tenant_id, event_type=name, data={"run_id": run_id, **data})


class AutomationsConfig(AppConfig):
    name = "automations"
    verbose_name = "Schedules and webhooks"

    def ready(self) -> None:
        from sessions.runs.ending import run_end_observers

        if run_end_to_subscribers not in run_end_observers:
            run_end_observers.append(run_end_to_subscribers)
