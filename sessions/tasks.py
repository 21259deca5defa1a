"""Celery tasks: thin wrappers that hand runs to the worker's run host."""

from __future__ import annotations

from celery import shared_task


@shared_task(name="sessions.run_execute", acks_late=True, reject_on_worker_lost=True, ignore_result=True)
def run_execute(run_id: int) -> None:
    """Execute (or resume) run ``run_id`` on this worker process's event loop."""
    from sessions.runner.host import run_host
    from sessions.runner.loop import execute_run

    run_host().run(execute_run(run_id))


def run_enqueue(run_id: int) -> None:
    """Hand run ``run_id`` to a worker: ``run_execute`` on the queue ``RUNS_QUEUE`` (default:
    the Celery default queue). Sending twice is harmless: the claim decides who runs it."""
    from django.conf import settings

    run_execute.apply_async((run_id,), queue=settings.RUNS_QUEUE or settings.CELERY_TASK_DEFAULT_QUEUE)


@shared_task(name="sessions.runs_sweep", ignore_result=True)
def runs_sweep() -> dict[str, int]:
    """Resume or fail orphaned runs, expire approvals (see :func:`sessions.services.runs_sweep`)."""
    from sessions.services import runs_sweep as sweep

    return sweep()
