"""Sessions, runs and their records: read-only in the console."""

from django.contrib import admin

from sessions.models import ChatSession, LLMCall, Message, Run, ToolCall
from tenants.admin_scoping import TenantScopedModelAdmin


class ReadOnlyAdmin(TenantScopedModelAdmin):
    read_only_model = True

    def get_readonly_fields(self, request, obj=None):
        return [f.name for f in self.model._meta.fields]


@admin.register(ChatSession)
class ChatSessionAdmin(ReadOnlyAdmin):
    list_display = ["id", "title", "agent", "user", "updated_at", "tenant"]


@admin.register(Run)
class RunAdmin(ReadOnlyAdmin):
    list_display = ["id", "session", "status", "reason", "loop_count", "created_at", "finished_at", "tenant"]
    list_filter = ["status"]


@admin.register(Message)
class MessageAdmin(ReadOnlyAdmin):
    list_display = ["id", "session", "run", "position", "role"]


@admin.register(ToolCall)
class ToolCallAdmin(ReadOnlyAdmin):
    list_display = ["id", "run", "name", "status", "duration_ms", "created_at"]
    list_filter = ["status"]


@admin.register(LLMCall)
class LLMCallAdmin(ReadOnlyAdmin):
    list_display = ["id", "run", "turn", "attempt", "provider_name", "model", "status", "error_class", "latency_ms",
                    "prompt_tokens", "completion_tokens"]
    list_filter = ["status", "error_class"]
