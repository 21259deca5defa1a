"""Writes of knowledge bases and documents: create, change, delete, and queue their work.

The work itself runs in Celery tasks (:mod:`knowledge.tasks`): a document's ingestion
(:mod:`knowledge.ingestion`: fetch, parse, chunk, embed, index) and a knowledge base's
re-embedding (:mod:`knowledge.reembedding`). These services queue it on commit: a document's
status is set here only when an ingestion is queued (a new ``generation``, status ``queued``);
every later transition belongs to the pipeline (:mod:`knowledge.document_status`).

A new chunking re-ingests every document of the knowledge base; a new embedding model (or
:func:`knowledge_base_reembed_request`) queues the re-embedding job and queues again the
documents being ingested (their ingestion then uses the new model).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from agent_platform.api_errors import ApplicationError
from knowledge import tasks
from knowledge.chunking import MAX_CHUNK_SIZE, MIN_CHUNK_SIZE
from knowledge.document_status import document_status_changed
from knowledge.models import (
    MAX_TAG_CHARS,
    MAX_TAGS,
    Document,
    DocumentStatus,
    KnowledgeBase,
    SourceKind,
)
from knowledge.parsing import MAX_DOCUMENT_BYTES, detect_mime_type

MAX_TEXT_BYTES = 5_000_000
"""A text document added through the API: at most 5 MB of UTF-8."""


# ------------------------------------------------------------------------------------ knowledge bases

def _check_chunking(chunk_size: int, chunk_overlap: int) -> None:
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
        tasks.knowledge_base_reembed_enqueue(tenant_id=tenant_id, knowledge_base_id=kb_id, fingerprint=fingerprint)

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
    Document.objects.filter(pk=document_id).update(
        status=DocumentStatus.QUEUED, status_reason="", embedded_count=0, generation=F("generation") + 1,
        reembedding=False, updated_at=timezone.now())
    document_status_changed(document_id)
    row = Document.objects.filter(pk=document_id).values("tenant_id", "generation").get()
    tenant_id, generation = row["tenant_id"], row["generation"]

    def send() -> None:
        tasks.document_ingest_enqueue(tenant_id=tenant_id, document_id=document_id, generation=generation, force=force)

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
    source = _checked_source(source_kind, source, content)
    tags_list = _clean_tags(tags)
    mime = _document_mime_type(source_kind, source, content, mime_type)
    sha = hashlib.sha256(content).hexdigest() if source_kind != SourceKind.URL else ""
    existing = (Document.objects.select_for_update()
                .filter(knowledge_base_id=knowledge_base.pk, source_kind=source_kind, source=source).first())
    if existing is not None:
        # A title equal to the source is the default (the document's own title once parsed):
        # re-adding the same file must not put the file name back over the parsed title.
        if title and title != source:
            existing.title = title[:300]
        existing.tags = tags_list if tags is not None else existing.tags
        if chat_session_id is not None:
            existing.chat_session_id = chat_session_id
        return _document_replace(existing, content=content, sha=sha, mime_type=mime)
    document = Document.objects.create(
        tenant_id=knowledge_base.tenant_id, knowledge_base=knowledge_base, title=(title or source)[:300],
        source_kind=source_kind, source=source, mime_type=mime, content=content, content_sha256=sha,
        size_bytes=len(content), tags=tags_list, created_by=created_by, chat_session_id=chat_session_id,
    )
    _queue(document_id=document.pk)
    document.refresh_from_db()
    return DocumentAdded(document, queued=True)


def _checked_source(source_kind: str, source: str, content: bytes) -> str:
    """``source`` stripped, after checking the kind, its length and the content's size.

    Raises:
        ApplicationError: an unknown kind, no source or a too long one, too much content (413).
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
    return source


def _document_mime_type(source_kind: str, source: str, content: bytes, declared: str) -> str:
    """The type the document is parsed as: '' for a URL (its fetch decides), Markdown for a
    text unless another type was declared, else detected from the name, the declared type and
    the bytes.

    Raises:
        ApplicationError: a file of an unsupported type (415).
    """
    if source_kind == SourceKind.URL:
        return ""
    if source_kind == SourceKind.TEXT:
        return "text/markdown" if declared in ("", "text/markdown") else declared
    mime = detect_mime_type(file_name=source, declared=declared, head=content[:4096])
    if not mime:
        raise ApplicationError(f"Unsupported file type for {source!r} ({declared or 'no type given'}); "
                               "supported: text, Markdown, HTML, PDF, DOCX.",
                               extra={"fields": {"file": ["Unsupported type."]}}, status_code=415)
    return mime


def _document_replace(existing: Document, *, content: bytes, sha: str, mime_type: str) -> DocumentAdded:
    """Save an existing document's new title, tags and chat (set on it by the caller) and, unless
    it is ready with the same content, its new content, queueing its ingestion. A URL keeps its
    last fetch: the task compares the next one with it."""
    is_url = existing.source_kind == SourceKind.URL
    fields = ["title", "tags", "chat_session_id", "updated_at"]
    if not is_url and existing.content_sha256 == sha and existing.status == DocumentStatus.READY:
        existing.save(update_fields=fields)
        return DocumentAdded(existing, queued=False)
    if not is_url:
        existing.content, existing.content_sha256, existing.size_bytes = content, sha, len(content)
        existing.mime_type = mime_type
        fields += ["content", "content_sha256", "size_bytes", "mime_type"]
    existing.save(update_fields=fields)
    _queue(document_id=existing.pk)
    existing.refresh_from_db()
    return DocumentAdded(existing, queued=True)


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
