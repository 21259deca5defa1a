"""Knowledge bases in the console: their documents with status, reason and progress; adding
documents (upload, URL, text); "Test search" with the hits' scores and ranks; the embedding
model's state ("re-embedding n/m" while a model change is being applied) and "Re-embed" (for
when the model behind the provider entry changed).

Who sees what is the API's rule (:func:`knowledge.selectors.knowledge_base_visible`): the
tenant-wide knowledge bases of the tenants one administers and one's own, never another
user's own (a member's uploads), whatever the role; such a knowledge base, its documents and
every page over them (change, Test search, Add documents, Re-embed, the document pages) are
what a missing one is (Django's "does not exist" redirect, or a 404 for the extra pages). A
new knowledge base is tenant-wide or the signed-in user's own. Writes go through
:mod:`knowledge.services`, so a new chunking re-ingests, and re-adding the same content does
nothing.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html

from agent_platform.api_errors import ApplicationError
from knowledge.models import Document, DocumentStatus, KnowledgeBase
from knowledge.parsing import MAX_DOCUMENT_BYTES
from knowledge.selectors import document_visible, knowledge_base_visible
from tenants.admin_scoping import TenantScopedInline, TenantScopedModelAdmin


def _progress(document: Document) -> str:
    if document.status == DocumentStatus.READY:
        return f"{document.chunk_count} chunks"
    if document.status == DocumentStatus.EMBEDDING and document.chunk_count:
        return f"{document.embedded_count}/{document.chunk_count} embedded"
    return "—"


class DocumentInline(TenantScopedInline):
    model = Document
    extra = 0
    can_delete = True
    show_change_link = True
    fields = ["title", "source_kind", "source", "status", "status_reason", "progress", "tags", "updated_at"]
    readonly_fields = fields
    ordering = ["-updated_at", "-id"]

    def get_queryset(self, request: HttpRequest):
        return super().get_queryset(request).filter(document_visible(user_id=request.user.pk))

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # documents are added with "Add documents" (they need ingesting)

    @admin.display(description="Progress")
    def progress(self, obj: Document) -> str:
        return _progress(obj)


class KnowledgeBaseForm(forms.ModelForm):
    class Meta:
        model = KnowledgeBase
        fields = ["tenant", "name", "description", "owner", "embedding_provider", "embedding_model", "dimensions",
                  "chunk_size", "chunk_overlap"]


@admin.register(KnowledgeBase)
class KnowledgeBaseAdmin(TenantScopedModelAdmin):
    form = KnowledgeBaseForm
    list_display = ["name", "scope", "embedding_model", "dimensions", "embedding_status", "chunk_size",
                    "document_count", "updated_at", "tenant"]
    readonly_fields = ["embedding_status"]
    search_fields = ["name", "description"]
    ordering = ["name", "id"]
    inlines = [DocumentInline]
    change_form_template = "admin/knowledge/knowledgebase/change_form.html"

    def get_queryset(self, request: HttpRequest):
        """The admin's tenants' knowledge bases that the API would show them: tenant-wide ones
        and their own (another user's own is not there: every page over it is "missing")."""
        return super().get_queryset(request).filter(knowledge_base_visible(user_id=request.user.pk))

    def formfield_for_foreignkey(self, db_field: Any, request: HttpRequest, **kwargs: Any) -> Any:
        """``owner``: blank (tenant-wide) or the signed-in user, never someone else (an
        admin does not make or fill a member's own knowledge base)."""
        field = super().formfield_for_foreignkey(db_field, request, **kwargs)
        if db_field.name == "owner" and field is not None:
            field.queryset = field.queryset.filter(pk=request.user.pk)
        return field

    @admin.display(description="Scope")
    def scope(self, obj: KnowledgeBase) -> str:
        return "tenant-wide" if obj.owner_id is None else f"{obj.owner}'s own"

    @admin.display(description="Embeddings")
    def embedding_status(self, obj: KnowledgeBase | None) -> str:
        """"current", or "re-embedding n/m" (chunks of the current model / all) while a job runs."""
        if obj is None or obj.pk is None:
            return "—"
        if not obj.reembedding:
            return "current"
        from knowledge.selectors import knowledge_base_embedding_progress
        from tenants.scoping import tenant_scope

        with tenant_scope(obj.tenant_id):
            progress = knowledge_base_embedding_progress(knowledge_base=obj)
        return f"re-embedding {progress.embedded}/{progress.total}"

    @admin.display(description="Documents")
    def document_count(self, obj: KnowledgeBase) -> int:
        return Document.all_tenants.filter(knowledge_base_id=obj.pk).count()  # tenant-bypass: the admin's row's

    def get_changeform_initial_data(self, request: HttpRequest) -> dict[str, Any]:
        from llm import embeddings

        return {"embedding_model": embeddings.DEFAULT_EMBEDDING_MODEL,
                "dimensions": embeddings.DEFAULT_EMBEDDING_DIMENSIONS, **super().get_changeform_initial_data(request)}

    def save_model(self, request: HttpRequest, obj: KnowledgeBase, form: Any, change: bool) -> None:
        """New: saved as the form has it. Changed: through ``knowledge_base_update`` (a new
        chunking re-ingests the documents; a new embedding model re-embeds every chunk)."""
        if not change:
            super().save_model(request, obj, form, change)
            return
        from knowledge.services import knowledge_base_update

        allowed = {"name", "description", "chunk_size", "chunk_overlap", "embedding_provider", "embedding_model",
                   "dimensions"}
        stored = KnowledgeBase.all_tenants.get(pk=obj.pk)  # tenant-bypass: the admin's own row (checked by the page)
        fingerprint = stored.embedding_fingerprint
        try:
            updated = knowledge_base_update(knowledge_base=stored, **{f: form.cleaned_data[f] for f in form.changed_data
                                                                      if f in allowed})
        except ApplicationError as exc:
            messages.error(request, exc.message)
            return
        if updated.embedding_fingerprint != fingerprint:
            messages.info(request, "The embedding model changed: every chunk is being re-embedded. Until a chunk is "
                                   "done, searches find it by its words only.")

    def get_urls(self):
        urls = [
            path("<path:object_id>/add-documents/", self.admin_site.admin_view(self.add_documents_view),
                 name="knowledge_knowledgebase_add_documents"),
            path("<path:object_id>/test-search/", self.admin_site.admin_view(self.test_search_view),
                 name="knowledge_knowledgebase_test_search"),
            path("<path:object_id>/reembed/", self.admin_site.admin_view(self.reembed_view),
                 name="knowledge_knowledgebase_reembed"),
        ]
        return urls + super().get_urls()

    def _kb_or_404(self, request: HttpRequest, object_id: str, *, write: bool) -> KnowledgeBase:
        kb = self.get_object(request, object_id)
        if kb is None:
            raise Http404("Knowledge base not found.")
        allowed = self.has_change_permission(request, kb) if write else self.has_view_permission(request, kb)
        if not allowed:
            raise PermissionDenied
        return kb

    def _context(self, request: HttpRequest, kb: KnowledgeBase, title: str) -> dict[str, Any]:
        return {**self.admin_site.each_context(request), "opts": self.model._meta, "original": kb, "title": title,
                "has_view_permission": True}

    def add_documents_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """Upload files, add a URL or a text; each becomes a queued document."""
        kb = self._kb_or_404(request, object_id, write=True)
        form = AddDocumentsForm(request.POST or None, request.FILES or None)
        if request.method == "POST" and form.is_valid():
            added = _add_documents(kb, form, request)
            if added is not None:
                messages.success(request, added)
                return HttpResponseRedirect(reverse("admin:knowledge_knowledgebase_change", args=[kb.pk]))
        return TemplateResponse(request, "admin/knowledge/knowledgebase/add_documents.html", {
            **self._context(request, kb, f"Add documents to {kb.name}"), "form": form,
            "max_mb": MAX_DOCUMENT_BYTES // 1_000_000})

    def reembed_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """GET: what re-embedding does, and a button; POST: queue it
        (:func:`knowledge.services.knowledge_base_reembed_request`)."""
        from knowledge.services import knowledge_base_reembed_request
        from tenants.scoping import tenant_scope

        kb = self._kb_or_404(request, object_id, write=True)
        if request.method == "POST":
            with tenant_scope(kb.tenant_id):
                knowledge_base_reembed_request(knowledge_base=kb)
            messages.success(request, f"Re-embedding {kb.name}: every chunk is embedded again with "
                                      f"{kb.embedding_model}.")
            return HttpResponseRedirect(reverse("admin:knowledge_knowledgebase_change", args=[kb.pk]))
        return TemplateResponse(request, "admin/knowledge/knowledgebase/reembed.html",
                                self._context(request, kb, f"Re-embed {kb.name}"))

    def test_search_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """Search the knowledge base as the agents would, and show each hit's scores and ranks."""
        from knowledge.retrieval import SearchError, search
        from knowledge.selectors import reembedding_notice

        kb = self._kb_or_404(request, object_id, write=False)
        form = SearchForm(request.GET or None)
        hits, error = [], ""
        if request.GET and form.is_valid():
            try:
                hits = search(tenant_id=kb.tenant_id, knowledge_base_ids=[kb.pk], query=form.cleaned_data["query"],
                              user_id=kb.owner_id, top_k=form.cleaned_data["top_k"])
            except SearchError as exc:
                error = exc.message
        return TemplateResponse(request, "admin/knowledge/knowledgebase/test_search.html", {
            **self._context(request, kb, f"Test search: {kb.name}"), "form": form, "hits": hits, "error": error,
            "notice": reembedding_notice([kb])})


class AddDocumentsForm(forms.Form):
    files = forms.FileField(required=False, widget=forms.ClearableFileInput(attrs={"allow_multiple_selected": True}),
                            help_text="Text, Markdown, HTML, PDF or DOCX.")
    url = forms.URLField(required=False, max_length=2000, assume_scheme="https", help_text="A web page or file.")
    text_title = forms.CharField(required=False, max_length=300, label="Text title")
    text = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 6}), help_text="Read as Markdown.")
    tags = forms.CharField(required=False, help_text="Comma-separated.")

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        if data.get("text") and not data.get("text_title"):
            self.add_error("text_title", "A text needs a title (it identifies the document).")
        return data


