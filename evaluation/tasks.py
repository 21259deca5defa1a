"""Celery tasks of the evaluation app: thin wrappers of :mod:`evaluation.services`."""

from __future__ import annotations

import logging

from celery import shared_task

logger = logging.getLogger(__name__)


@shared_task(name="evaluation.experiment_advance", ignore_result=True, soft_time_limit=600, time_limit=660)
def experiment_advance(experiment_id: int, tenant_id: int) -> str:
    """One step of experiment ``experiment_id`` in ``tenant_id``
    (:func:`evaluation.services.experiment_step`); sends itself again after
    ``EVALUATION_POLL_SECONDS`` until the experiment ends. A step that finds another step
    holding the experiment stops (that one goes on); an unexpected error ends the experiment
    ``failed``."""
    from evaluation.services import STEP_MORE, experiment_fail, experiment_step, poll_seconds
    from tenants.scoping import tenant_scope

    with tenant_scope(int(tenant_id)):
        try:
            outcome = experiment_step(experiment_id=experiment_id)
        except Exception as exc:
            logger.exception("experiment %s failed", experiment_id)
            experiment_fail(experiment_id=experiment_id, error=f"{type(exc).__name__}: {exc}")
            raise
    if outcome == STEP_MORE:
        experiment_advance.apply_async((experiment_id, tenant_id), countdown=poll_seconds(), queue=_queue())
    return outcome


def _queue() -> str:
    from django.conf import settings

    return settings.CELERY_TASK_DEFAULT_QUEUE


def experiment_enqueue(experiment_id: int, tenant_id: int) -> None:
    """Hand experiment ``experiment_id`` to a worker (the default queue)."""
    experiment_advance.apply_async((experiment_id, tenant_id), queue=_queue())
