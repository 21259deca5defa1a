"""The ingestion pipeline of one document: fetch, parse, chunk, embed, index.

:func:`document_ingest` (run by the Celery task ``knowledge.document_ingest``, queued by
:mod:`knowledge.services`):

    queued → parsing   (a URL is fetched here, through web_fetch's SSRF-safe path)
           → embedding (the chunks are embedded in batches; ``embedded_count`` is the progress)
           → ready     (the document's chunks replaced in one transaction)
           or failed   (``status_reason``: the fetch, parse or embedding error; no chunks left)

Each queued ingestion bumps ``Document.generation``; a task whose generation is no longer the
document's (the document was re-added or re-ingested meanwhile, or deleted) stops at its next
step and writes nothing, so two tasks for one document never mix their chunks. Every status
change goes through :mod:`knowledge.document_status`.

:func:`embed_batch` (one embedding request with a knowledge base's model) is shared with
:mod:`knowledge.reembedding`.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
from dataclasses import dataclass

from django.db import transaction
from django.utils import timezone

from knowledge.chunking import ChunkDraft, chunk_index_text, chunk_sections
from knowledge.document_status import document_fail, document_status_set
from knowledge.models import Chunk, Document, DocumentStatus, KnowledgeBase, SourceKind
from knowledge.parsing import MAX_DOCUMENT_BYTES, ParseError, detect_mime_type, parse_document

logger = logging.getLogger(__name__)

EMBED_BATCH_SIZE = 32
"""Chunks per embedding request (the progress moves per batch)."""


class IngestError(Exception):
    """A step of the pipeline failed in a way the user should read (the status reason)."""


class WrongVectors(Exception):
    """The embedding model answered with the wrong number or size of vectors (the message says which)."""


def document_ingest(*, document_id: int, generation: int, force: bool = False) -> str:
    """Run the ingestion pipeline for one document (see the module docstring). Requires the
    document's tenant scope (the task enters it).

    Args:
        document_id: The document.
        generation: The generation it was queued with; a newer one makes this a no-op.
        force: Re-parse and re-embed a URL even if its fetched content did not change.

    Returns:
        The status it ended in (``ready``, ``failed``), or ``stale`` when the document moved
        on or is gone. Never raises for bad documents or failing endpoints: they end
        ``failed`` with the reason; an unexpected error ends ``failed`` with ``internal error``
        and is re-raised (logged by Celery).
    """
    document = Document.objects.select_related("knowledge_base__embedding_provider").filter(
        pk=document_id, generation=generation).first()
    if document is None:
        return "stale"
    try:
        return _ingest(document, generation=generation, force=force)
    except (IngestError, ParseError) as exc:
        document_fail(document_id, generation, str(exc))
        return DocumentStatus.FAILED
    except Exception as exc:  # the top of the task: a document never stays in a working state
        logger.exception("ingestion of document %s failed", document_id)
        document_fail(document_id, generation, f"Internal error: {type(exc).__name__}.")
        raise


@dataclass(frozen=True, slots=True)
class _Source:
    """What the parser reads: the bytes, their type and charset, and the URL links resolve against."""

    content: bytes
    mime_type: str
    charset: str | None = None
    base_url: str = ""


def _ingest(document: Document, *, generation: int, force: bool) -> str:
    kb = document.knowledge_base
    if not document_status_set(document_id=document.pk, generation=generation, status=DocumentStatus.PARSING):
        return "stale"
    source: _Source | str = _Source(bytes(document.content), document.mime_type)
    if document.source_kind == SourceKind.URL:
        source = _url_source(document, kb, generation=generation, force=force)
        if isinstance(source, str):
            return source
    parsed = parse_document(source.content, mime_type=source.mime_type, charset=source.charset,
                            base_url=source.base_url)
    if parsed.title and document.title == document.source and document.source_kind != SourceKind.TEXT:
        Document.objects.filter(pk=document.pk, generation=generation).update(title=parsed.title[:300])
    drafts = chunk_sections(parsed.sections, size=kb.chunk_size, overlap=kb.chunk_overlap)
    if not drafts:
        raise IngestError("The document has no text.")
    if not document_status_set(document_id=document.pk, generation=generation, status=DocumentStatus.EMBEDDING,
                               chunk_count=len(drafts), embedded_count=0, char_count=parsed.char_count):
        return "stale"
    vectors = _embed(kb, drafts, document_id=document.pk, generation=generation)
    if vectors is None:
        return "stale"
    if not _replace_chunks(document, kb, drafts, vectors, generation=generation, char_count=parsed.char_count):
        return "stale"
    return DocumentStatus.READY


def _url_source(document: Document, kb: KnowledgeBase, *, generation: int, force: bool) -> _Source | str:
    """Fetch a URL document and keep what was fetched on it: the :class:`_Source` to parse, or
    the outcome when there is nothing more to do (``stale``; ``ready`` when the content did not
    change and the chunks are the current model's, unless ``force``)."""
    fetched = _fetch(document.source)
    sha = hashlib.sha256(fetched.content).hexdigest()
    unchanged = sha == document.content_sha256 and document.chunk_count > 0 and not force
    updated = Document.objects.filter(pk=document.pk, generation=generation).update(
        content=fetched.content, content_sha256=sha, size_bytes=len(fetched.content), mime_type=fetched.mime_type)
    if not updated:
        return "stale"
    chunks = Chunk.objects.filter(document_id=document.pk)
    current = not chunks.exclude(embedding_fingerprint=kb.embedding_fingerprint).exists()  # else another model's
    if unchanged and current and chunks.exists():
        document_status_set(document_id=document.pk, generation=generation, status=DocumentStatus.READY,
                            embedded_count=document.chunk_count, ingested_at=timezone.now())
        return DocumentStatus.READY
    return fetched


def _fetch(url: str) -> _Source:
    """GET ``url`` through web_fetch's SSRF-safe path: the body, its type and charset, and the
    final URL.

    Raises:
        IngestError: refused, failed, not 2xx, or larger than :data:`MAX_DOCUMENT_BYTES`.
    """
    from capabilities.netsafe import FetchError, safe_fetch

    try:
        result = asyncio.run(safe_fetch(url, max_bytes=min(MAX_DOCUMENT_BYTES, 5_000_000),
                                        accept="text/html, text/markdown, text/plain, application/pdf, "
                                               "application/vnd.openxmlformats-officedocument.wordprocessingml."
                                               "document;q=0.9, */*;q=0.1"))
    except FetchError as exc:
        raise IngestError(f"Fetching the URL failed ({exc.code}): {exc.message}") from exc
    if not 200 <= result.status_code < 300:
        raise IngestError(f"Fetching the URL failed: HTTP {result.status_code} {result.reason}.")
    if result.truncated:
        raise IngestError("The URL's content is larger than 5,000,000 bytes.")
    mime = detect_mime_type(file_name=url_path(result.url), declared=result.content_type, head=result.body[:4096])
    return _Source(result.body, mime, result.charset, result.url)


def url_path(url: str) -> str:
    """The path of ``url`` (for type detection by extension)."""
    from urllib.parse import urlsplit

    return urlsplit(url).path


def _normalised(vector: list[float]) -> list[float]:
    norm = math.sqrt(sum(x * x for x in vector))
    return [x / norm for x in vector] if norm > 0 else vector


def embed_batch(kb: KnowledgeBase, texts: list[str]) -> list[list[float]]:
    """One embedding request for ``texts`` with ``kb``'s model: one unit-length vector of
    ``kb.dimensions`` per text, in order.

    Raises:
        EmbeddingError: the request failed (:func:`llm.embeddings.embed_texts`).
        WrongVectors: the model returned another number of vectors or another size.
    """
    from llm.embeddings import embed_texts

    result = embed_texts(kb.embedding_provider, kb.embedding_model, texts)
    if len(result) != len(texts) or any(len(v) != kb.dimensions for v in result):
        sizes = sorted({len(v) for v in result})
        raise WrongVectors(f"The embedding model returned {len(result)} vectors of size {sizes} for "
                           f"{len(texts)} chunks; the knowledge base expects size {kb.dimensions}.")
    return [_normalised(list(v)) for v in result]


def _embed(kb: KnowledgeBase, drafts: list[ChunkDraft], *, document_id: int, generation: int) -> list[list[float]] | None:
    """Embed the chunks in batches, moving ``embedded_count``; None when the document moved on.

    Raises:
        IngestError: the embedding call failed or returned vectors of the wrong size.
    """
    from llm.embeddings import EmbeddingError

    vectors: list[list[float]] = []
    for start in range(0, len(drafts), EMBED_BATCH_SIZE):
        batch = drafts[start:start + EMBED_BATCH_SIZE]
        try:
            result = embed_batch(kb, [chunk_index_text(d.heading, d.text) for d in batch])
        except EmbeddingError as exc:
            raise IngestError(f"Embedding failed ({kb.embedding_model}): {exc}") from exc
        except WrongVectors as exc:
            raise IngestError(str(exc)) from None
        vectors.extend(result)
        if not document_status_set(document_id=document_id, generation=generation, status=DocumentStatus.EMBEDDING,
                                   embedded_count=len(vectors)):
            return None
    return vectors


def _replace_chunks(document: Document, kb: KnowledgeBase, drafts: list[ChunkDraft], vectors: list[list[float]],
                    *, generation: int, char_count: int) -> bool:
    """Swap the document's chunks for the new ones and mark it ready, in one transaction, if it
    is still at ``generation``."""
    from llm.tokens import estimate_text_tokens

    with transaction.atomic():
        locked = Document.objects.select_for_update().filter(pk=document.pk, generation=generation).first()
        if locked is None:
            return False
        Chunk.objects.filter(document_id=document.pk).delete()
        Chunk.objects.bulk_create([
            Chunk(tenant_id=document.tenant_id, knowledge_base_id=kb.pk, document_id=document.pk,
                  position=d.position, heading=d.heading, text=d.text, char_count=len(d.text),
                  token_count=estimate_text_tokens(chunk_index_text(d.heading, d.text)), embedding=v,
                  dimensions=kb.dimensions, embedding_fingerprint=kb.embedding_fingerprint)
            for d, v in zip(drafts, vectors, strict=True)
        ], batch_size=500)
        document_status_set(document_id=document.pk, generation=generation, status=DocumentStatus.READY,
                            chunk_count=len(drafts), embedded_count=len(drafts), char_count=char_count,
                            ingested_at=timezone.now())
    return True