def _add_documents(kb: KnowledgeBase, form: AddDocumentsForm, request: HttpRequest) -> str | None:
    from knowledge.services import document_add, document_add_text, document_add_url
    from tenants.scoping import tenant_scope

    tags = [t.strip() for t in (form.cleaned_data.get("tags") or "").split(",") if t.strip()]
    common = {"knowledge_base": kb, "tags": tags, "created_by": request.user}
    names = []
    try:
        with tenant_scope(kb.tenant_id):
            for upload in request.FILES.getlist("files"):
                if upload.size > MAX_DOCUMENT_BYTES:
                    raise ApplicationError(f"“{upload.name}” is larger than {MAX_DOCUMENT_BYTES // 1_000_000} MB.")
                document_add(source_kind="file", source=upload.name, content=upload.read(),
                             mime_type=upload.content_type or "", **common)
                names.append(upload.name)
            if form.cleaned_data.get("url"):
                document_add_url(url=form.cleaned_data["url"], **common)
                names.append(form.cleaned_data["url"])
            if form.cleaned_data.get("text"):
                document_add_text(title=form.cleaned_data["text_title"], text=form.cleaned_data["text"], **common)
                names.append(form.cleaned_data["text_title"])
    except ApplicationError as exc:
        form.add_error(None, exc.message)
        return None
    if not names:
        form.add_error(None, "Choose files, a URL or a text.")
        return None
    return f"Queued for ingestion: {', '.join(names)}."


