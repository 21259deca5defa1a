"""Re-embedding a knowledge base's chunks after its embedding model changed.

:func:`knowledge_base_reembed` (the Celery task ``knowledge.knowledge_base_reembed``, queued by
:mod:`knowledge.services`): when a knowledge base's embedding model changes
(:func:`~knowledge.services.knowledge_base_update`), or an admin asks for it because the model
behind the provider entry changed (:func:`~knowledge.services.knowledge_base_reembed_request`,
which bumps ``embedding_revision``), every chunk whose ``embedding_fingerprint`` is not the
knowledge base's is embedded again, document by document, in batches of
:data:`~knowledge.ingestion.EMBED_BATCH_SIZE`: a ready document goes ``embedding``
(``embedded_count``: its chunks of the current model) and back to ``ready``. Documents being
ingested when the model changes are queued again (their ingestion then uses the new model).
The job is idempotent (it only touches stale chunks, each batch committed with its
fingerprint) and resumable (``acks_late``: a lost worker's job is delivered again and goes on
with the chunks still stale); a newer model change makes an older job stop. Search meanwhile
compares only chunks of the current fingerprint (:mod:`knowledge.retrieval`);
:func:`knowledge.selectors.knowledge_base_embedding_progress` says how far the job is.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from django.db import transaction
from django.db.models import Exists, OuterRef, Q

from knowledge.chunking import chunk_index_text
from knowledge.document_status import document_fail, document_status_set
from knowledge.ingestion import EMBED_BATCH_SIZE, WrongVectors, embed_batch
from knowledge.models import Chunk, Document, DocumentStatus, KnowledgeBase

logger = logging.getLogger(__name__)

REEMBED_MAX_RETRIES = 5
"""Times a re-embedding job whose embedding requests fail is tried again (30 s, then doubling),
before the documents still holding old vectors end ``failed`` with the reason."""
REEMBED_RETRY_SECONDS = 30


class ReembedRetry(Exception):
    """A re-embedding batch failed (the endpoint is down, timed out, refused): the task tries
    again later (``message`` is the reason a document fails with when it stops trying)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


REEMBED_SLICE_SECONDS = 600.0
"""A re-embedding task works this long at most, then sends itself again to go on (a knowledge
base of 100,000 chunks takes about an hour on the embedded model; no task holds a worker, or
a time limit, that long)."""
_REEMBEDDABLE = Q(status=DocumentStatus.READY) | Q(status=DocumentStatus.EMBEDDING, reembedding=True)
"""Documents the job re-embeds: ready ones, and the ones it holds already (a resumed job)."""


def _stale_documents(kb: KnowledgeBase, fingerprint: str, *, exclude: set[int] = frozenset()) -> Any:
    """``kb``'s re-embeddable documents with a chunk not of ``fingerprint``, by id:
    ``(id, generation)`` rows."""
    stale = Chunk.objects.filter(document_id=OuterRef("pk")).exclude(embedding_fingerprint=fingerprint)
    return (Document.objects.filter(_REEMBEDDABLE, knowledge_base_id=kb.pk).filter(Exists(stale))
            .exclude(pk__in=list(exclude)).order_by("pk").values_list("pk", "generation"))


def knowledge_base_reembed(*, knowledge_base_id: int, fingerprint: str, final_attempt: bool = False,
                           slice_seconds: float = REEMBED_SLICE_SECONDS) -> str:
    """Re-embed the chunks of knowledge base ``knowledge_base_id`` that were not embedded by
    its current model, if that model is still ``fingerprint`` (see the module docstring).
    Requires the knowledge base's tenant scope (the task enters it).

    Document by document (lowest id first): the document goes ``embedding`` (``reembedding``
    set; ``embedded_count`` counts its chunks of the current model), its stale chunks are
    embedded in batches of :data:`~knowledge.ingestion.EMBED_BATCH_SIZE`, each batch written with its fingerprint
    in one transaction that holds the knowledge base's row (a model change waits for it, and
    a batch after a change is not written), then the document is ``ready`` again.

    Args:
        knowledge_base_id: The knowledge base.
        fingerprint: Its :attr:`~knowledge.models.KnowledgeBase.embedding_fingerprint` when the
            job was queued; another one now makes this a no-op (a newer job does the work).
        final_attempt: The task's last try: an embedding failure fails the documents still
            holding old vectors (their reason says so; "Ingest again" retries) instead of
            raising :class:`ReembedRetry`.
        slice_seconds: Work at most this long (checked between batches), then return
            ``continue`` (the task sends itself again).

    Returns:
        ``done`` (no stale chunk left), ``continue`` (time is up), ``stale`` (the model changed
        again or the knowledge base is gone) or ``failed`` (gave up, ``final_attempt``).

    Raises:
        ReembedRetry: an embedding request failed and this is not the final attempt (the
            documents keep their state; the next try goes on from there).
    """
    started = time.monotonic()
    kb = KnowledgeBase.objects.select_related("embedding_provider").filter(pk=knowledge_base_id).first()
    if kb is None or kb.embedding_fingerprint != fingerprint:
        return "stale"
    seen: set[int] = set()
    while True:
        row = _stale_documents(kb, fingerprint, exclude=seen).first()
        if row is None:
            _reembed_finished(kb.pk, fingerprint)
            return "done"
        document_id, generation = row
        seen.add(document_id)
        try:
            outcome = _reembed_document(kb, document_id=document_id, generation=generation,
                                        deadline=started + slice_seconds)
        except ReembedRetry as exc:
            if not final_attempt:
                raise
            _reembed_give_up(kb, fingerprint, f"{exc.message} Ingest the document again to retry.")
            _reembed_finished(kb.pk, fingerprint)
            return "failed"
        except Exception as exc:  # the top of the job: a document never stays in a working state
            logger.exception("re-embedding document %s failed", document_id)
            document_fail(document_id, generation, f"Internal error while re-embedding: {type(exc).__name__}.")
            raise
        if outcome in ("stale", "continue"):
            return outcome


