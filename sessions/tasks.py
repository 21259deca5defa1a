"""Celery tasks: thin wrappers that hand runs to the worker's run host."""

from __future__ import annotations

from celery import shared_task


@shared_task(name="sessions.run_execute", acks_late=True, reject_on_worker_lost=True, ignore_result=True)
def run_execute(run_id: int, tenant_id: int | None = None) -> None:
    """Execute (or resume) run ``run_id`` on this worker process's event loop, through the
    production ports (PostgreSQL, Redis, the router, the capability kinds); ``tenant_id``: its
    tenant, if the sender knew it (see :func:`sessions.runner.loop.execute_run`)."""
    from sessions.runner.adapters import production_ports
    from sessions.runner.host import run_host
    from sessions.runner.loop import execute_run

    run_host().run(execute_run(run_id, tenant_id=tenant_id, ports=production_ports()))


def run_enqueue(run_id: int, tenant_id: int | None = None) -> None:
    """Hand run ``run_id`` to a worker: ``run_execute`` on the queue ``RUNS_QUEUE`` (default:
    the Celery default queue). Sending twice is harmless: the claim decides who runs it.

    ``tenant_id`` (the run's tenant, when the caller works in it) spares the worker a lookup.
    A wrong one makes the worker find no run, never another tenant's: the claim reads the run
    in that tenant only."""
    from django.conf import settings

    args = (run_id,) if tenant_id is None else (run_id, tenant_id)
    run_execute.apply_async(args, queue=settings.RUNS_QUEUE or settings.CELERY_TASK_DEFAULT_QUEUE)


@shared_task(name="sessions.runs_sweep", ignore_result=True)
def runs_sweep() -> dict[str, int]:
    """Resume or fail orphaned runs, expire approvals (see :func:`sessions.services.runs_sweep`)."""
    from sessions.services import runs_sweep as sweep

    return sweep()


@shared_task(name="sessions.chat_session_title_generate", ignore_result=True, soft_time_limit=60, time_limit=90)
def chat_session_title_generate(*, session_id: int, run_id: int, tenant_id: int) -> str:
    """Title chat ``session_id`` from its first exchange (run ``run_id``), in ``tenant_id``
    (see :func:`sessions.chat_services.chat_session_title_generate`)."""
    from sessions.chat_services import chat_session_title_generate as generate
    from tenants.scoping import tenant_scope

    with tenant_scope(int(tenant_id)):
        return generate(session_id=session_id, run_id=run_id)


def chat_title_enqueue(*, session_id: int, run_id: int, tenant_id: int) -> None:
    """Hand a chat whose first run completed to the title task (the default queue)."""
    chat_session_title_generate.apply_async(kwargs={"session_id": session_id, "run_id": run_id,
                                                    "tenant_id": tenant_id})


@shared_task(name="sessions.chat_sessions_purge", ignore_result=True, soft_time_limit=600, time_limit=660)
def chat_sessions_purge() -> int:
    """Purge chats deleted more than ``CHAT_PURGE_AFTER_DAYS`` ago (Celery beat, hourly; see
    :func:`sessions.chat_services.chat_sessions_purge`)."""
    from sessions.chat_services import chat_sessions_purge as purge

    return purge()


@shared_task(name="sessions.llm_bodies_purge", ignore_result=True, soft_time_limit=300, time_limit=330)
def llm_bodies_purge() -> int:
    """Delete model call records past their tenant's ``llm_body_retention_days`` (Celery beat,
    hourly; see :func:`sessions.llm_bodies.llm_bodies_purge`): how many."""
    from sessions.llm_bodies import llm_bodies_purge as purge

    return purge()