class SearchForm(forms.Form):
    query = forms.CharField(max_length=2000)
    top_k = forms.IntegerField(min_value=1, max_value=50, initial=5, required=False)

    def clean_top_k(self) -> int:
        return self.cleaned_data.get("top_k") or 5


@admin.register(Document)
class DocumentAdmin(TenantScopedModelAdmin):
    list_display = ["title", "knowledge_base", "status", "reason", "progress", "source_kind", "updated_at", "tenant"]
    list_filter = ["status", "source_kind"]
    search_fields = ["title", "source"]
    ordering = ["-updated_at", "-id"]
    readonly_fields = ["knowledge_base", "title", "source_kind", "source", "mime_type", "size_bytes", "content_sha256",
                       "tags", "status", "status_reason", "char_count", "chunk_count", "embedded_count", "created_by",
                       "created_at", "updated_at", "ingested_at"]
    exclude = ["content"]
    actions = ["reingest"]

    def has_add_permission(self, request: HttpRequest, *args: Any) -> bool:
        return False

    def get_queryset(self, request: HttpRequest):
        """As :meth:`KnowledgeBaseAdmin.get_queryset`: documents of knowledge bases the signed-in
        user may read (not of another user's own)."""
        return (super().get_queryset(request).filter(document_visible(user_id=request.user.pk))
                .defer("content").select_related("knowledge_base"))

    @admin.display(description="Reason")
    def reason(self, obj: Document) -> str:
        return obj.status_reason[:120]

    @admin.display(description="Progress")
    def progress(self, obj: Document) -> str:
        return _progress(obj)

    @admin.action(description="Ingest again")
    def reingest(self, request: HttpRequest, queryset) -> None:
        from knowledge.services import document_reingest
        from tenants.scoping import tenant_scope

        for document in queryset:
            with tenant_scope(document.tenant_id):
                document_reingest(document=document)
        self.message_user(request, format_html("{} document(s) queued.", queryset.count()))
