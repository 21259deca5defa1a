"""Sessions, runs and their records: read-only in the console."""

from django.contrib import admin, messages
from django.db.models import Count, Sum

from sessions.models import ChatSession, LLMCall, Message, Run, ToolCall
from tenants.admin_scoping import TenantScopedModelAdmin


class ReadOnlyAdmin(TenantScopedModelAdmin):
    read_only_model = True

    def get_readonly_fields(self, request, obj=None):
        return [f.name for f in self.model._meta.fields]


def _usd(micros) -> str:
    return f"${(micros or 0) / 1_000_000:.6f}"


@admin.register(ChatSession)
class ChatSessionAdmin(ReadOnlyAdmin):
    list_display = ["id", "title", "agent", "user", "updated_at", "cost", "tenant"]

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(cost_usd_micros=Sum("runs__cost_usd_micros"))

    @admin.display(description="cost (USD)", ordering="cost_usd_micros")
    def cost(self, obj):
        return _usd(obj.cost_usd_micros)


@admin.register(Run)
class RunAdmin(ReadOnlyAdmin):
    list_display = ["id", "session", "status", "reason", "loop_count", "prompt_tokens", "completion_tokens", "cost",
                    "created_at", "finished_at", "tenant"]
    list_filter = ["status", "reason"]

    @admin.display(description="cost (USD)", ordering="cost_usd_micros")
    def cost(self, obj):
        return _usd(obj.cost_usd_micros)


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
                    "prompt_tokens", "completion_tokens", "cost", "created_at"]
    list_filter = ["status", "error_class", "provider_name"]
    date_hierarchy = "created_at"

    def changelist_view(self, request, extra_context=None):
        """Shows the total of the calls listed (pick a month in the date bar for a month's cost)."""
        response = super().changelist_view(request, extra_context)
        changelist = getattr(response, "context_data", {}).get("cl")
        if changelist is not None:
            totals = changelist.queryset.aggregate(
                calls=Count("id"), prompt=Sum("prompt_tokens"), completion=Sum("completion_tokens"),
                cost=Sum("cost_usd_micros"),
            )
            messages.info(
                request,
                f"Total of the {totals['calls']} calls listed: {totals['prompt'] or 0} prompt + "
                f"{totals['completion'] or 0} completion tokens, cost {_usd(totals['cost'])}.",
            )
        return response

    @admin.display(description="cost (USD)", ordering="cost_usd_micros")
    def cost(self, obj):
        return _usd(obj.cost_usd_micros)
