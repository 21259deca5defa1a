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

Re-embedding (:func:`knowledge_base_reembed`, the Celery task ``knowledge.knowledge_base_reembed``):
when a knowledge base's embedding model changes (:func:`knowledge_base_update`), or an admin asks
for it because the model behind the provider entry changed (:func:`knowledge_base_reembed_request`,
which bumps ``embedding_revision``), every chunk whose ``embedding_fingerprint`` is not the
knowledge base's is embedded again, document by document, in batches of
:data:`EMBED_BATCH_SIZE`: a ready document goes ``embedding`` (``embedded_count``: its chunks of
the current model) and back to ``ready``. Documents being ingested when the model changes are
queued again (their ingestion then uses the new model). The job is idempotent (it only touches
stale chunks, each batch committed with its fingerprint) and resumable (``acks_late``: a lost
worker's job is delivered again and goes on with the chunks still stale); a newer model change
makes an older job stop. Search meanwhile compares only chunks of the current fingerprint
(:mod:`knowledge.retrieval`); :func:`knowledge.selectors.knowledge_base_embedding_progress`
says how far the job is.

Status events: every status change (and each embedding batch's progress) is handed, once its
transaction commits, to the listeners registered with :func:`document_status_listen` (a port:
the sessions layer publishes it to the chat the document was added from).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.db.models import Exists, OuterRef, Q
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


REEMBED_MAX_RETRIES = 5
"""Times a re-embedding job whose embedding requests fail is tried again (30 s, then doubling),
before the documents still holding old vectors end ``failed`` with the reason."""
REEMBED_RETRY_SECONDS = 30


class IngestError(Exception):
    """A step of the pipeline failed in a way the user should read (the status reason)."""


class ReembedRetry(Exception):
    """A re-embedding batch failed (the endpoint is down, timed out, refused): the task tries
    again later (``message`` is the reason a document fails with when it stops trying)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


# ------------------------------------------------------------------------------------ status events

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


def _status_changed(document_id: int) -> None:
    """Tell the listeners the document's status as it is once the current transaction commits
    (at once outside one)."""
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
    or its embedding model (``embedding_provider``, ``embedding_model``, ``dimensions``).

    A new chunking re-ingests every document. A new embedding model re-embeds every chunk:
    the re-embedding job is queued on commit (see the module docstring); documents being
    ingested are queued again so that their ingestion uses the new model. Until the job is
    done, searches compare only the chunks embedded by the new model (the lexical list still
    covers every chunk).

    Raises:
        ApplicationError: an unknown field, a provider of another tenant, or a name or
            chunking as in create.
    """
    allowed = {"name", "description", "chunk_size", "chunk_overlap", "embedding_provider", "embedding_model",
               "dimensions"}
    unknown = set(changes) - allowed
    if unknown:
        raise ApplicationError(f"Cannot change {', '.join(sorted(unknown))}.")
    kb = KnowledgeBase.objects.select_for_update().get(pk=knowledge_base.pk)
    if "embedding_provider" in changes and changes["embedding_provider"].tenant_id != kb.tenant_id:
        raise ApplicationError("Embedding provider not found.", extra={"fields": {"embedding_provider": ["Not found."]}})
    _check_chunking(changes.get("chunk_size", kb.chunk_size), changes.get("chunk_overlap", kb.chunk_overlap))
    if "name" in changes:
        _check_name_free(tenant_id=kb.tenant_id, owner_id=kb.owner_id, name=changes["name"], exclude_id=kb.pk)
    if "embedding_model" in changes and not (changes["embedding_model"] or "").strip():
        raise ApplicationError("embedding_model may not be empty.", extra={"fields": {"embedding_model": ["Required."]}})
    rechunk = any(key in changes and changes[key] != getattr(kb, key) for key in ("chunk_size", "chunk_overlap"))
    fingerprint = kb.embedding_fingerprint
    for key, value in changes.items():
        setattr(kb, key, value)
    kb.save()
    if rechunk:
        for document in Document.objects.filter(knowledge_base_id=kb.pk).only("pk"):
            _queue(document_id=document.pk)
    elif kb.embedding_fingerprint != fingerprint:
        _reembed_queue(kb)
    return kb


@transaction.atomic
def knowledge_base_reembed_request(*, knowledge_base: KnowledgeBase) -> KnowledgeBase:
    """Re-embed every chunk of the knowledge base with its (unchanged) embedding model: for
    when the model behind the provider entry changed (another server, another model file under
    the same name), which the platform cannot see. Bumps ``embedding_revision`` (a new
    fingerprint: until each chunk is done it is not vector-searched) and queues the job on
    commit, as a model change does.

    Returns:
        The knowledge base, with its new revision.
    """
    kb = KnowledgeBase.objects.select_for_update().get(pk=knowledge_base.pk)
    kb.embedding_revision += 1
    kb.save(update_fields=["embedding_revision", "updated_at"])
    _reembed_queue(kb)
    return kb


def _reembed_queue(kb: KnowledgeBase) -> None:
    """After ``kb``'s fingerprint changed (in the caller's transaction): queue again the
    documents being ingested (a task that read the old model stops at its next step; the new
    one reads the new model) and send the re-embedding job on commit."""
    KnowledgeBase.objects.filter(pk=kb.pk).update(reembedding=True)
    kb.reembedding = True
    working = (DocumentStatus.QUEUED, DocumentStatus.PARSING, DocumentStatus.EMBEDDING)
    for document in Document.objects.filter(knowledge_base_id=kb.pk, status__in=working, reembedding=False).only("pk"):
        _queue(document_id=document.pk)
    tenant_id, kb_id, fingerprint = kb.tenant_id, kb.pk, kb.embedding_fingerprint

    def send() -> None:
        from knowledge.tasks import knowledge_base_reembed_enqueue

        knowledge_base_reembed_enqueue(tenant_id=tenant_id, knowledge_base_id=kb_id, fingerprint=fingerprint)

    transaction.on_commit(send)


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
        reembedding=False, updated_at=timezone.now())
    _status_changed(document_id)
    row = Document.objects.filter(pk=document_id).values("tenant_id", "generation").get()
    tenant_id, generation = row["tenant_id"], row["generation"]

    def send() -> None:
        from knowledge.tasks import document_ingest_enqueue

        document_ingest_enqueue(tenant_id=tenant_id, document_id=document_id, generation=generation, force=force)

    transaction.on_commit(send)


@transaction.atomic
def document_add(*, knowledge_base: KnowledgeBase, source_kind: str, source: str, content: bytes = b"",
                 mime_type: str = "", title: str = "", tags: Any = None, created_by: Any = None,
                 chat_session_id: int | None = None) -> DocumentAdded:
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
        chat_session_id: The chat it is added from (the chat app; the caller checked it is the
            user's): the document's status events go there from now on. None keeps the last one.

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
        if chat_session_id is not None:
            existing.chat_session_id = chat_session_id
        if unchanged:
            existing.save(update_fields=["title", "tags", "chat_session_id", "updated_at"])
            return DocumentAdded(existing, queued=False)
        fields = ["title", "tags", "chat_session_id", "updated_at"]
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
        size_bytes=len(content), tags=tags_list, created_by=created_by, chat_session_id=chat_session_id,
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
def document_reingest(*, document: Document, chat_session_id: int | None = None) -> Document:
    """Queue the document's ingestion again (a URL is fetched again; a file is parsed again
    with the knowledge base's current chunking and embedding model), even if its content did
    not change. ``chat_session_id``: as for :func:`document_add`."""
    Document.objects.select_for_update().filter(pk=document.pk).first()
    if chat_session_id is not None:
        Document.objects.filter(pk=document.pk).update(chat_session_id=chat_session_id)
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
    if updated:
        _status_changed(document_id)
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


class _WrongVectors(Exception):
    """The embedding model answered with the wrong number or size of vectors (the message says which)."""


def _embed_batch(kb: KnowledgeBase, texts: list[str]) -> list[list[float]]:
    """One embedding request for ``texts`` with ``kb``'s model: one unit-length vector of
    ``kb.dimensions`` per text, in order.

    Raises:
        EmbeddingError: the request failed (:func:`llm.embeddings.embed_texts`).
        _WrongVectors: the model returned another number of vectors or another size.
    """
    from llm.embeddings import embed_texts

    result = embed_texts(kb.embedding_provider, kb.embedding_model, texts)
    if len(result) != len(texts) or any(len(v) != kb.dimensions for v in result):
        sizes = sorted({len(v) for v in result})
        raise _WrongVectors(f"The embedding model returned {len(result)} vectors of size {sizes} for "
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
            result = _embed_batch(kb, [chunk_index_text(d.heading, d.text) for d in batch])
        except EmbeddingError as exc:
            raise IngestError(f"Embedding failed ({kb.embedding_model}): {exc}") from exc
        except _WrongVectors as exc:
            raise IngestError(str(exc)) from None
        vectors.extend(result)
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
                  dimensions=kb.dimensions, embedding_fingerprint=kb.embedding_fingerprint)
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
                       chunk_count=0, reembedding=False):
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
        current = not Chunk.objects.filter(document_id=document.pk).exclude(
            embedding_fingerprint=kb.embedding_fingerprint).exists()  # else its vectors are another model's
        if unchanged and current and Chunk.objects.filter(document_id=document.pk).exists():
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


# ------------------------------------------------------------------------------------ re-embedding

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
    embedded in batches of :data:`EMBED_BATCH_SIZE`, each batch written with its fingerprint
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
    import time

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
            _fail(document_id, generation, f"Internal error while re-embedding: {type(exc).__name__}.")
            raise
        if outcome in ("stale", "continue"):
            return outcome


def _reembed_document(kb: KnowledgeBase, *, document_id: int, generation: int, deadline: float) -> str:
    """Re-embed one document's stale chunks: ``done``, ``skipped`` (re-queued or deleted
    meanwhile), ``stale`` (the model changed) or ``continue`` (``deadline`` passed).

    Raises:
        ReembedRetry: the embedding request failed.
    """
    import time

    from llm.embeddings import EmbeddingError

    fingerprint = kb.embedding_fingerprint
    with transaction.atomic():
        doc = (Document.objects.select_for_update().filter(_REEMBEDDABLE, pk=document_id, generation=generation)
               .only("pk").first())
        if doc is None:
            return "skipped"
        current = Chunk.objects.filter(document_id=document_id, embedding_fingerprint=fingerprint).count()
        _status_set(document_id=document_id, generation=generation, status=DocumentStatus.EMBEDDING,
                    reembedding=True, embedded_count=current)
    while True:
        batch = list(Chunk.objects.filter(document_id=document_id).exclude(embedding_fingerprint=fingerprint)
                     .order_by("position").only("pk", "heading", "text")[:EMBED_BATCH_SIZE])
        if not batch:
            break
        if time.monotonic() > deadline:
            return "continue"
        try:
            vectors = _embed_batch(kb, [chunk_index_text(c.heading, c.text) for c in batch])
        except EmbeddingError as exc:
            raise ReembedRetry(f"Re-embedding with {kb.embedding_model} failed: {exc}") from exc
        except _WrongVectors as exc:
            _fail(document_id, generation, f"Re-embedding: {exc}")
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
            _status_set(document_id=document_id, generation=generation, status=DocumentStatus.EMBEDDING,
                        embedded_count=done)
    with transaction.atomic():
        if not Document.objects.select_for_update().filter(pk=document_id, generation=generation,
                                                           reembedding=True).exists():
            return "skipped"
        count = Chunk.objects.filter(document_id=document_id).count()
        _status_set(document_id=document_id, generation=generation, status=DocumentStatus.READY, reembedding=False,
                    chunk_count=count, embedded_count=count)
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
        _fail(document_id, generation, reason)
