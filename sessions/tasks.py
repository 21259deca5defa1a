"""Celery tasks: thin wrappers that hand runs to the worker's run host."""

from __future__ import annotations

from celery import shared_task


@shared_task(name="sessions.run_execute", acks_late=True, reject_on_worker_lost=True, ignore_result=True)
def run_execute(run_id: int) -> None:
    """Execute (or resume) run ``run_id`` on this worker process's event loop."""
    from sessions.runner.host import run_host
    from sessions.runner.loop import execute_run

    run_host().run(execute_run(run_id))
