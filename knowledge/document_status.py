"""A document's status: the writers of the pipeline's transitions and the status events.

One writer per state change: a document's status is set only by :func:`document_status_set`
(every transition of the ingestion and re-embedding pipelines, :mod:`knowledge.ingestion` and
:mod:`knowledge.reembedding`), :func:`document_fail` (which also drops the chunks) and the
functions of :mod:`knowledge.services` that queue an ingestion.

Status events: every status change (and each embedding batch's progress) is handed, once its
transaction commits, to the listeners registered with :func:`document_status_listen` (a port:
the sessions layer publishes it to the chat the document was added from).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.utils import timezone

from knowledge.models import Chunk, Document, DocumentStatus

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class DocumentStatusChange:
    """A document's status after a change, as :func:`document_status_listen` listeners get it
    (after the change committed)."""

    tenant_id: int
    document_id: int
    knowledge_base_id: int
    chat_session_id: int | None
    """The chat the document was last added from (:attr:`Document.chat_session_id`), or None."""
    title: str
    status: str
    """A :class:`~knowledge.models.DocumentStatus` value."""
    status_reason: str
    """Why it failed ('' otherwise)."""
    chunk_count: int
    embedded_count: int
    """Chunks embedded so far (progress while ``embedding``; = chunk_count when ready)."""


DocumentStatusListener = Callable[[DocumentStatusChange], None]
_status_listeners: list[DocumentStatusListener] = []


def document_status_listen(listener: DocumentStatusListener) -> None:
    """Call ``listener(change)`` after every committed status change of a document (queued,
    parsing, embedding with each batch's progress, ready, failed). Registered once per process
    (an app's ``ready()``); registering the same callable again does nothing. A listener runs
    in the writer's thread, after the commit; what it raises is logged, never passed on (the
    pipeline does not stop for a lost notification)."""
    if listener not in _status_listeners:
        _status_listeners.append(listener)


def document_status_changed(document_id: int) -> None:
    """Tell the listeners the document's status as it is once the current transaction commits
    (at once outside one). Called by every writer of a document's status."""
    if not _status_listeners:
        return

    def notify() -> None:
        # tenant-bypass: the hook runs after the commit, in whatever scope the writer's caller
        # is in (seed_demo: system scope around a tenant_scope that has ended); the id is the
        # writer's own document, and row-level security still applies underneath.
        row = (Document.all_tenants.filter(pk=document_id)
               .values("tenant_id", "knowledge_base_id", "chat_session_id", "title", "status", "status_reason",
                       "chunk_count", "embedded_count").first())
        if row is None:  # deleted meanwhile
            return
        change = DocumentStatusChange(document_id=document_id, **row)
        for listener in list(_status_listeners):
            try:
                listener(change)
            except Exception:  # noqa: BLE001 - a notification, never the pipeline's failure
                logger.exception("document status listener %r failed for document %s", listener, document_id)

    transaction.on_commit(notify)


def document_status_set(*, document_id: int, generation: int, status: str, reason: str = "", **fields: Any) -> bool:
    """Move the document to ``status`` (with ``status_reason`` = ``reason``, at most 2,000
    characters, and the other ``fields`` of :class:`~knowledge.models.Document`) if it is still
    at ``generation``. Requires the document's tenant scope; the change's event goes to the
    listeners on commit.

    Returns:
        False when the document is gone or was queued again (the caller stops).
    """
    updated = Document.objects.filter(pk=document_id, generation=generation).update(
        status=status, status_reason=reason[:2000], updated_at=timezone.now(), **fields)
    if updated:
        document_status_changed(document_id)
    return bool(updated)


def document_fail(document_id: int, generation: int, reason: str) -> None:
    """Failed with ``reason`` if the document is still at ``generation``; its chunks go (they
    no longer match its content). One transaction."""
    with transaction.atomic():
        if document_status_set(document_id=document_id, generation=generation, status=DocumentStatus.FAILED,
                               reason=reason, chunk_count=0, reembedding=False):
            Chunk.objects.filter(document_id=document_id).delete()
