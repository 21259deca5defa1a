"""Reads of knowledge bases, documents and chunks. All need a tenant scope (the scoped
managers fail closed).

Who sees what: a member sees the tenant's tenant-wide knowledge bases (``owner`` null) and
their own (``owner`` = them); never another user's own, whatever their role (an admin
manages tenant-wide knowledge bases, not members' uploads). Missing, foreign-tenant and
other users' objects are the same None (the API answers 404 alike).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from django.db.models import Count, Q, QuerySet

from knowledge.models import Chunk, Document, KnowledgeBase


def knowledge_base_visible(*, user_id: int | None) -> Q:
    """The ``Q`` on KnowledgeBase of what ``user_id`` may read: tenant-wide ones and their own
    (``user_id`` None: tenant-wide ones only)."""
    if user_id is None:
        return Q(owner__isnull=True)
    return Q(owner__isnull=True) | Q(owner_id=user_id)


def document_visible(*, user_id: int | None) -> Q:
    """The ``Q`` on Document (or Chunk: any model with a ``knowledge_base`` foreign key) of
    what ``user_id`` may read: :func:`knowledge_base_visible` through ``knowledge_base``."""
    if user_id is None:
        return Q(knowledge_base__owner__isnull=True)
    return Q(knowledge_base__owner__isnull=True) | Q(knowledge_base__owner_id=user_id)


def knowledge_base_list_for_user(*, user_id: int | None) -> QuerySet[KnowledgeBase]:
    """The knowledge bases ``user_id`` may read in the current tenant, by name."""
    return KnowledgeBase.objects.filter(knowledge_base_visible(user_id=user_id)).order_by("name", "id")


def knowledge_base_get_for_user(*, knowledge_base_id: int, user_id: int | None) -> KnowledgeBase | None:
    """The knowledge base if ``user_id`` may read it in the current tenant, else None."""
    return KnowledgeBase.objects.filter(knowledge_base_visible(user_id=user_id), pk=knowledge_base_id).first()


def knowledge_base_may_write(*, knowledge_base: KnowledgeBase, user_id: int, is_admin: bool) -> bool:
    """True if the user may change the knowledge base and its documents: its owner for a
    user's own, a tenant owner/admin for a tenant-wide one."""
    if knowledge_base.owner_id is not None:
        return knowledge_base.owner_id == user_id
    return is_admin


def document_list(*, knowledge_base_id: int, status: str | None = None) -> QuerySet[Document]:
    """The knowledge base's documents (source bytes deferred), most recently updated first."""
    qs = Document.objects.filter(knowledge_base_id=knowledge_base_id).defer("content")
    if status:
        qs = qs.filter(status=status)
    return qs.order_by("-updated_at", "-id")


def document_get(*, knowledge_base_id: int, document_id: int) -> Document | None:
    """The document of that knowledge base in the current tenant (source bytes deferred), else None."""
    return Document.objects.filter(knowledge_base_id=knowledge_base_id, pk=document_id).defer("content").first()


def chunk_get_for_user(*, chunk_id: int, user_id: int | None) -> Chunk | None:
    """The chunk (with its document's title) if its knowledge base is one ``user_id`` may read
    in the current tenant, else None. The embedding is deferred."""
    visible = KnowledgeBase.objects.filter(knowledge_base_visible(user_id=user_id)).values("pk")
    return (Chunk.objects.filter(pk=chunk_id, knowledge_base_id__in=visible)
            .select_related("document").defer("embedding", "document__content").first())


@dataclass(frozen=True, slots=True)
class EmbeddingProgress:
    """How many of a knowledge base's chunks its current embedding model made."""

    knowledge_base_id: int
    reembedding: bool
    """A re-embedding job is under way (:attr:`KnowledgeBase.reembedding`)."""
    embedded: int
    """Chunks whose vector is of the current model (the ones the vector search compares)."""
    total: int
    """All its chunks (the lexical list searches them all)."""


def knowledge_base_embedding_progress(*, knowledge_base: KnowledgeBase) -> EmbeddingProgress:
    """``knowledge_base``'s chunks of its current embedding model against all (one counting
    query over the knowledge base's chunks: for the console and the API, not per search)."""
    counts = Chunk.objects.filter(knowledge_base_id=knowledge_base.pk).aggregate(
        total=Count("pk"), embedded=Count("pk", filter=Q(embedding_fingerprint=knowledge_base.embedding_fingerprint)))
    return EmbeddingProgress(knowledge_base_id=knowledge_base.pk, reembedding=knowledge_base.reembedding,
                             embedded=counts["embedded"], total=counts["total"])


def reembedding_notice(knowledge_bases: Iterable[KnowledgeBase]) -> str:
    """A sentence for a search's reader when some of ``knowledge_bases`` are being re-embedded
    (their flag only: no counting), else ''. Says that passages not yet re-embedded are found by
    their words only."""
    names = [kb.name for kb in knowledge_bases if kb.reembedding]
    if not names:
        return ""
    listed = ", ".join(f"“{name}”" for name in names)
    return (f"Note: {listed} {'is' if len(names) == 1 else 'are'} being re-embedded with a new embedding model; "
            "until that is done, passages not yet re-embedded are found by their words only, not by meaning.")


def reembedding_notice_for(*, knowledge_base_ids: Iterable[int], user_id: int | None) -> str:
    """:func:`reembedding_notice` for a search over ``knowledge_base_ids`` and, with
    ``user_id``, that user's own knowledge bases (as the ``knowledge_search`` tool searches):
    one query for the flagged ones. Requires the tenant scope."""
    wanted = Q(pk__in=list(knowledge_base_ids))
    if user_id is not None:
        wanted |= Q(owner_id=user_id)
    flagged = KnowledgeBase.objects.filter(wanted, knowledge_base_visible(user_id=user_id), reembedding=True)
    return reembedding_notice(flagged.order_by("name", "id").only("name", "reembedding"))
