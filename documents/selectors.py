"""Reads of documents. All need a tenant scope (``Document.objects`` fails closed)."""

from __future__ import annotations

from django.db.models import Q, QuerySet

from documents.models import Document


def document_filter_for_run(*, session_id: int, user_id: int | None) -> Q:
    """The ``Q`` on Document of what a run of ``session_id`` started by ``user_id`` may see.

    Used by the selectors below and by ``documents.services`` (writes check it too).
    """
    # A run sees the documents of every session of its user that is not deleted (its own never
    # is while it runs: deleting a chat cancels its runs); with no user (a system run), its own
    # session's.
    if user_id is None:
        return Q(session_id=session_id)
    return Q(session__user_id=user_id, session__deleted_at__isnull=True)


def document_get_for_run(*, document_id: int, session_id: int, user_id: int | None) -> Document | None:
    """The document if a run of ``session_id`` started by ``user_id`` may see it, else None
    (the same for missing and foreign ids). Requires tenant scope."""
    visible = document_filter_for_run(session_id=session_id, user_id=user_id)
    return Document.objects.filter(visible, pk=document_id).first()


def document_list_for_run(*, session_id: int, user_id: int | None, limit: int = 100) -> list[Document]:
    """Up to ``limit`` documents a run may see, most recently updated first (content deferred)."""
    return list(Document.objects.filter(document_filter_for_run(session_id=session_id, user_id=user_id))
                .defer("content").order_by("-updated_at", "-id")[:limit])


def document_get_for_user(*, document_id: int, user_id: int) -> Document | None:
    """The document if it is in the current tenant and its session belongs to the user (and is not
    deleted), else None."""
    return Document.objects.filter(pk=document_id, session__user_id=user_id, session__deleted_at__isnull=True).first()


def document_list_for_user(*, user_id: int, session_id: int | None = None) -> QuerySet[Document]:
    """The user's documents in the current tenant (optionally of one session; deleted chats'
    left out), newest first."""
    qs = Document.objects.filter(session__user_id=user_id, session__deleted_at__isnull=True)
    if session_id is not None:
        qs = qs.filter(session_id=session_id)
    return qs.order_by("-updated_at", "-id")
