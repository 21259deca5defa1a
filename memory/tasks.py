"""Celery tasks of memory: thin wrappers around :mod:`memory.services`.

- ``memory.extract_due`` (beat, every ``MEMORY_EXTRACT_SCAN_SECONDS``): finds sessions idle for
  their agent's ``extract_after_idle_minutes`` with messages past their watermark and sends
  one ``memory.extract_session`` each.
- ``memory.extract_session(session_id, tenant_id, force)``: extracts one session (also sent
  by ``POST /api/v1/memories/extract/``).
- ``memory.expire`` (beat, hourly): deletes memories past their agent's ``retention_days``.
"""

from __future__ import annotations

import logging

from celery import shared_task

logger = logging.getLogger(__name__)


@shared_task(name="memory.extract_session", ignore_result=True, soft_time_limit=900, time_limit=960)
def memory_extract_session(session_id: int, tenant_id: int, force: bool = False) -> dict[str, object]:
    """Extract memories from session ``session_id`` of tenant ``tenant_id``
    (:func:`memory.services.memory_extract_session`).

    Returns:
        ``{"status": "done" | "missing" | "off" | "busy", ...counts}``; never raises for a
        missing session, memory switched off, a busy session or a failed batch (logged,
        retried by the next scan after its backoff; a model call refused because the tenant's
        monthly budget is spent is such a failure, ``error`` starting ``BudgetExceeded``).
    """
    from memory.services import ExtractionBusy, MemoryOff
    from memory.services import memory_extract_session as extract
    from sessions.models import ChatSession
    from tenants.scoping import tenant_scope

    with tenant_scope(int(tenant_id)):
        try:
            outcome = extract(session_id=session_id, force=force)
        except ChatSession.DoesNotExist:
            return {"status": "missing"}
        except MemoryOff:
            return {"status": "off"}
        except ExtractionBusy:
            return {"status": "busy"}
    return {"status": "done", "batches": outcome.batches, "added": outcome.added, "updated": outcome.updated,
            "replaced": outcome.replaced, "confirmed": outcome.confirmed, "error": outcome.error}


@shared_task(name="memory.extract_due", ignore_result=True)
def memory_extract_due() -> int:
    """Send ``memory.extract_session`` for every session due (:func:`memory.selectors.sessions_due_for_extraction`);
    returns how many were sent."""
    from django.utils import timezone

    from memory.selectors import sessions_due_for_extraction
    from tenants.scoping import system_scope

    with system_scope():
        due = sessions_due_for_extraction(now=timezone.now())
    for session_id, tenant_id in due:
        memory_extract_session.delay(session_id, tenant_id)
    return len(due)


@shared_task(name="memory.expire", ignore_result=True)
def memories_expire() -> int:
    """Delete memories past their retention (:func:`memory.services.memories_expire`); returns how many."""
    from memory.services import memories_expire as expire
    from tenants.scoping import system_scope

    with system_scope():
        deleted = expire()
    if deleted:
        logger.info("memory retention: %s memories deleted", deleted)
    return deleted
