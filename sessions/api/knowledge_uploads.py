"""The chat app's "Add to knowledge": a chat's attachments into the user's own knowledge base
(:mod:`sessions.knowledge_uploads`).

- ``GET /api/v1/sessions/<id>/knowledge-uploads/``: whether the chat's agent allows it
  (``user_uploads``), the user's uploads knowledge base, and each attachment's document there.
- ``POST /api/v1/sessions/<id>/artifacts/<artifact_id>/add-to-knowledge/``: add one; 202 with
  the document, queued (200 when the same content is there already).

The document's status afterwards: ``GET /api/v1/knowledge-bases/<kb>/documents/<id>/``; the
user's documents, and deleting them: the knowledge API. Another user's or tenant's chat or
artifact is a 404 with the message of a missing one.
"""

from __future__ import annotations

from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response

from knowledge.api.views import DocumentSerializer
from sessions.api.views import session_or_404
from sessions.knowledge_uploads import artifact_add_to_knowledge, chat_knowledge_get
from tenants.api.mixins import TenantScopedApiView

_ATTACHMENTS = inline_serializer("ChatAttachmentKnowledge", {
    "artifact_id": serializers.IntegerField(), "name": serializers.CharField(),
    "supported": serializers.BooleanField(help_text="The ingestion can parse its type (text, Markdown, HTML, PDF, DOCX)."),
    "document": DocumentSerializer(allow_null=True, help_text="The document with this content, null if not added."),
}, many=True)


class ChatKnowledgeUploadsApi(TenantScopedApiView):
    """What the chat app's Files panel shows about "Add to knowledge" for one of the caller's
    chats: ``{user_uploads, knowledge_base, attachments: [{artifact_id, name, supported,
    document}]}``. ``user_uploads``: the agent allows it (its knowledge binding has
    ``user_uploads: true``); ``knowledge_base``: the id of the caller's own uploads knowledge
    base (null before the first upload); ``document``: the attachment's document there, matched
    by content (null if not added)."""

    @extend_schema(responses=inline_serializer("ChatKnowledgeUploads", {
        "user_uploads": serializers.BooleanField(), "knowledge_base": serializers.IntegerField(allow_null=True),
        "attachments": _ATTACHMENTS,
    }))
    def get(self, request: Request, session_id: int) -> Response:
        session = session_or_404(request, session_id)
        info = chat_knowledge_get(session=session, user_id=request.user.pk)
        return Response({
            "user_uploads": info.user_uploads,
            "knowledge_base": info.knowledge_base.pk if info.knowledge_base else None,
            "attachments": [{
                "artifact_id": a.artifact_id, "name": a.name, "supported": a.supported,
                "document": DocumentSerializer(a.document).data if a.document else None,
            } for a in info.attachments],
        })


class ArtifactAddToKnowledgeApi(TenantScopedApiView):
    """Add a file the caller attached to their chat to their own knowledge base ("My
    knowledge", created on first use), if the chat's agent allows it. 202 with the document,
    queued for ingestion; 200 with it when the same content is there already (ready or being
    ingested). Follow its status at ``/api/v1/knowledge-bases/<knowledge_base>/documents/<id>/``.
    403 when the agent does not allow it; 400 for a file a tool made; 415 for a type that
    cannot be ingested; 404 for another user's or tenant's chat or artifact."""

    throttle_scopes = ("messages",)

    @extend_schema(request=None, responses={200: DocumentSerializer, 202: DocumentSerializer})
    def post(self, request: Request, session_id: int, artifact_id: int) -> Response:
        session = session_or_404(request, session_id)
        upload = artifact_add_to_knowledge(session=session, artifact_id=artifact_id, user=request.user)
        return Response(DocumentSerializer(upload.document).data,
                        status=status.HTTP_202_ACCEPTED if upload.queued else status.HTTP_200_OK)
