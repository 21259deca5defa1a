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


def _subscribers_want(tenant_id: int, event_type: str, push_configured: bool) -> bool:
    """:func:`run_event_to_subscribers`' quick check: an event subscriptions receive, of a tenant
    not known (cached, fresh) to have none."""
    if event_type not in RUN_EVENTS:
        return False
    from automations.outbound import tenant_subscribes_cached

    return tenant_subscribes_cached(tenant_id) is not False


def _a2a_push_wants(tenant_id: int, event_type: str, push_configured: bool) -> bool:
    """:func:`run_event_to_a2a_push`' quick check: a task state change of a run with a push config."""
    return event_type in A2A_PUSH_EVENTS and push_configured


run_event_to_subscribers.wants = _subscribers_want  # type: ignore[attr-defined]
run_event_to_a2a_push.wants = _a2a_push_wants  # type: ignore[attr-defined]


class AutomationsConfig(AppConfig):
    name = "automations"
    verbose_name = "Schedules and webhooks"

    def ready(self) -> None:
        from sessions.runs.records import run_event_observers

        for observer in (run_event_to_subscribers, run_event_to_a2a_push):
            if observer not in run_event_observers:
                run_event_observers.append(observer)
