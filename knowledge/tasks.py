"""Celery tasks of knowledge: thin wrappers over :mod:`knowledge.services`."""

from __future__ import annotations

from celery import shared_task

from tenants.scoping import with_tenant_scope

INGEST_TIME_LIMIT_SECONDS = 1800
"""A document's whole ingestion (fetch, parse, every embedding batch): 30 minutes at most."""


@shared_task(name="knowledge.document_ingest", ignore_result=True, acks_late=True, reject_on_worker_lost=True,
             time_limit=INGEST_TIME_LIMIT_SECONDS + 60, soft_time_limit=INGEST_TIME_LIMIT_SECONDS)
@with_tenant_scope
def document_ingest(*, tenant_id: int, document_id: int, generation: int, force: bool = False) -> str:
    """Ingest document ``document_id`` of tenant ``tenant_id`` if it is still at ``generation``
    (see :func:`knowledge.services.document_ingest`). Runs in the tenant's scope; a wrong
    tenant finds no document (row-level security) and does nothing."""
    from knowledge.services import document_ingest as ingest

    return ingest(document_id=document_id, generation=generation, force=force)


def document_ingest_enqueue(*, tenant_id: int, document_id: int, generation: int, force: bool = False) -> None:
    """Send :func:`document_ingest` to the default queue (called on commit by the services)."""
    from django.conf import settings

    document_ingest.apply_async(
        kwargs={"tenant_id": tenant_id, "document_id": document_id, "generation": generation, "force": force},
        queue=settings.CELERY_TASK_DEFAULT_QUEUE)
