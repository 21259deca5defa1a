"""Sessions, runs and their records: read-only in the console.

A run opens as its trace (``sessions/trace_selectors.py``: turns, model attempts, tool calls, approvals,
compactions, reply); a session links to its transcript, and each run of the transcript to
its trace. Lists are searchable and newest first.
"""

from django.contrib import admin, messages
from django.db.models import Count, Sum
from django.shortcuts import redirect
from django.urls import path, reverse
from django.utils.html import format_html

from sessions.models import (
    Approval,
    ApprovalKind,
    ApprovalStatus,
    ChatSession,
    LLMCall,
    LLMCallBody,
    Message,
    Run,
    ToolCall,
)
from tenants.admin_scoping import TenantScopedModelAdmin


class ReadOnlyAdmin(TenantScopedModelAdmin):
    read_only_model = True

    def get_readonly_fields(self, request, obj=None):
        return [f.name for f in self.model._meta.fields]


def _usd(micros) -> str:
    return f"${(micros or 0) / 1_000_000:.6f}"


class AgentFilter(admin.RelatedFieldListFilter):
    """The agent filter lists only the agents the admin's tenants own."""

    def field_choices(self, field, request, model_admin):
        from agents.models import AgentInstance

        qs = AgentInstance.all_tenants.all()  # tenant-bypass: narrowed to the admin's tenants below
        if not request.user.is_superuser:
            from tenants.admin_scoping import admin_tenants

            qs = qs.filter(tenant_id__in=admin_tenants(request))
        return [(a.pk, a.name) for a in qs.order_by("name")]


@admin.register(ChatSession)
class ChatSessionAdmin(ReadOnlyAdmin):
    list_display = ["id", "title", "agent", "user", "updated_at", "cost", "transcript", "tenant"]
    list_filter = [("agent", AgentFilter)]
    search_fields = ["title", "user__username", "agent__name", "messages__content"]
    ordering = ["-updated_at", "-id"]
    date_hierarchy = "updated_at"

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(cost_usd_micros=Sum("runs__cost_usd_micros"))

    def get_urls(self):
        from console.views import session_transcript_view

        urls = [path("<path:object_id>/transcript/",
                     self.admin_site.admin_view(lambda request, object_id: session_transcript_view(self, request, object_id)),
                     name="agent_sessions_chatsession_transcript")]
        return urls + super().get_urls()

    def change_view(self, request, object_id, form_url="", extra_context=None):
        """A session opens as its transcript (each run linked to its trace)."""
        return redirect("admin:agent_sessions_chatsession_transcript", object_id)

    @admin.display(description="cost (USD)", ordering="cost_usd_micros")
    def cost(self, obj):
        return _usd(obj.cost_usd_micros)

    @admin.display(description="transcript")
    def transcript(self, obj):
        return format_html('<a href="{}">Transcript</a>', reverse("admin:agent_sessions_chatsession_transcript", args=[obj.pk]))


@admin.register(Run)
class RunAdmin(ReadOnlyAdmin):
    list_display = ["id", "trace", "agent", "user", "status", "reason", "purpose", "loop_count", "tokens", "cost",
                    "created_at", "finished_at", "tenant"]
    list_display_links = None
    list_filter = ["status", "reason", "purpose", ("session__agent", AgentFilter)]
    search_fields = ["input", "reply", "error", "user__username", "session__title", "=id"]
    ordering = ["-created_at", "-id"]
    date_hierarchy = "created_at"
    list_select_related = ["session__agent", "user", "tenant"]

    def get_urls(self):
        from console.views import run_trace_view

        urls = [path("<path:object_id>/trace/",
                     self.admin_site.admin_view(lambda request, object_id: run_trace_view(self, request, object_id)),
                     name="agent_sessions_run_trace")]
        return urls + super().get_urls()

    def change_view(self, request, object_id, form_url="", extra_context=None):
        """A run opens as its trace (the field dump is gone: everything is on the trace)."""
        return redirect("admin:agent_sessions_run_trace", object_id)

    @admin.display(description="run")
    def trace(self, obj):
        return format_html('<a href="{}">Run {} — trace</a>', reverse("admin:agent_sessions_run_trace", args=[obj.pk]),
                           obj.pk)

    @admin.display(description="agent", ordering="session__agent__name")
    def agent(self, obj):
        return obj.session.agent.name

    @admin.display(description="tokens in / out")
    def tokens(self, obj):
        return f"{obj.prompt_tokens} / {obj.completion_tokens}"

    @admin.display(description="cost (USD)", ordering="cost_usd_micros")
    def cost(self, obj):
        return _usd(obj.cost_usd_micros)


