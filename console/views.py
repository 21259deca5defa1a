"""The console's own pages (served under /admin/ by the model admins' ``get_urls``).

Each view takes the model admin it is mounted on, refuses with a 404 an object the admin
user may not see (``model_admin.get_queryset`` is the tenant scoping of
:mod:`tenants.admin_scoping`), and renders a template of this app.
"""

from __future__ import annotations

from typing import Any

from django.contrib.admin import ModelAdmin
from django.http import Http404, HttpRequest, HttpResponse
from django.template.response import TemplateResponse

from sessions.trace_selectors import run_trace


def _object_or_404(model_admin: ModelAdmin, request: HttpRequest, object_id: str) -> Any:
    try:
        pk = int(object_id)
    except (TypeError, ValueError):
        raise Http404("Not found.") from None
    obj = model_admin.get_queryset(request).filter(pk=pk).first()
    if obj is None or not model_admin.has_view_permission(request, obj):
        raise Http404("Not found.")
    return obj


def _context(model_admin: ModelAdmin, request: HttpRequest, obj: Any, title: str) -> dict[str, Any]:
    return {
        **model_admin.admin_site.each_context(request),
        "opts": model_admin.model._meta,
        "app_label": model_admin.model._meta.app_label,
        "original": obj,
        "title": title,
        "has_view_permission": True,
    }


def run_trace_view(model_admin: ModelAdmin, request: HttpRequest, object_id: str) -> HttpResponse:
    """The run's trace page (every field: the console is for tenant admins). 404 for a run
    of another tenant. ``?fragment=1``: the trace alone, no page around it (the playground
    shows it beside its chat)."""
    run = _object_or_404(model_admin, request, object_id)
    trace = run_trace(run=run, admin=True)
    if request.GET.get("fragment"):
        return TemplateResponse(request, "console/_trace_body.html", {"trace": trace, "run": run,
                                                                      "session": run.session, "fragment": True})
    return TemplateResponse(request, "console/run_trace.html", {
        **_context(model_admin, request, run, f"Run {run.pk}: trace"),
        "trace": trace, "run": run, "session": run.session,
    })


def session_transcript_view(model_admin: ModelAdmin, request: HttpRequest, object_id: str) -> HttpResponse:
    """The session's transcript, run by run, each run linked to its trace. 404 for a session
    of another tenant."""
    from sessions.models import Message, Run

    session = _object_or_404(model_admin, request, object_id)
    # tenant-bypass: the session is the admin's (checked above); same tenant.
    runs = list(
        Run.all_tenants.filter(tenant_id=session.tenant_id, session_id=session.pk, parent_tool_call__isnull=True)
        .order_by("created_at", "id")
    )
    messages = list(
        Message.all_tenants.filter(tenant_id=session.tenant_id, session_id=session.pk).order_by("position")
    )
    by_run: dict[int, list[Message]] = {}
    for m in messages:
        by_run.setdefault(m.run_id, []).append(m)
    return TemplateResponse(request, "console/session_transcript.html", {
        **_context(model_admin, request, session, f"{session}: transcript"),
        "session": session,
        "runs": [{"run": r, "messages": by_run.get(r.pk, [])} for r in runs],
    })


def agent_playground_view(model_admin: ModelAdmin, request: HttpRequest, object_id: str) -> HttpResponse:
    """"Try this agent": a chat with the agent as configured now, its run's trace beside it.

    The page's script (``console/playground.js``) talks to the chat API as the admin user
    (their membership of the agent's tenant, ``X-Tenant``): it creates a session of theirs,
    posts messages, streams the reply over the session's WebSocket and reloads the trace
    (``…/run/<id>/trace/?fragment=1``). 404 for an agent of another tenant.
    """
    from tenants.models import Membership, Tenant

    agent = _object_or_404(model_admin, request, object_id)
    tenant = Tenant.objects.get(pk=agent.tenant_id)
    # tenant-bypass: does the admin user have a membership (the chat API needs one)?
    has_membership = Membership.all_tenants.filter(tenant_id=agent.tenant_id, user_id=request.user.pk).exists()
    return TemplateResponse(request, "console/playground.html", {
        **_context(model_admin, request, agent, f"Try {agent.name}"),
        "agent": agent, "tenant": tenant, "has_membership": has_membership,
    })


