"""Documents in the console: read-only (agents write them through ``doc_write``)."""

from django.contrib import admin

from documents.models import Document
from tenants.admin_scoping import TenantScopedModelAdmin


@admin.register(Document)
class DocumentAdmin(TenantScopedModelAdmin):
    read_only_model = True
    list_display = ["id", "title", "session", "version", "updated_at", "tenant"]
    search_fields = ["title"]

    def get_readonly_fields(self, request, obj=None):
        return [f.name for f in self.model._meta.fields]
