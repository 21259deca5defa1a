"""End-user endpoints for documents: the caller's documents (of the caller's own sessions)."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.pagination import PageNumberPagination
from rest_framework.request import Request
from rest_framework.response import Response

from agent_platform.api_errors import NotFound
from agent_platform.api_schema import paginated
from documents.models import Document
from documents.selectors import document_get_for_user, document_list_for_user
from tenants.api.mixins import TenantScopedApiView


class DocumentListSerializer(serializers.ModelSerializer):
    lines = serializers.IntegerField(source="line_count", read_only=True)

    class Meta:
        model = Document
        fields = ["id", "session", "title", "version", "lines", "created_by_run", "updated_by_run",
                  "created_at", "updated_at"]


class DocumentDetailSerializer(DocumentListSerializer):
    class Meta(DocumentListSerializer.Meta):
        fields = DocumentListSerializer.Meta.fields + ["content"]


class DocumentListApi(TenantScopedApiView):
    """The caller's documents in the caller's tenant, most recently updated first (paginated);
    ``?session=<id>`` keeps one session's."""

    @extend_schema(
        operation_id="v1_documents_list",
        parameters=[OpenApiParameter("session", int, required=False, description="Only this session's documents.")],
        responses=paginated("PaginatedDocumentListList", DocumentListSerializer()),
    )
    def get(self, request: Request) -> Response:
        session = request.query_params.get("session")
        if session is not None and not session.isdigit():
            raise serializers.ValidationError({"session": ["A session id (an integer)."]})
        documents = document_list_for_user(user_id=request.user.pk,
                                           session_id=int(session) if session is not None else None)
        paginator = PageNumberPagination()
        page = paginator.paginate_queryset(documents, request, view=self)
        return paginator.get_paginated_response(DocumentListSerializer(page, many=True).data)


class DocumentDetailApi(TenantScopedApiView):
    """One of the caller's documents with its Markdown ``content``; 404 for other users' and
    tenants' documents as for missing ones."""

    @extend_schema(responses=DocumentDetailSerializer)
    def get(self, request: Request, document_id: int) -> Response:
        document = document_get_for_user(document_id=document_id, user_id=request.user.pk)
        if document is None:
            raise NotFound("Document not found.")
        return Response(DocumentDetailSerializer(document).data)