def agent_versions_view(model_admin: ModelAdmin, request: HttpRequest, object_id: str) -> HttpResponse:
    """The agent's versions, newest first, which is published and which the draft; a POST
    ``{action: publish | rollback, version, note?}`` publishes one (change permission needed)
    and returns here. ``?diff=<n>&against=<m>``: the per-field diff of version ``n`` against
    ``m`` (default n - 1) above the list. 404 for an agent of another tenant."""
    from django.contrib import messages
    from django.core.exceptions import PermissionDenied
    from django.shortcuts import redirect

    from agents.models import AgentVersion
    from agents.versions import VersionError, config_diff, version_publish
    from tenants.audit import Action, audit_record

    agent = _object_or_404(model_admin, request, object_id)
    versions = list(AgentVersion.all_tenants.filter(tenant_id=agent.tenant_id, agent=agent)
                    .select_related("created_by").order_by("-number"))
    if request.method == "POST":
        if not model_admin.has_change_permission(request, agent):
            raise PermissionDenied
        number = request.POST.get("version", "")
        try:
            version = version_publish(agent, number=int(number) if number.isdigit() else None, user=request.user,
                                      note=request.POST.get("note", "")[:500])
        except VersionError as exc:
            messages.error(request, str(exc))
        else:
            audit_record(action=Action.UPDATE, obj=agent, changes={"published_version": {"to": version.number}},
                         detail={"action": request.POST.get("action", "publish")[:20]})
            messages.success(request, f"Version {version.number} is published.")
        return redirect(request.path)
    by_number = {v.number: v for v in versions}
    diff = None
    shown = request.GET.get("diff", "")
    if shown.isdigit() and int(shown) in by_number:
        against = request.GET.get("against", str(int(shown) - 1))
        before = by_number.get(int(against)) if against.isdigit() else None
        diff = {"to": int(shown), "from": before.number if before else None,
                "changes": config_diff(before.config if before else {}, by_number[int(shown)].config)}
    return TemplateResponse(request, "console/agent_versions.html", {
        **_context(model_admin, request, agent, f"{agent.name}: versions"),
        "agent": agent, "versions": versions, "diff": diff,
        "can_publish": model_admin.has_change_permission(request, agent),
    })


def agents_export_view(model_admin: ModelAdmin, request: HttpRequest) -> HttpResponse:
    """The agents of the tenants the admin user administers (a superuser: all) as a YAML
    download (:func:`agents.as_code.agents_export`; no secrets)."""
    from agents.as_code import agents_export
    from tenants.admin_scoping import admin_tenants

    if not model_admin.has_view_permission(request):
        raise Http404("Not found.")
    tenant_ids = None if request.user.is_superuser else admin_tenants(request)
    response = HttpResponse(agents_export(tenant_ids=tenant_ids), content_type="application/yaml; charset=utf-8")
    response["Content-Disposition"] = 'attachment; filename="agents.yaml"'
    return response


def agents_import_view(model_admin: ModelAdmin, request: HttpRequest) -> HttpResponse:
    """Import agents from YAML (a file or pasted text): "Preview" shows the dry run's per-field
    diff, "Import" applies it (:func:`agents.as_code.agents_import`), for the admin user's
    tenants only (another tenant named in the file is refused as unknown)."""
    from agents.as_code import ImportError_, agents_import
    from tenants.admin_scoping import admin_tenants

    if not model_admin.has_add_permission(request):
        raise Http404("Not found.")
    context: dict[str, Any] = {"text": "", "plans": None, "error": "", "applied": False}
    if request.method == "POST":
        upload = request.FILES.get("file")
        text = upload.read(2_000_000).decode("utf-8", "replace") if upload else request.POST.get("text", "")
        dry_run = "apply" not in request.POST
        tenant_ids = None if request.user.is_superuser else admin_tenants(request)
        try:
            plans = agents_import(text, dry_run=dry_run, user=request.user, tenant_ids=tenant_ids,
                                  note="Imported in the console")
        except ImportError_ as exc:
            context.update(error=str(exc), text=text)
        else:
            context.update(plans=plans, text=text, applied=not dry_run)
    return TemplateResponse(request, "console/agents_import.html", {
        **model_admin.admin_site.each_context(request), "opts": model_admin.model._meta,
        "title": "Import agents", **context,
    })