@admin.register(Message)
class MessageAdmin(ReadOnlyAdmin):
    list_display = ["id", "session", "run_link", "position", "role", "created_at"]
    list_filter = ["role"]
    search_fields = ["content", "name", "session__title"]
    ordering = ["-created_at", "-id"]

    @admin.display(description="run")
    def run_link(self, obj):
        return format_html('<a href="{}">Run {}</a>', reverse("admin:agent_sessions_run_trace", args=[obj.run_id]),
                           obj.run_id)


@admin.register(ToolCall)
class ToolCallAdmin(ReadOnlyAdmin):
    list_display = ["id", "run_link", "name", "status", "duration_ms", "created_at"]
    list_filter = ["status"]
    search_fields = ["name", "result", "error"]
    ordering = ["-created_at", "-id"]

    @admin.display(description="run")
    def run_link(self, obj):
        return format_html('<a href="{}">Run {}</a>', reverse("admin:agent_sessions_run_trace", args=[obj.run_id]),
                           obj.run_id)


@admin.register(LLMCall)
class LLMCallAdmin(ReadOnlyAdmin):
    list_display = ["id", "purpose", "run_link", "turn", "agent", "user", "attempt", "provider_name", "model", "status",
                    "error_class", "latency_ms", "prompt_tokens", "completion_tokens", "cost", "created_at"]
    list_select_related = ["agent", "user"]
    list_filter = ["purpose", "status", "error_class", "provider_name"]
    search_fields = ["model", "provider_name", "error_class", "error"]
    ordering = ["-created_at", "-id"]
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

    @admin.display(description="run")
    def run_link(self, obj):
        """The run's trace; "-" for a call outside a run (a title, memory, rewrite, rerank) or a purged run's."""
        if obj.run_id is None:
            return "-"
        return format_html('<a href="{}">Run {}</a>', reverse("admin:agent_sessions_run_trace", args=[obj.run_id]),
                           obj.run_id)

    @admin.display(description="cost (USD)", ordering="cost_usd_micros")
    def cost(self, obj):
        return _usd(obj.cost_usd_micros)


@admin.register(LLMCallBody)
class LLMCallBodyAdmin(ReadOnlyAdmin):
    """Model call records (the exact request and response bodies of a tenant's model calls,
    kept while it records them): its admins read them here and in the run trace."""

    list_display = ["id", "llm_call_link", "request_bytes", "response_bytes", "request_truncated", "created_at"]
    list_select_related = ["llm_call"]
    search_fields = ["request", "response"]
    ordering = ["-created_at", "-id"]
    date_hierarchy = "created_at"

    @admin.display(description="LLM call")
    def llm_call_link(self, obj):
        """The call's run trace when it was a run's, else the call's own page."""
        run_id = obj.llm_call.run_id
        if run_id is not None:
            return format_html('<a href="{}">Run {} (call {})</a>', reverse("admin:agent_sessions_run_trace", args=[run_id]),
                               run_id, obj.llm_call_id)
        return format_html('<a href="{}">Call {}</a>', reverse("admin:agent_sessions_llmcall_change", args=[obj.llm_call_id]),
                           obj.llm_call_id)