def _reembed_document(kb: KnowledgeBase, *, document_id: int, generation: int, deadline: float) -> str:
    """Re-embed one document's stale chunks: ``done``, ``skipped`` (re-queued or deleted
    meanwhile), ``stale`` (the model changed) or ``continue`` (``deadline`` passed).

    Raises:
        ReembedRetry: the embedding request failed.
    """
    from llm.embeddings import EmbeddingError

    fingerprint = kb.embedding_fingerprint
    with transaction.atomic():
        doc = (Document.objects.select_for_update().filter(_REEMBEDDABLE, pk=document_id, generation=generation)
               .only("pk").first())
        if doc is None:
            return "skipped"
        current = Chunk.objects.filter(document_id=document_id, embedding_fingerprint=fingerprint).count()
        document_status_set(document_id=document_id, generation=generation, status=DocumentStatus.EMBEDDING,
                            reembedding=True, embedded_count=current)
    while True:
        batch = list(Chunk.objects.filter(document_id=document_id).exclude(embedding_fingerprint=fingerprint)
                     .order_by("position").only("pk", "heading", "text")[:EMBED_BATCH_SIZE])
        if not batch:
            break
        if time.monotonic() > deadline:
            return "continue"
        try:
            vectors = embed_batch(kb, [chunk_index_text(c.heading, c.text) for c in batch])
        except EmbeddingError as exc:
            raise ReembedRetry(f"Re-embedding with {kb.embedding_model} failed: {exc}") from exc
        except WrongVectors as exc:
            document_fail(document_id, generation, f"Re-embedding: {exc}")
            return "skipped"
        with transaction.atomic():
            locked = KnowledgeBase.objects.select_for_update().filter(pk=kb.pk).first()
            if locked is None or locked.embedding_fingerprint != fingerprint:
                return "stale"
            if not Document.objects.filter(pk=document_id, generation=generation, reembedding=True).exists():
                return "skipped"
            for chunk, vector in zip(batch, vectors, strict=True):
                chunk.embedding, chunk.dimensions = vector, kb.dimensions
                chunk.embedding_fingerprint = fingerprint
            Chunk.objects.bulk_update(batch, ["embedding", "dimensions", "embedding_fingerprint"])
            done = Chunk.objects.filter(document_id=document_id, embedding_fingerprint=fingerprint).count()
            document_status_set(document_id=document_id, generation=generation, status=DocumentStatus.EMBEDDING,
                                embedded_count=done)
    with transaction.atomic():
        if not Document.objects.select_for_update().filter(pk=document_id, generation=generation,
                                                           reembedding=True).exists():
            return "skipped"
        count = Chunk.objects.filter(document_id=document_id).count()
        document_status_set(document_id=document_id, generation=generation, status=DocumentStatus.READY,
                            reembedding=False, chunk_count=count, embedded_count=count)
    return "done"


def _reembed_finished(knowledge_base_id: int, fingerprint: str) -> None:
    """Clear the knowledge base's ``reembedding`` flag if its model is still ``fingerprint`` and
    no ready document holds a chunk of another (a newer job's flag stays; chunks of documents
    being ingested are replaced by their ingestion)."""
    with transaction.atomic():
        kb = KnowledgeBase.objects.select_for_update().filter(pk=knowledge_base_id).first()
        if kb is None or kb.embedding_fingerprint != fingerprint:
            return
        if not _stale_documents(kb, fingerprint).exists():
            KnowledgeBase.objects.filter(pk=kb.pk).update(reembedding=False)


def _reembed_give_up(kb: KnowledgeBase, fingerprint: str, reason: str) -> None:
    """The job stops trying: every document still holding old vectors ends failed with ``reason``."""
    for document_id, generation in list(_stale_documents(kb, fingerprint)):
        document_fail(document_id, generation, reason)
