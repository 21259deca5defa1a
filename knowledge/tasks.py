"""Celery tasks of knowledge: thin wrappers over :mod:`knowledge.ingestion` and
:mod:`knowledge.reembedding` (queued on commit by :mod:`knowledge.services`)."""

from __future__ import annotations

from celery import shared_task

from knowledge.ingestion import document_ingest as ingest
from knowledge.reembedding import REEMBED_MAX_RETRIES, REEMBED_RETRY_SECONDS, ReembedRetry
from knowledge.reembedding import knowledge_base_reembed as reembed
from tenants.scoping import with_tenant_scope

INGEST_TIME_LIMIT_SECONDS = 1800
"""A document's whole ingestion (fetch, parse, every embedding batch): 30 minutes at most."""


@shared_task(name="knowledge.document_ingest", ignore_result=True, acks_late=True, reject_on_worker_lost=True,
             time_limit=INGEST_TIME_LIMIT_SECONDS + 60, soft_time_limit=INGEST_TIME_LIMIT_SECONDS)
@with_tenant_scope
def document_ingest(*, tenant_id: int, document_id: int, generation: int, force: bool = False) -> str:
    """Ingest document ``document_id`` of tenant ``tenant_id`` if it is still at ``generation``
    (see :func:`knowledge.ingestion.document_ingest`). Runs in the tenant's scope; a wrong
    tenant finds no document (row-level security) and does nothing."""
    return ingest(document_id=document_id, generation=generation, force=force)


def document_ingest_enqueue(*, tenant_id: int, document_id: int, generation: int, force: bool = False) -> None:
    """Send :func:`document_ingest` to the default queue (called on commit by the services)."""
    from django.conf import settings

    document_ingest.apply_async(
        kwargs={"tenant_id": tenant_id, "document_id": document_id, "generation": generation, "force": force},
        queue=settings.CELERY_TASK_DEFAULT_QUEUE)


REEMBED_TIME_LIMIT_SECONDS = 900
"""One slice of a re-embedding (:data:`knowledge.reembedding.REEMBED_SLICE_SECONDS` of work, then
the task sends itself again) plus the batch in flight: 15 minutes at most."""


@shared_task(bind=True, name="knowledge.knowledge_base_reembed", ignore_result=True, acks_late=True,
             reject_on_worker_lost=True, time_limit=REEMBED_TIME_LIMIT_SECONDS + 60,
             soft_time_limit=REEMBED_TIME_LIMIT_SECONDS)
@with_tenant_scope
def knowledge_base_reembed(self, *, tenant_id: int, knowledge_base_id: int, fingerprint: str) -> str:
    """Re-embed knowledge base ``knowledge_base_id``'s stale chunks while its embedding model is
    ``fingerprint`` (:func:`knowledge.reembedding.knowledge_base_reembed`). ``acks_late`` and
    ``reject_on_worker_lost``: a job whose worker died is delivered again and goes on where it
    was. A failing embedding endpoint is retried :data:`~knowledge.reembedding.REEMBED_MAX_RETRIES`
    times (30 s, then doubling) before the documents left fail; after a slice of work the task
    sends itself again."""
    try:
        outcome = reembed(knowledge_base_id=knowledge_base_id, fingerprint=fingerprint,
                          final_attempt=self.request.retries >= REEMBED_MAX_RETRIES)
    except ReembedRetry as exc:
        raise self.retry(countdown=REEMBED_RETRY_SECONDS * 2 ** self.request.retries,
                         max_retries=REEMBED_MAX_RETRIES) from exc
    if outcome == "continue":
        knowledge_base_reembed_enqueue(tenant_id=tenant_id, knowledge_base_id=knowledge_base_id,
                                       fingerprint=fingerprint)
    return outcome


def knowledge_base_reembed_enqueue(*, tenant_id: int, knowledge_base_id: int, fingerprint: str) -> None:
    """Send :func:`knowledge_base_reembed` to the default queue (called on commit by the services)."""
    from django.conf import settings

    knowledge_base_reembed.apply_async(
        kwargs={"tenant_id": tenant_id, "knowledge_base_id": knowledge_base_id, "fingerprint": fingerprint},
        queue=settings.CELERY_TASK_DEFAULT_QUEUE)
