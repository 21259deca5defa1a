"""The automations app: runs started without a person typing and events sent to other systems
(issue 40, "Schedules" and "Webhooks"): cron schedules per agent, inbound webhook triggers per
agent, outbound webhook subscriptions per tenant."""

from typing import Any

from django.apps import AppConfig

RUN_EVENTS = {"run_completed": "run.completed", "run_failed": "run.failed",
              "run_awaiting_approval": "approval.requested", "approval_resolved": "approval.decided"}
"""The session events of a run that outbound subscriptions receive, by their names there."""


def run_event_to_subscribers(tenant_id: int, run_id: int, event_type: str, data: dict[str, Any]) -> None:
    """The run-event observer (:data:`sessions.runs.records.run_event_observers`): a completed
    or failed run, one waiting for approvals, or an approval decided (by a person or its
    timeout) becomes a ``run.completed`` / ``run.failed`` / ``approval.requested`` /
    ``approval.decided`` event of its tenant."""
    name = RUN_EVENTS.get(event_type)
    if name is None:
        return
    from automations.outbound import event_emit

    event_emit(tenant_id=tenant_id, event_type=name, data={"run_id": run_id, **data})


A2A_PUSH_EVENTS = frozenset({"run_completed", "run_failed", "run_cancelled", "run_awaiting_approval"})
"""The session events of a run that are an A2A task's state change (completed, failed, canceled,
input-required): each is a push notification to the task's configs."""


def run_event_to_a2a_push(tenant_id: int, run_id: int, event_type: str, data: dict[str, Any]) -> None:
    """The run-event observer of A2A push notifications: the run's task as it stands now, to each
    push-notification config of the task (:func:`automations.outbound.task_push_emit`)."""
    if event_type not in A2A_PUSH_EVENTS:
        return
    from automations.outbound import task_push_emit

    task_push_emit(tenant_id=tenant_id, run_id=run_id)


class AutomationsConfig(AppConfig):
    name = "automations"
    verbose_name = "Schedules and webhooks"

    def ready(self) -> None:
        from sessions.runs.records import run_event_observers

        for observer in (run_event_to_subscribers, run_event_to_a2a_push):
            if observer not in run_event_observers:
                run_event_observers.append(observer)
