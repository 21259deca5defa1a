"""Celery tasks of automations: thin wrappers around :mod:`automations.services`.

- ``automations.schedules_tick`` (beat, every minute): fires the due slots of every tenant's
  schedules, exactly one run per slot however many beats send it.
"""

from __future__ import annotations

from celery import shared_task


@shared_task(name="automations.schedules_tick", ignore_result=True, soft_time_limit=55, time_limit=60)
def schedules_tick() -> dict[str, int]:
    """:func:`automations.services.schedules_tick` now: ``{"due", "started", "failed"}``."""
    from automations.services import schedules_tick as tick

    return tick()
