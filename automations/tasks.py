"""Celery tasks of automations: thin wrappers around :mod:`automations.services`.

- ``automations.schedules_tick`` (beat, every minute): fires the due slots of every tenant's
  schedules, exactly one run per slot however many beats send it.
- ``automations.webhook_rows_purge`` (beat, hourly): webhook rows past
  ``WEBHOOK_LOG_RETENTION_DAYS`` (:mod:`automations.retention`).
"""

from __future__ import annotations

from celery import shared_task


@shared_task(name="automations.schedules_tick", ignore_result=True, soft_time_limit=55, time_limit=60)
def schedules_tick() -> dict[str, int]:
    """:func:`automations.services.schedules_tick` now: ``{"due", "started", "failed"}``."""
    from automations.services import schedules_tick as tick

    return tick()


@shared_task(name="automations.delivery_attempt", ignore_result=True, soft_time_limit=60, time_limit=90)
def delivery_attempt(delivery_id: int, tenant_id: int) -> str | None:
    """One attempt of outbound delivery ``delivery_id`` (:func:`automations.outbound.delivery_attempt`):
    its status after it, or None when it was not due or another attempt held it."""
    from automations.outbound import delivery_attempt as attempt
    from tenants.scoping import tenant_scope

    with tenant_scope(int(tenant_id)):
        return attempt(delivery_id=delivery_id)


@shared_task(name="automations.deliveries_due", ignore_result=True, soft_time_limit=300, time_limit=330)
def deliveries_due() -> int:
    """Retry the outbound deliveries whose next attempt is due (beat, every minute)."""
    from automations.outbound import deliveries_due as due

    return due()


@shared_task(name="automations.webhook_rows_purge", ignore_result=True, soft_time_limit=300, time_limit=330)
def webhook_rows_purge() -> dict[str, int]:
    """:func:`automations.retention.webhook_rows_purge` now: ``{"deliveries", "inbound"}`` deleted."""
    from automations.retention import webhook_rows_purge as purge

    return purge()
