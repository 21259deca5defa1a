"""A chat's attachments added to the user's own knowledge base ("Add to knowledge", issue 26).

A user may add a file they attached to a chat to their own knowledge base when the chat's agent
allows it: its ``knowledge`` binding (the one a run uses, :func:`capabilities.registry.binding_specs`)
has ``user_uploads: true``. That agent's ``knowledge_search`` then searches the user's own
knowledge bases too, for that user only (:mod:`knowledge.kind`).

- The knowledge base is the user's own one named :data:`UPLOADS_KNOWLEDGE_BASE`, created on
  first use with the tenant's default (embedded) embedding model.
- The attachment becomes a ``file`` document named after the attachment, ingested by the usual
  Celery task (queued → parsing → embedding → ready, or failed with a reason).
- The same content (SHA-256) added again is the same document: no copy, no new ingestion
  (a failed one is ingested again). A different file with the name of an earlier one replaces
  that document's content, as an upload of the same file name through the knowledge API does.
- Its status reaches the chat as events: the document remembers the chat it was last added
  from (``Document.chat_session_id``), and every committed status change (and each embedding
  batch) is published there as ``document_status_changed`` (:func:`document_status_publish`,
  registered with :func:`knowledge.document_status.document_status_listen` by this app's ``ready()``);
  the chat app updates the document's status line from it, and asks the API only while its
  event stream is down or for documents added from another chat.

This module sits in the sessions layer and calls :mod:`knowledge.services` (knowledge is below
sessions); the run never comes through here. Every function needs the request's tenant scope.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import BinaryField, CharField, F, Func, QuerySet, Value

from agent_platform.api_errors import ApplicationError, NotFound
from knowledge.document_status import DocumentStatusChange
from knowledge.models import Document, DocumentStatus, KnowledgeBase, SourceKind
from sessions import events
from sessions.models import Artifact, ChatSession

UPLOADS_KNOWLEDGE_BASE = "My knowledge"
"""The name of the user's own knowledge base their chat attachments are added to."""
UPLOADS_KNOWLEDGE_BASE_DESCRIPTION = "Files you added from your chats."
NOT_ALLOWED_MESSAGE = "This agent does not allow adding files to your knowledge."
NOT_ATTACHMENT_MESSAGE = "Only files you attached to the chat can be added to your knowledge."
ARTIFACT_NOT_FOUND = "Artifact not found."
WORKING_STATUSES = (DocumentStatus.QUEUED, DocumentStatus.PARSING, DocumentStatus.EMBEDDING, DocumentStatus.READY)
"""A document with the same content in one of these is returned as it is (no new ingestion)."""


@dataclass(frozen=True, slots=True)
class KnowledgeUpload:
    """What :func:`artifact_add_to_knowledge` did."""

    document: Document
    """The document (source bytes deferred), as it is now."""
    queued: bool
    """True when an ingestion was queued (a new document, new content, or a failed one again);
    False when the same content was there already, ready or being ingested."""


def chat_knowledge_uploads_allowed(*, agent_id: int) -> bool:
    """True if the agent's runs search the user's own knowledge bases: its ``knowledge``
    binding, as a run loads it (enabled bindings by id, the first knowledge one that loads), has
    ``user_uploads: true``. Reads through the capability registry, as the runner does."""
    from agents.models import CapabilityBinding
    from capabilities.registry import binding_specs, specs_of

    bindings = list(CapabilityBinding.objects.filter(agent_id=agent_id, enabled=True, kind="knowledge").order_by("id"))
    return any(getattr(spec, "user_uploads", False) for spec in specs_of(binding_specs(bindings), "knowledge"))


def uploads_knowledge_base_get(*, user_id: int) -> KnowledgeBase | None:
    """The user's own :data:`UPLOADS_KNOWLEDGE_BASE` in the current tenant, or None before
    their first upload."""
    return KnowledgeBase.objects.filter(owner_id=user_id, name=UPLOADS_KNOWLEDGE_BASE).first()


def uploads_knowledge_base_ensure(*, tenant: Any, user: Any) -> KnowledgeBase:
    """The user's own :data:`UPLOADS_KNOWLEDGE_BASE`, created if missing (owner = the user,
    the tenant's default embedding provider and model, :func:`llm.embeddings.default_embedding_provider`,
    default chunking). Two first uploads at once make one knowledge base."""
    from knowledge.services import knowledge_base_create

    kb = uploads_knowledge_base_get(user_id=user.pk)
    if kb is not None:
        return kb
    try:
        with transaction.atomic():
            return knowledge_base_create(tenant=tenant, owner=user, name=UPLOADS_KNOWLEDGE_BASE,
                                         description=UPLOADS_KNOWLEDGE_BASE_DESCRIPTION)
    except (IntegrityError, ApplicationError):  # created meanwhile by a concurrent request
        kb = uploads_knowledge_base_get(user_id=user.pk)
        if kb is None:
            raise
        return kb


def _attachment(*, session: ChatSession, artifact_id: int) -> Artifact:
    artifact = Artifact.objects.filter(pk=artifact_id, session_id=session.pk).first()
    if artifact is None:
        raise NotFound(ARTIFACT_NOT_FOUND)
    if artifact.run_id is not None or artifact.tool_call_id is not None:
        raise ApplicationError(NOT_ATTACHMENT_MESSAGE)
    return artifact


