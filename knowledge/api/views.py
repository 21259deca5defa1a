"""Knowledge bases over REST: knowledge bases, their documents, search, and chunks for citations.

Who may do what (see :mod:`knowledge.selectors`): every member reads the tenant's tenant-wide
knowledge bases and their own; tenant owners/admins create and change tenant-wide ones; any
member creates and changes their own. Another tenant's or another user's own knowledge base,
document or chunk is a 404 with the same message as a missing one; a member changing a
tenant-wide knowledge base (which they can see) is a 403.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_field, inline_serializer
from rest_framework import serializers, status
from rest_framework.exceptions import PermissionDenied
from rest_framework.pagination import PageNumberPagination
from rest_framework.parsers import MultiPartParser
from rest_framework.request import Request
from rest_framework.response import Response

from agent_platform.api_errors import ApplicationError, NotFound
from agent_platform.api_parsers import BoundedJSONParser
from agent_platform.api_schema import paginated
from knowledge.models import Chunk, Document, DocumentStatus, KnowledgeBase
from knowledge.parsing import MAX_DOCUMENT_BYTES
from knowledge.retrieval import MAX_QUERY_CHARS, MAX_TOP_K, SearchError, search
from knowledge.selectors import (
    chunk_get_for_user,
    document_get,
    document_list,
    knowledge_base_embedding_progress,
    knowledge_base_get_for_user,
    knowledge_base_list_for_user,
    knowledge_base_may_write,
    reembedding_notice,
)
from knowledge.services import (
    document_add,
    document_add_text,
    document_add_url,
    document_delete,
    document_reingest,
    knowledge_base_create,
    knowledge_base_delete,
    knowledge_base_reembed_request,
    knowledge_base_update,
)
from llm.models import ModelProvider, ModelRoute
from tenants.api.mixins import TenantPrimaryKeyRelatedField, TenantScopedApiView

KB_NOT_FOUND = "Knowledge base not found."
DOCUMENT_NOT_FOUND = "Document not found."
CHUNK_NOT_FOUND = "Chunk not found."


class KnowledgeBaseSerializer(serializers.ModelSerializer):
    tenant_wide = serializers.BooleanField(source="is_tenant_wide", read_only=True)
    document_count = serializers.IntegerField(read_only=True, required=False)
    embedding_progress = serializers.SerializerMethodField(
        help_text="While re-embedding (``reembedding``): {embedded, total} chunks of the current embedding model; "
                  "null otherwise.")

    class Meta:
        model = KnowledgeBase
        fields = ["id", "name", "description", "tenant_wide", "owner", "embedding_provider", "embedding_model",
                  "dimensions", "embedding_revision", "reembedding", "embedding_progress", "chunk_size",
                  "chunk_overlap", "document_count", "created_at", "updated_at"]
        read_only_fields = fields

    @extend_schema_field(inline_serializer("KnowledgeBaseEmbeddingProgress", {
        "embedded": serializers.IntegerField(), "total": serializers.IntegerField()}, allow_null=True))
    def get_embedding_progress(self, kb: KnowledgeBase) -> dict[str, int] | None:
        if not kb.reembedding:
            return None
        progress = knowledge_base_embedding_progress(knowledge_base=kb)
        return {"embedded": progress.embedded, "total": progress.total}


class KnowledgeBaseCreateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=200)
    description = serializers.CharField(required=False, allow_blank=True, default="")
    tenant_wide = serializers.BooleanField(
        default=False, help_text="True: the tenant's (owners/admins only). False: the caller's own.")
    embedding_provider = TenantPrimaryKeyRelatedField(
        ModelProvider, required=False, allow_null=True,
        help_text="Default: the tenant's embedded embedder (all-MiniLM-L6-v2, 384 dimensions).")
    embedding_model = serializers.CharField(max_length=200, required=False, default="")
    dimensions = serializers.IntegerField(min_value=1, max_value=16000, required=False, allow_null=True)
    chunk_size = serializers.IntegerField(required=False, default=500)
    chunk_overlap = serializers.IntegerField(required=False, default=50)


class KnowledgeBaseUpdateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=200, required=False)
    description = serializers.CharField(required=False, allow_blank=True)
    embedding_provider = TenantPrimaryKeyRelatedField(ModelProvider, required=False)
    embedding_model = serializers.CharField(max_length=200, required=False)
    dimensions = serializers.IntegerField(min_value=1, max_value=16000, required=False)
    chunk_size = serializers.IntegerField(required=False)
    chunk_overlap = serializers.IntegerField(required=False)


class DocumentSerializer(serializers.ModelSerializer):
    progress = serializers.SerializerMethodField(help_text="Chunks embedded / chunks, 0–1 (0 before parsing).")

    class Meta:
        model = Document
        fields = ["id", "knowledge_base", "title", "source_kind", "source", "mime_type", "size_bytes",
                  "content_sha256", "tags", "status", "status_reason", "char_count", "chunk_count", "embedded_count",
                  "progress", "chat_session_id", "created_at", "updated_at", "ingested_at"]
        read_only_fields = fields

    def get_progress(self, document: Document) -> float:
        if document.status == DocumentStatus.READY:
            return 1.0
        return round(document.embedded_count / document.chunk_count, 3) if document.chunk_count else 0.0


class DocumentAddSerializer(serializers.Serializer):
    """One of ``url`` or ``text`` (JSON), or ``file`` (multipart)."""

    url = serializers.CharField(required=False, max_length=2000)
    text = serializers.CharField(required=False, allow_blank=False, trim_whitespace=False)
    file = serializers.FileField(required=False)
    title = serializers.CharField(required=False, allow_blank=True, max_length=300, default="")
    tags = serializers.ListField(child=serializers.CharField(max_length=64), required=False, max_length=20)


class SearchSerializer(serializers.Serializer):
    query = serializers.CharField(max_length=MAX_QUERY_CHARS)
    top_k = serializers.IntegerField(min_value=1, max_value=MAX_TOP_K, default=5)
    document_ids = serializers.ListField(child=serializers.IntegerField(), required=False, allow_null=True,
                                         max_length=1000)
    tags = serializers.ListField(child=serializers.CharField(max_length=64), required=False, max_length=20)
    rerank_route = TenantPrimaryKeyRelatedField(
        ModelRoute, required=False, allow_null=True,
        help_text="A model route of the tenant to rerank the fused hits with (an LLM as reranker); default none.")
    rerank_provider = TenantPrimaryKeyRelatedField(
        ModelProvider, required=False, allow_null=True,
        help_text="An OpenAI-compatible model provider of the tenant whose /v1/rerank endpoint serves a rerank "
                  "model (a cross-encoder) to rerank the fused hits with; with rerank_model. Default none.")
    rerank_model = serializers.CharField(
        required=False, allow_blank=True, max_length=200, default="",
        help_text="The rerank model's name at rerank_provider, e.g. BAAI/bge-reranker-v2-m3.")

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        provider, model = attrs.get("rerank_provider"), attrs.get("rerank_model", "").strip()
        if provider is None and model:
            raise serializers.ValidationError({"rerank_provider": "Name the provider that serves rerank_model."})
        if provider is not None:
            if not model:
                raise serializers.ValidationError({"rerank_model": "Name the rerank model at rerank_provider."})
            if attrs.get("rerank_route") is not None:
                raise serializers.ValidationError({"rerank_route": "Rerank with a model route or a rerank model, "
                                                                   "not both."})
            if provider.api != "openai":
                raise serializers.ValidationError({"rerank_provider": f"This provider speaks the {provider.api} API, "
                                                                      "which has no rerank endpoint."})
        attrs["rerank_model"] = model
        return attrs


HIT_FIELDS = {
    "knowledge_base_id": serializers.IntegerField(), "document_id": serializers.IntegerField(),
    "document_title": serializers.CharField(), "chunk_id": serializers.IntegerField(),
    "position": serializers.IntegerField(), "heading": serializers.CharField(), "text": serializers.CharField(),
    "score": serializers.FloatField(), "rrf_score": serializers.FloatField(),
    "vector_rank": serializers.IntegerField(allow_null=True), "lexical_rank": serializers.IntegerField(allow_null=True),
    "rewrite_rank": serializers.IntegerField(allow_null=True), "rerank_score": serializers.FloatField(allow_null=True),
    "vector_distance": serializers.FloatField(allow_null=True),
}


class ChunkSerializer(serializers.ModelSerializer):
    document_title = serializers.CharField(source="document.title", read_only=True)
    document_source = serializers.CharField(source="document.source", read_only=True)

    class Meta:
        model = Chunk
        fields = ["id", "knowledge_base", "document", "document_title", "document_source", "position", "heading",
                  "text", "char_count", "token_count"]
        read_only_fields = fields


# ------------------------------------------------------------------------------------------ helpers

def _kb_or_404(request: Request, knowledge_base_id: int) -> KnowledgeBase:
    kb = knowledge_base_get_for_user(knowledge_base_id=knowledge_base_id, user_id=request.user.pk)
    if kb is None:
        raise NotFound(KB_NOT_FOUND)
    return kb


def _kb_writable(request: Request, knowledge_base_id: int) -> KnowledgeBase:
    kb = _kb_or_404(request, knowledge_base_id)
    if not knowledge_base_may_write(knowledge_base=kb, user_id=request.user.pk, is_admin=request.membership.is_admin):
        raise PermissionDenied("Only tenant owners and admins may change a tenant-wide knowledge base.")
    return kb


def _document_or_404(kb: KnowledgeBase, document_id: int) -> Document:
    document = document_get(knowledge_base_id=kb.pk, document_id=document_id)
    if document is None:
        raise NotFound(DOCUMENT_NOT_FOUND)
    return document


def _with_counts(kbs: Any) -> Any:
    from django.db.models import Count

    return kbs.annotate(document_count=Count("documents"))


# -------------------------------------------------------------------------------------------- views

class KnowledgeBaseListApi(TenantScopedApiView):
    """``GET``: the knowledge bases the caller may search (the tenant's and their own),
    paginated. ``POST``: create one: the caller's own, or with ``tenant_wide`` the tenant's
    (owners/admins). 201 with the knowledge base."""

    @extend_schema(operation_id="v1_knowledge_bases_list",
                   responses=paginated("PaginatedKnowledgeBaseList", KnowledgeBaseSerializer()))
    def get(self, request: Request) -> Response:
        paginator = PageNumberPagination()
        page = paginator.paginate_queryset(_with_counts(knowledge_base_list_for_user(user_id=request.user.pk)),
                                           request, view=self)
        return paginator.get_paginated_response(KnowledgeBaseSerializer(page, many=True).data)

    @extend_schema(request=KnowledgeBaseCreateSerializer, responses={201: KnowledgeBaseSerializer})
    def post(self, request: Request) -> Response:
        data = KnowledgeBaseCreateSerializer(data=request.data, context={"request": request})
        data.is_valid(raise_exception=True)
        fields = dict(data.validated_data)
        tenant_wide = fields.pop("tenant_wide")
        if tenant_wide and not request.membership.is_admin:
            raise PermissionDenied("Only tenant owners and admins may create a tenant-wide knowledge base.")
        kb = knowledge_base_create(tenant=request.tenant, owner=None if tenant_wide else request.user, **fields)
        return Response(KnowledgeBaseSerializer(_with_counts(KnowledgeBase.objects.filter(pk=kb.pk)).get()).data,
                        status=status.HTTP_201_CREATED)


class KnowledgeBaseDetailApi(TenantScopedApiView):
    """One knowledge base: ``GET`` (any member who may search it), ``PATCH`` (name,
    description, chunking — which re-ingests every document — or the embedding model, which
    re-embeds every chunk in a background job: ``reembedding`` and ``embedding_progress`` show
    it), ``DELETE`` (with its documents and chunks). Changes: its owner, or for a tenant-wide
    one the tenant's owners/admins."""

    @extend_schema(responses=KnowledgeBaseSerializer)
    def get(self, request: Request, knowledge_base_id: int) -> Response:
        kb = _kb_or_404(request, knowledge_base_id)
        return Response(KnowledgeBaseSerializer(_with_counts(KnowledgeBase.objects.filter(pk=kb.pk)).get()).data)

    @extend_schema(request=KnowledgeBaseUpdateSerializer, responses=KnowledgeBaseSerializer)
    def patch(self, request: Request, knowledge_base_id: int) -> Response:
        kb = _kb_writable(request, knowledge_base_id)
        data = KnowledgeBaseUpdateSerializer(data=request.data, partial=True, context={"request": request})
        data.is_valid(raise_exception=True)
        knowledge_base_update(knowledge_base=kb, **data.validated_data)
        return Response(KnowledgeBaseSerializer(_with_counts(KnowledgeBase.objects.filter(pk=kb.pk)).get()).data)

    @extend_schema(responses={204: None})
    def delete(self, request: Request, knowledge_base_id: int) -> Response:
        knowledge_base_delete(knowledge_base=_kb_writable(request, knowledge_base_id))
        return Response(status=status.HTTP_204_NO_CONTENT)


class KnowledgeBaseReembedApi(TenantScopedApiView):
    """Re-embed every chunk with the knowledge base's embedding model: for when the model behind
    its provider entry changed (another server or model file under the same name). The chunks
    are not vector-searched until each is re-embedded. 202 with the knowledge base
    (``reembedding`` true, ``embedding_revision`` + 1)."""

    @extend_schema(request=None, responses={202: KnowledgeBaseSerializer})
    def post(self, request: Request, knowledge_base_id: int) -> Response:
        kb = knowledge_base_reembed_request(knowledge_base=_kb_writable(request, knowledge_base_id))
        return Response(KnowledgeBaseSerializer(_with_counts(KnowledgeBase.objects.filter(pk=kb.pk)).get()).data,
                        status=status.HTTP_202_ACCEPTED)


class DocumentListApi(TenantScopedApiView):
    """``GET``: the knowledge base's documents with their status and progress (``?status=``
    filters), paginated. ``POST``: add a document: multipart ``file`` (text, Markdown, HTML,
    PDF, DOCX; at most 20 MB), or JSON ``{"url": …}`` (fetched by the ingestion through the
    SSRF-safe fetch) or ``{"text": …, "title": …}``; ``title`` and ``tags`` optional. The same
    file name / URL / text title again replaces that document (same content: no work, 200);
    else 202 with the document, queued."""

    parser_classes = [BoundedJSONParser, MultiPartParser]

    @extend_schema(
        operation_id="v1_knowledge_bases_documents_list",
        parameters=[OpenApiParameter("status", str, required=False, enum=DocumentStatus.values)],
        responses=paginated("PaginatedKnowledgeDocumentList", DocumentSerializer()),
    )
    def get(self, request: Request, knowledge_base_id: int) -> Response:
        kb = _kb_or_404(request, knowledge_base_id)
        wanted = request.query_params.get("status")
        if wanted is not None and wanted not in DocumentStatus.values:
            raise serializers.ValidationError({"status": [f"One of {', '.join(DocumentStatus.values)}."]})
        paginator = PageNumberPagination()
        page = paginator.paginate_queryset(document_list(knowledge_base_id=kb.pk, status=wanted), request, view=self)
        return paginator.get_paginated_response(DocumentSerializer(page, many=True).data)

    @extend_schema(
        request={"application/json": DocumentAddSerializer, "multipart/form-data": DocumentAddSerializer},
        responses={200: DocumentSerializer, 202: DocumentSerializer},
    )
    def post(self, request: Request, knowledge_base_id: int) -> Response:
        kb = _kb_writable(request, knowledge_base_id)
        length = request.META.get("CONTENT_LENGTH") or "0"
        if length.isdigit() and int(length) > MAX_DOCUMENT_BYTES + 1_000_000:
            raise ApplicationError("The upload is too large.", status_code=413, extra={"max_bytes": MAX_DOCUMENT_BYTES})
        raw = request.data
        if hasattr(raw, "getlist"):  # multipart: tags may be repeated or comma-separated
            tags = [t.strip() for value in raw.getlist("tags") for t in value.split(",") if t.strip()]
            raw = {key: raw.get(key) for key in raw if key != "tags"} | ({"tags": tags} if tags else {})
        data = DocumentAddSerializer(data=raw)
        data.is_valid(raise_exception=True)
        fields = data.validated_data
        given = [key for key in ("url", "text", "file") if fields.get(key) is not None]
        if len(given) != 1:
            raise ApplicationError("Send exactly one of `file` (multipart), `url` or `text`.",
                                   extra={"fields": {"file": ["Exactly one of file, url, text."]}})
        common = {"knowledge_base": kb, "tags": fields.get("tags"), "created_by": request.user}
        if given[0] == "url":
            added = document_add_url(url=fields["url"], title=fields["title"], **common)
        elif given[0] == "text":
            if not fields["title"]:
                raise ApplicationError("A text document needs a `title` (it identifies the document).",
                                       extra={"fields": {"title": ["Required with text."]}})
            added = document_add_text(title=fields["title"], text=fields["text"], **common)
        else:
            upload = fields["file"]
            if upload.size > MAX_DOCUMENT_BYTES:
                raise ApplicationError(f"“{upload.name}” is larger than {MAX_DOCUMENT_BYTES // 1_000_000} MB.",
                                       status_code=413, extra={"max_bytes": MAX_DOCUMENT_BYTES})
            added = document_add(source_kind="file", source=upload.name, content=upload.read(MAX_DOCUMENT_BYTES + 1),
                                 mime_type=upload.content_type or "", title=fields["title"], **common)
        document = Document.objects.defer("content").get(pk=added.document.pk)
        return Response(DocumentSerializer(document).data,
                        status=status.HTTP_202_ACCEPTED if added.queued else status.HTTP_200_OK)


class DocumentDetailApi(TenantScopedApiView):
    """One document: ``GET`` its status (``status_reason`` says why it failed; ``progress``
    while embedding), ``DELETE`` it with its chunks."""

    @extend_schema(responses=DocumentSerializer)
    def get(self, request: Request, knowledge_base_id: int, document_id: int) -> Response:
        return Response(DocumentSerializer(_document_or_404(_kb_or_404(request, knowledge_base_id), document_id)).data)

    @extend_schema(responses={204: None})
    def delete(self, request: Request, knowledge_base_id: int, document_id: int) -> Response:
        document_delete(document=_document_or_404(_kb_writable(request, knowledge_base_id), document_id))
        return Response(status=status.HTTP_204_NO_CONTENT)


class DocumentReingestApi(TenantScopedApiView):
    """Ingest the document again (a URL is fetched again; a file is parsed again with the
    knowledge base's current chunking). 202 with the document, queued."""

    @extend_schema(request=None, responses={202: DocumentSerializer})
    def post(self, request: Request, knowledge_base_id: int, document_id: int) -> Response:
        document = _document_or_404(_kb_writable(request, knowledge_base_id), document_id)
        return Response(DocumentSerializer(document_reingest(document=document)).data, status=status.HTTP_202_ACCEPTED)


class KnowledgeBaseSearchApi(TenantScopedApiView):
    """Hybrid search of one knowledge base (:func:`knowledge.retrieval.search`): ``{query,
    top_k?, document_ids?, tags?, rerank_route? | rerank_provider? + rerank_model?}`` →
    ``{hits: [...], notice}``, best first, each
    with its document, chunk, position, heading, text, score and per-list ranks; ``notice`` says
    when the knowledge base is being re-embedded (its chunks not yet re-embedded are found by
    the lexical list only), else ''. For trying a knowledge base in the console and for other
    systems. A failed embedding or rerank request is a 502 with the provider's reason
    (``extra.code`` ``embedding_failed`` / ``rerank_failed``). Throttled per user and per tenant
    (``API_THROTTLE_RATES`` ``search.*``: each search embeds its query)."""

    throttle_scopes = ("search",)

    @extend_schema(request=SearchSerializer, responses=inline_serializer(
        "KnowledgeSearchResult", {"hits": inline_serializer("KnowledgeHit", HIT_FIELDS, many=True),
                                  "notice": serializers.CharField()}))
    def post(self, request: Request, knowledge_base_id: int) -> Response:
        kb = _kb_or_404(request, knowledge_base_id)
        data = SearchSerializer(data=request.data, context={"request": request})
        data.is_valid(raise_exception=True)
        fields = data.validated_data
        rerank = None
        if fields.get("rerank_route") is not None:
            from knowledge.rerank import route_reranker

            rerank = route_reranker(route=fields["rerank_route"], tenant=request.tenant, user_id=request.user.pk)
        elif fields.get("rerank_provider") is not None:
            from knowledge.rerank import model_reranker

            rerank = model_reranker(provider=fields["rerank_provider"], model=fields["rerank_model"])
        try:
            hits = search(tenant_id=request.tenant.pk, knowledge_base_ids=[kb.pk], query=fields["query"],
                          user_id=request.user.pk, top_k=fields["top_k"], document_ids=fields.get("document_ids"),
                          tags=fields.get("tags"), rerank=rerank)
        except SearchError as exc:
            raise ApplicationError(exc.message, extra={"code": exc.code},
                                   status_code=502 if exc.code in {"embedding_failed", "rerank_failed"} else 400
                                   ) from exc
        return Response({"hits": [_hit_json(h) for h in hits], "notice": reembedding_notice([kb])})


def _hit_json(hit: Any) -> dict[str, Any]:
    from dataclasses import asdict

    return asdict(hit)


class ChunkDetailApi(TenantScopedApiView):
    """One chunk with its document's title and source, for a citation: readable by a member
    for the tenant's tenant-wide knowledge bases and their own."""

    @extend_schema(responses=ChunkSerializer)
    def get(self, request: Request, chunk_id: int) -> Response:
        chunk = chunk_get_for_user(chunk_id=chunk_id, user_id=request.user.pk)
        if chunk is None:
            raise NotFound(CHUNK_NOT_FOUND)
        return Response(ChunkSerializer(chunk).data)