class ApprovalStateFilter(admin.SimpleListFilter):
    """Waiting (the default: tool calls waiting for a decision), decided, or all."""

    title = "state"
    parameter_name = "state"

    def lookups(self, request, model_admin):
        return [("decided", "Decided or expired"), ("all", "All")]

    def choices(self, changelist):
        yield {"selected": self.value() is None, "display": "Waiting for a decision",
               "query_string": changelist.get_query_string(remove=[self.parameter_name])}
        for lookup, title in self.lookup_choices:
            yield {"selected": self.value() == lookup, "display": title,
                   "query_string": changelist.get_query_string({self.parameter_name: lookup})}

    def queryset(self, request, queryset):
        if self.value() is None:
            return queryset.filter(status=ApprovalStatus.PENDING, kind=ApprovalKind.TOOL_CALL)
        if self.value() == "decided":
            return queryset.exclude(status=ApprovalStatus.PENDING)
        return queryset


@admin.register(Approval)
class ApprovalAdmin(ReadOnlyAdmin):
    """Approvals: the tool calls waiting for a decision first (the reviewers' inbox in the
    console), with actions that approve or deny the selected ones as the signed-in user: only
    the approvals they are an approver of (the rule's requester, roles or members), the others
    are reported and left waiting. Decisions are audited and shown on the run's trace."""

    list_display = ["id", "tool_name", "agent", "requester", "reason", "approvers_shown", "status", "created_at",
                    "expires_at", "on_timeout", "run_link", "tenant"]
    list_display_links = ["id", "tool_name"]
    list_filter = [ApprovalStateFilter, "kind", "on_timeout"]
    search_fields = ["tool_name", "reason", "run__user__username", "run__session__agent__name", "=id"]
    ordering = ["id"]
    list_select_related = ["run__user", "run__session__agent", "tenant"]
    actions = ["approve_selected", "deny_selected"]

    @admin.display(description="agent", ordering="run__session__agent__name")
    def agent(self, obj):
        return obj.run.session.agent.name

    @admin.display(description="requester", ordering="run__user__username")
    def requester(self, obj):
        return obj.run.user.get_username()

    @admin.display(description="approvers")
    def approvers_shown(self, obj):
        from sessions.runs.approvals import approvers_text

        return approvers_text(obj)

    @admin.display(description="run")
    def run_link(self, obj):
        return format_html('<a href="{}">Run {}</a>', reverse("admin:agent_sessions_run_trace", args=[obj.run_id]),
                           obj.run_id)

    def _decide(self, request, queryset, decision: str):
        """The action's confirmation page (the selected approvals, a reason to give), then, when
        it is submitted, each decided as the signed-in user with that reason (a denial's is fed
        back to the model; both are in the audit log and on the run's trace)."""
        from django import forms
        from django.contrib.admin import helpers
        from django.template.response import TemplateResponse

        from agent_platform.api_errors import ApplicationError
        from sessions.services import approval_decide
        from tenants.scoping import tenant_scope

        class ReasonForm(forms.Form):
            reason = forms.CharField(required=False, max_length=2000, widget=forms.Textarea(attrs={"rows": 3}),
                                     help_text="Optional. A denial's reason is given to the agent with the failed call.")

        form = ReasonForm(request.POST if "confirm" in request.POST else None)
        if not form.is_bound or not form.is_valid():
            verb = "Approve" if decision == "approve" else "Deny"
            return TemplateResponse(request, "admin/agent_sessions/approval/decide.html", {
                **self.admin_site.each_context(request), "opts": self.model._meta, "title": f"{verb} tool calls",
                "verb": verb, "action": request.POST.get("action", ""), "approvals": list(queryset.order_by("id")),
                "form": form, "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME})
        done = 0
        for approval in queryset.order_by("id"):
            try:
                with tenant_scope(approval.tenant_id):  # the console sets the database's scope, not the ORM's
                    approval_decide(approval=approval, user=request.user, decision=decision,
                                    reason=form.cleaned_data["reason"])
                done += 1
            except ApplicationError as exc:
                self.message_user(request, f"Approval {approval.pk} ({approval.tool_name}): {exc.message}",
                                  level=messages.ERROR)
        if done:
            self.message_user(request, f"{done} {'approved' if decision == 'approve' else 'denied'}.")
        return None

    @admin.action(description="Approve the selected tool calls")
    def approve_selected(self, request, queryset):
        return self._decide(request, queryset, "approve")

    @admin.action(description="Deny the selected tool calls")
    def deny_selected(self, request, queryset):
        return self._decide(request, queryset, "deny")
