"""Writes of knowledge bases and documents, and the ingestion pipeline.

One writer per state change: a document's status is set only by :func:`_status_set` (every
transition of the pipeline) and by the functions that queue an ingestion. The pipeline,
:func:`document_ingest` (run by the Celery task ``knowledge.document_ingest``):

    queued → parsing   (a URL is fetched here, through web_fetch's SSRF-safe path)
           → embedding (the chunks are embedded in batches; ``embedded_count`` is the progress)
           → ready     (the document's chunks replaced in one transaction)
           or failed   (``status_reason``: the fetch, parse or embedding error; no chunks left)

Each queued ingestion bumps ``Document.generation``; a task whose generation is no longer the
document's (the document was re-added or re-ingested meanwhile, or deleted) stops at its next
step and writes nothing, so two tasks for one document never mix their chunks.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.utils import timezone

from agent_platform.api_errors import ApplicationError
from knowledge.chunking import ChunkDraft, chunk_index_text, chunk_sections
from knowledge.models import (
    MAX_TAG_CHARS,
    MAX_TAGS,
    Chunk,
    Document,
    DocumentStatus,
    KnowledgeBase,
    SourceKind,
)
from knowledge.parsing import MAX_DOCUMENT_BYTES, ParseError, detect_mime_type, parse_document

logger = logging.getLogger(__name__)

EMBED_BATCH_SIZE = 32
"""Chunks per embedding request (the progress moves per batch)."""
MAX_TEXT_BYTES = 5_000_000
"""A text document added through the API: at most 5 MB of UTF-8."""


class IngestError(Exception):
    """A step of the pipeline failed in a way the user should read (the status reason)."""


# ------------------------------------------------------------------------------------ knowledge bases

def _check_chunking(chunk_size: int, chunk_overlap: int) -> None:
    from knowledge.chunking import MAX_CHUNK_SIZE, MIN_CHUNK_SIZE

    if not MIN_CHUNK_SIZE <= chunk_size <= MAX_CHUNK_SIZE:
        raise ApplicationError(f"chunk_size must be {MIN_CHUNK_SIZE}–{MAX_CHUNK_SIZE} characters.",
                               extra={"fields": {"chunk_size": ["Out of range."]}})
    if not 0 <= chunk_overlap <= chunk_size // 2:
        raise ApplicationError(f"chunk_overlap must be 0–{chunk_size // 2} characters (at most half the size).",
                               extra={"fields": {"chunk_overlap": ["Out of range."]}})


@transaction.atomic
def knowledge_base_create(*, tenant: Any, name: str, description: str = "", owner: Any = None,
                          embedding_provider: Any = None, embedding_model: str = "", dimensions: int | None = None,
                          chunk_size: int = 500, chunk_overlap: int = 50) -> KnowledgeBase:
    """Create a knowledge base in ``tenant`` (``owner``: a user's own; None: tenant-wide).

    Without ``embedding_provider`` the tenant's embedded default is used
    (:func:`llm.embeddings.default_embedding_provider`, all-MiniLM-L6-v2, 384 dimensions).

    Raises:
        ApplicationError: the name is taken, the chunking is out of range, or a provider of
            another tenant was given.
    """
    from llm import embeddings

    _check_chunking(chunk_size, chunk_overlap)
    if embedding_provider is None:
        embedding_provider = embeddings.default_embedding_provider(tenant)
        embedding_model = embedding_model or embeddings.DEFAULT_EMBEDDING_MODEL
        dimensions = dimensions or embeddings.DEFAULT_EMBEDDING_DIMENSIONS
    if embedding_provider.tenant_id != tenant.pk:
        raise ApplicationError("Embedding provider not found.", extra={"fields": {"embedding_provider": ["Not found."]}})
    if not embedding_model or not dimensions:
        raise ApplicationError("Give embedding_model and dimensions with an embedding_provider.",
                               extra={"fields": {"dimensions": ["Required with embedding_provider."]}})
    _check_name_free(tenant_id=tenant.pk, owner_id=getattr(owner, "pk", None), name=name)
    return KnowledgeBase.objects.create(
        tenant=tenant, name=name, description=description, owner=owner, embedding_provider=embedding_provider,
        embedding_model=embedding_model, dimensions=dimensions, chunk_size=chunk_size, chunk_overlap=chunk_overlap,
    )


def _check_name_free(*, tenant_id: int, owner_id: int | None, name: str, exclude_id: int | None = None) -> None:
    qs = KnowledgeBase.objects.filter(name=name, owner_id=owner_id)
    if exclude_id is not None:
        qs = qs.exclude(pk=exclude_id)
    if qs.exists():
        raise ApplicationError(f"A knowledge base named {name!r} exists already.",
                               extra={"fields": {"name": ["Taken."]}})


@transaction.atomic
def knowledge_base_update(*, knowledge_base: KnowledgeBase, **changes: Any) -> KnowledgeBase:
    """Change a knowledge base's ``name``, ``description``, ``chunk_size``, ``chunk_overlap``
    or, while it has no documents, its embedding (``embedding_provider``, ``embedding_model``,
    ``dimensions``). A new chunking re-ingests every document.

    Raises:
        ApplicationError: an unknown field, the embedding changed while documents exist
            (their vectors would not compare), or a name or chunking as in create.
    """
    allowed = {"name", "description", "chunk_size", "chunk_overlap", "embedding_provider", "embedding_model",
               "dimensions"}
    unknown = set(changes) - allowed
    if unknown:
        raise ApplicationError(f"Cannot change {', '.join(sorted(unknown))}.")
    kb = KnowledgeBase.objects.select_for_update().get(pk=knowledge_base.pk)
    embedding_changed = any(
        key in changes and getattr(kb, key if key != "embedding_provider" else "embedding_provider_id")
        != (changes[key].pk if key == "embedding_provider" else changes[key])
        for key in ("embedding_provider", "embedding_model", "dimensions"))
    if embedding_changed and Document.objects.filter(knowledge_base_id=kb.pk).exists():
        raise ApplicationError("The embedding model cannot change while the knowledge base has documents "
                               "(their vectors would not compare); create another knowledge base.")
    if "embedding_provider" in changes and changes["embedding_provider"].tenant_id != kb.tenant_id:
        raise ApplicationError("Embedding provider not found.", extra={"fields": {"embedding_provider": ["Not found."]}})
    _check_chunking(changes.get("chunk_size", kb.chunk_size), changes.get("chunk_overlap", kb.chunk_overlap))
    if "name" in changes:
        _check_name_free(tenant_id=kb.tenant_id, owner_id=kb.owner_id, name=changes["name"], exclude_id=kb.pk)
    rechunk = any(key in changes and changes[key] != getattr(kb, key) for key in ("chunk_size", "chunk_overlap"))
    for key, value in changes.items():
        setattr(kb, key, value)
    kb.save()
    if rechunk:
        for document in Document.objects.filter(knowledge_base_id=kb.pk).only("pk"):
            _queue(document_id=document.pk)
    return kb


@transaction.atomic
def knowledge_base_delete(*, knowledge_base: KnowledgeBase) -> None:
    """Delete a knowledge base with its documents and chunks (running ingestions stop)."""
    KnowledgeBase.objects.filter(pk=knowledge_base.pk).delete()


# ---------------------------------------------------------------------------------------- documents

@dataclass(frozen=True, slots=True)
class DocumentAdded:
    """What :func:`document_add` did."""

    document: Document
    queued: bool
    """False when the source existed with the same content (no work)."""


def _clean_tags(tags: Any) -> list[str]:
    if tags is None:
        return []
    if not isinstance(tags, (list, tuple)) or not all(isinstance(t, str) for t in tags):
        raise ApplicationError("tags must be a list of strings.", extra={"fields": {"tags": ["A list of strings."]}})
    cleaned = sorted({t.strip() for t in tags if t.strip()})
    if len(cleaned) > MAX_TAGS or any(len(t) > MAX_TAG_CHARS for t in cleaned):
        raise ApplicationError(f"At most {MAX_TAGS} tags of at most {MAX_TAG_CHARS} characters.",
                               extra={"fields": {"tags": ["Too many or too long."]}})
    return cleaned


def _queue(*, document_id: int, force: bool = False) -> None:
    """Set the document queued with a new generation and send the task on commit (call in a
    transaction)."""
    from django.db.models import F

    Document.objects.filter(pk=document_id).update(
        status=DocumentStatus.QUEUED, status_reason="", embedded_count=0, generation=F("generation") + 1,
        updated_at=timezone.now())
    row = Document.objects.filter(pk=document_id).values("tenant_id", "generation").get()
    tenant_id, generation = row["tenant_id"], row["generation"]

    def send() -> None:
        from knowledge.tasks import document_ingest_enqueue

        document_ingest_enqueue(tenant_id=tenant_id, document_id=document_id, generation=generation, force=force)

    transaction.on_commit(send)


@transaction.atomic
def document_add(*, knowledge_base: KnowledgeBase, source_kind: str, source: str, content: bytes = b"",
                 mime_type: str = "", title: str = "", tags: Any = None, created_by: Any = None) -> DocumentAdded:
    """Add a source to a knowledge base, or update it: the same ``(source_kind, source)``
    with other content replaces the document's content (its chunks are replaced when the new
    ingestion is done); with the same content (SHA-256) and a ready document it does nothing.
    A URL is always queued (its content is fetched by the task, which compares then).

    Args:
        knowledge_base: The target (the caller checked the user may write it).
        source_kind: ``file``, ``url`` or ``text``.
        source: The file name, the URL, or the text's title (≤ 2,000 characters).
        content: The bytes (file, text); empty for a URL.
        mime_type: As declared (an upload's content type); the bytes and the name decide first.
        title: Shown in search hits; default: the document's own title, else ``source``.
        tags: Strings for filtering searches (≤ 20, each ≤ 64 characters).
        created_by: The user adding it.

    Returns:
        :class:`DocumentAdded`; the ingestion task is sent when the transaction commits.

    Raises:
        ApplicationError: too large, an unsupported type, bad tags or source.
    """
    if source_kind not in SourceKind.values:
        raise ApplicationError(f"Unknown source kind {source_kind!r}.")
    source = (source or "").strip()
    if not source or len(source) > 2000:
        raise ApplicationError("A source (file name, URL or title) of 1–2,000 characters is required.",
                               extra={"fields": {"source": ["Required, at most 2,000 characters."]}})
    if len(content) > MAX_DOCUMENT_BYTES:
        raise ApplicationError(f"The document is {len(content):,} bytes; at most {MAX_DOCUMENT_BYTES:,} are accepted.",
                               extra={"max_bytes": MAX_DOCUMENT_BYTES}, status_code=413)
    tags_list = _clean_tags(tags)
    if source_kind == SourceKind.URL:
        mime = ""
    elif source_kind == SourceKind.TEXT:
        mime = "text/markdown" if mime_type in ("", "text/markdown") else mime_type
    else:
        mime = detect_mime_type(file_name=source, declared=mime_type, head=content[:4096])
        if not mime:
            raise ApplicationError(f"Unsupported file type for {source!r} ({mime_type or 'no type given'}); "
                                   "supported: text, Markdown, HTML, PDF, DOCX.",
                                   extra={"fields": {"file": ["Unsupported type."]}}, status_code=415)
    sha = hashlib.sha256(content).hexdigest() if source_kind != SourceKind.URL else ""
    existing = (Document.objects.select_for_update()
                .filter(knowledge_base_id=knowledge_base.pk, source_kind=source_kind, source=source).first())
    if existing is not None:
        unchanged = (source_kind != SourceKind.URL and existing.content_sha256 == sha
                     and existing.status == DocumentStatus.READY)
        if title:
            existing.title = title[:300]
        existing.tags = tags_list if tags is not None else existing.tags
        if unchanged:
            existing.save(update_fields=["title", "tags", "updated_at"])
            return DocumentAdded(existing, queued=False)
        fields = ["title", "tags", "updated_at"]
        if source_kind != SourceKind.URL:  # a URL keeps its last fetch: the task compares the next one with it
            existing.content, existing.content_sha256, existing.size_bytes = content, sha, len(content)
            existing.mime_type = mime
            fields += ["content", "content_sha256", "size_bytes", "mime_type"]
        existing.save(update_fields=fields)
        _queue(document_id=existing.pk)
        existing.refresh_from_db()
        return DocumentAdded(existing, queued=True)
    document = Document.objects.create(
        tenant_id=knowledge_base.tenant_id, knowledge_base=knowledge_base, title=(title or source)[:300],
        source_kind=source_kind, source=source, mime_type=mime, content=content, content_sha256=sha,
        size_bytes=len(content), tags=tags_list, created_by=created_by,
    )
    _queue(document_id=document.pk)
    document.refresh_from_db()
    return DocumentAdded(document, queued=True)


def document_add_text(*, knowledge_base: KnowledgeBase, title: str, text: str, tags: Any = None,
                      created_by: Any = None) -> DocumentAdded:
    """Add (or update) a text document, read as Markdown; ``title`` identifies it in the
    knowledge base. See :func:`document_add`."""
    data = text.encode("utf-8")
    if len(data) > MAX_TEXT_BYTES:
        raise ApplicationError(f"The text is {len(data):,} bytes; at most {MAX_TEXT_BYTES:,} are accepted.",
                               extra={"max_bytes": MAX_TEXT_BYTES}, status_code=413)
    return document_add(knowledge_base=knowledge_base, source_kind=SourceKind.TEXT, source=title, content=data,
                        mime_type="text/markdown", title=title, tags=tags, created_by=created_by)


def document_add_url(*, knowledge_base: KnowledgeBase, url: str, title: str = "", tags: Any = None,
                     created_by: Any = None) -> DocumentAdded:
    """Add (or re-fetch) a web page or file by URL. The URL is checked now (scheme, length,
    credentials) and fetched by the ingestion task through :func:`capabilities.netsafe.safe_fetch`
    (public addresses only, redirects re-checked, size-capped).

    Raises:
        ApplicationError: an invalid URL.
    """
    from capabilities.netsafe import FetchError, validate_url

    try:
        validate_url(url)
    except FetchError as exc:
        raise ApplicationError(exc.message, extra={"fields": {"url": [exc.message]}}) from exc
    return document_add(knowledge_base=knowledge_base, source_kind=SourceKind.URL, source=url, title=title,
                        tags=tags, created_by=created_by)


@transaction.atomic
def document_reingest(*, document: Document) -> Document:
    """Queue the document's ingestion again (a URL is fetched again; a file is parsed again
    with the knowledge base's current chunking), even if its content did not change."""
    Document.objects.select_for_update().filter(pk=document.pk).first()
    _queue(document_id=document.pk, force=True)
    return Document.objects.defer("content").get(pk=document.pk)


@transaction.atomic
def document_delete(*, document: Document) -> None:
    """Delete the document and its chunks (a running ingestion of it stops at its next step)."""
    Document.objects.filter(pk=document.pk).delete()


# --------------------------------------------------------------------------------------- ingestion

def _status_set(*, document_id: int, generation: int, status: str, reason: str = "", **fields: Any) -> bool:
    """Move the document to ``status`` if it is still at ``generation``; False when it is
    gone or was queued again (the caller stops)."""
    updated = Document.objects.filter(pk=document_id, generation=generation).update(
        status=status, status_reason=reason[:2000], updated_at=timezone.now(), **fields)
    return bool(updated)


def _fetch(url: str) -> tuple[bytes, str, str | None, str]:
    """GET ``url`` through web_fetch's SSRF-safe path: ``(body, mime type, charset, final url)``.

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
    mime = detect_mime_type(file_name=httpx_path(result.url), declared=result.content_type, head=result.body[:4096])
    return result.body, mime, result.charset, result.url


def httpx_path(url: str) -> str:
    """The path of ``url`` (for type detection by extension)."""
    from urllib.parse import urlsplit

    return urlsplit(url).path


def _normalised(vector: list[float]) -> list[float]:
    norm = math.sqrt(sum(x * x for x in vector))
    return [x / norm for x in vector] if norm > 0 else vector


def _embed(kb: KnowledgeBase, drafts: list[ChunkDraft], *, document_id: int, generation: int) -> list[list[float]] | None:
    """Embed the chunks in batches, moving ``embedded_count``; None when the document moved on.

    Raises:
        IngestError: the embedding call failed or returned vectors of the wrong size.
    """
    from llm.embeddings import EmbeddingError, embed_texts

    vectors: list[list[float]] = []
    for start in range(0, len(drafts), EMBED_BATCH_SIZE):
        batch = drafts[start:start + EMBED_BATCH_SIZE]
        try:
            result = embed_texts(kb.embedding_provider, kb.embedding_model,
                                 [chunk_index_text(d.heading, d.text) for d in batch])
        except EmbeddingError as exc:
            raise IngestError(f"Embedding failed ({kb.embedding_model}): {exc}") from exc
        if len(result) != len(batch) or any(len(v) != kb.dimensions for v in result):
            sizes = sorted({len(v) for v in result})
            raise IngestError(f"The embedding model returned {len(result)} vectors of size {sizes} for "
                              f"{len(batch)} chunks; the knowledge base expects size {kb.dimensions}.")
        vectors.extend(_normalised(list(v)) for v in result)
        if not _status_set(document_id=document_id, generation=generation, status=DocumentStatus.EMBEDDING,
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
                  dimensions=kb.dimensions)
            for d, v in zip(drafts, vectors, strict=True)
        ], batch_size=500)
        _status_set(document_id=document.pk, generation=generation, status=DocumentStatus.READY,
                    chunk_count=len(drafts), embedded_count=len(drafts), char_count=char_count,
                    ingested_at=timezone.now())
    return True


def _fail(document_id: int, generation: int, reason: str) -> None:
    """Failed with ``reason``; the document's chunks go (they no longer match its content)."""
    with transaction.atomic():
        if _status_set(document_id=document_id, generation=generation, status=DocumentStatus.FAILED, reason=reason,
                       chunk_count=0):
            Chunk.objects.filter(document_id=document_id).delete()


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
        _fail(document_id, generation, str(exc))
        return DocumentStatus.FAILED
    except Exception as exc:  # the top of the task: a document never stays in a working state
        logger.exception("ingestion of document %s failed", document_id)
        _fail(document_id, generation, f"Internal error: {type(exc).__name__}.")
        raise


def _ingest(document: Document, *, generation: int, force: bool) -> str:
    kb = document.knowledge_base
    if not _status_set(document_id=document.pk, generation=generation, status=DocumentStatus.PARSING):
        return "stale"
    content, mime, charset, base_url = bytes(document.content), document.mime_type, None, ""
    if document.source_kind == SourceKind.URL:
        content, mime, charset, base_url = _fetch(document.source)
        sha = hashlib.sha256(content).hexdigest()
        unchanged = sha == document.content_sha256 and document.chunk_count > 0 and not force
        updated = Document.objects.filter(pk=document.pk, generation=generation).update(
            content=content, content_sha256=sha, size_bytes=len(content), mime_type=mime)
        if not updated:
            return "stale"
        if unchanged and Chunk.objects.filter(document_id=document.pk).exists():
            _status_set(document_id=document.pk, generation=generation, status=DocumentStatus.READY,
                        embedded_count=document.chunk_count, ingested_at=timezone.now())
            return DocumentStatus.READY
    parsed = parse_document(content, mime_type=mime, charset=charset, base_url=base_url)
    if parsed.title and document.title == document.source and document.source_kind != SourceKind.TEXT:
        Document.objects.filter(pk=document.pk, generation=generation).update(title=parsed.title[:300])
    drafts = chunk_sections(parsed.sections, size=kb.chunk_size, overlap=kb.chunk_overlap)
    if not drafts:
        raise IngestError("The document has no text.")
    if not _status_set(document_id=document.pk, generation=generation, status=DocumentStatus.EMBEDDING,
                       chunk_count=len(drafts), embedded_count=0, char_count=parsed.char_count):
        return "stale"
    vectors = _embed(kb, drafts, document_id=document.pk, generation=generation)
    if vectors is None:
        return "stale"
    if not _replace_chunks(document, kb, drafts, vectors, generation=generation, char_count=parsed.char_count):
        return "stale"
    return DocumentStatus.READY