@transaction.atomic
def artifact_add_to_knowledge(*, session: ChatSession, artifact_id: int, user: Any) -> KnowledgeUpload:
    """Add an attachment of ``session`` (the caller's own chat, already checked) to the user's
    own knowledge base.

    Args:
        session: The user's chat (from ``chat_session_get_for_user``).
        artifact_id: An artifact of that chat that the user attached (``run`` null).
        user: The session's user (the knowledge base's owner).

    Returns:
        :class:`KnowledgeUpload`; an ingestion is sent to Celery when the transaction commits.

    Raises:
        NotFound: no such artifact in this chat (another chat's, user's or tenant's alike).
        ApplicationError: 403 when the chat's agent does not allow user uploads; 400 for an
            artifact a tool made (not an attachment); 415 for a type the ingestion cannot
            parse (text, Markdown, HTML, PDF and DOCX are supported); 413 over 20 MB.
    """
    from knowledge.services import document_add, document_reingest

    artifact = _attachment(session=session, artifact_id=artifact_id)
    if not chat_knowledge_uploads_allowed(agent_id=session.agent_id):
        raise ApplicationError(NOT_ALLOWED_MESSAGE, status_code=403)
    kb = uploads_knowledge_base_ensure(tenant=session.tenant, user=user)
    KnowledgeBase.objects.select_for_update().filter(pk=kb.pk).first()  # one add at a time per knowledge base
    content = bytes(artifact.content)
    sha = hashlib.sha256(content).hexdigest()
    same = (Document.objects.filter(knowledge_base_id=kb.pk, content_sha256=sha).exclude(source_kind=SourceKind.URL)
            .defer("content").order_by("id").first())
    if same is not None and same.status in WORKING_STATUSES:
        if same.chat_session_id != session.pk:  # its events now go to this chat
            Document.objects.filter(pk=same.pk).update(chat_session_id=session.pk)
            same.chat_session_id = session.pk
        return KnowledgeUpload(same, queued=False)
    if same is not None:  # failed before: try again (e.g. the embedder was down)
        return KnowledgeUpload(document_reingest(document=same, chat_session_id=session.pk), queued=True)
    added = document_add(knowledge_base=kb, source_kind=SourceKind.FILE, source=artifact.name, content=content,
                         mime_type=artifact.mime_type, created_by=user, chat_session_id=session.pk)
    return KnowledgeUpload(Document.objects.defer("content").get(pk=added.document.pk), queued=added.queued)


@dataclass(frozen=True, slots=True)
class AttachmentKnowledge:
    """One attachment of a chat and its document in the user's own knowledge base."""

    artifact_id: int
    name: str
    supported: bool
    """The ingestion can parse its type (by its name and declared type)."""
    document: Document | None
    """The document with the attachment's content (SHA-256), or None if not added."""


@dataclass(frozen=True, slots=True)
class ChatKnowledge:
    """What the chat app's Files panel shows about adding a chat's attachments to knowledge."""

    user_uploads: bool
    """The chat's agent allows adding attachments (and searches them)."""
    knowledge_base: KnowledgeBase | None
    """The user's own uploads knowledge base, None before their first upload."""
    attachments: list[AttachmentKnowledge]


def _attachments_with_sha(session_id: int) -> QuerySet:
    """The chat's attachments with ``sha`` (hex SHA-256 of the content, computed by PostgreSQL:
    the bytes are not read into Python)."""
    sha = Func(Func(F("content"), function="sha256", output_field=BinaryField()), Value("hex"), function="encode",
               output_field=CharField())
    return (Artifact.objects.filter(session_id=session_id, run__isnull=True, tool_call__isnull=True)
            .annotate(sha=sha).values("pk", "name", "mime_type", "sha").order_by("id"))


def chat_knowledge_get(*, session: ChatSession, user_id: int) -> ChatKnowledge:
    """For the user's chat ``session``: whether its agent allows adding attachments to
    knowledge, the user's uploads knowledge base, and each attachment's document there (by
    content). A read; requires the tenant scope."""
    from knowledge.parsing import detect_mime_type

    kb = uploads_knowledge_base_get(user_id=user_id)
    rows = list(_attachments_with_sha(session.pk))
    documents: dict[str, Document] = {}
    if kb is not None and rows:
        for doc in (Document.objects.filter(knowledge_base_id=kb.pk, content_sha256__in={r["sha"] for r in rows})
                    .exclude(source_kind=SourceKind.URL).defer("content").order_by("-id")):
            documents[doc.content_sha256] = doc  # the oldest wins, as in artifact_add_to_knowledge
    return ChatKnowledge(
        user_uploads=chat_knowledge_uploads_allowed(agent_id=session.agent_id),
        knowledge_base=kb,
        attachments=[AttachmentKnowledge(
            artifact_id=r["pk"], name=r["name"],
            supported=bool(detect_mime_type(file_name=r["name"], declared=r["mime_type"])),
            document=documents.get(r["sha"])) for r in rows],
    )


def document_status_publish(change: DocumentStatusChange) -> None:
    """Publish a document's status change to the chat it was added from, as
    ``document_status_changed`` (:class:`sessions.event_types.DocumentStatusChanged`); nothing
    for a document not added from a chat. Called by :mod:`knowledge.document_status` after the change
    committed (the listener this app registers).

    Raises:
        redis.RedisError: the publish failed (the caller logs it; the chat app's fallback
            polling still shows the status).
    """
    if change.chat_session_id is None:
        return
    if change.status == DocumentStatus.READY:
        progress = 1.0
    else:
        progress = round(change.embedded_count / change.chunk_count, 3) if change.chunk_count else 0.0
    events.event_publish_sync(session_id=change.chat_session_id, run_id=None, type="document_status_changed", data={
        "document_id": change.document_id, "knowledge_base_id": change.knowledge_base_id, "title": change.title,
        "status": str(change.status), "status_reason": change.status_reason, "chunk_count": change.chunk_count,
        "embedded_count": change.embedded_count, "progress": float(progress),
    })
