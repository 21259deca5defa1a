"""``{% console_dashboard %}``: the dashboard on the console's home page (admin index)."""

from __future__ import annotations

from typing import Any

from django import template

from console.dashboard import (
    bar_chart,
    dashboard_tenants,
    share_bars,
    tenant_active_runs,
    tenant_cooling_entries_or_error,
    tenant_month_usage,
)
from sessions.selectors import month_bounds

register = template.Library()


@register.inclusion_tag("console/dashboard.html", takes_context=True)
def console_dashboard(context: dict[str, Any]) -> dict[str, Any]:
    """The dashboard of one tenant the user administers (``?tenant=<id>``, default the first
    by name) for one month (``?month=YYYY-MM``, default this month, UTC). A tenant the user
    does not administer is never shown: an unknown ``tenant`` falls back to the default."""
    request = context["request"]
    tenants = dashboard_tenants(user=request.user)
    if not tenants:
        return {"tenants": []}
    wanted = request.GET.get("tenant", "")
    tenant = next((t for t in tenants if str(t.pk) == wanted), tenants[0])
    month_error = ""
    try:
        start, end = month_bounds(request.GET.get("month") or None)
    except ValueError:
        month_error = "Month must look like 2026-11; showing this month."
        start, end = month_bounds(None)
    usage = tenant_month_usage(tenant_id=tenant.pk, start=start, end=end)
    cooling, cooling_error = tenant_cooling_entries_or_error(tenant_id=tenant.pk)
    days = usage["days"]
    labels = [d["day"].strftime("%d") for d in days]
    return {
        "tenants": tenants, "tenant": tenant, "month": start.strftime("%Y-%m"), "month_label": start.strftime("%B %Y"),
        "month_error": month_error, "usage": usage,
        "cost_chart": bar_chart([d["cost_usd_micros"] / 1_000_000 for d in days], labels=labels),
        "tokens_chart": bar_chart([d["tokens"] for d in days], labels=labels),
        "runs_chart": bar_chart([d["runs"] for d in days], labels=labels),
        "failures": share_bars(usage["failures"], "count"),
        "agents": share_bars(usage["agents"][:15], "cost_usd_micros"),
        "users": share_bars(usage["users"][:15], "cost_usd_micros"),
        "purposes": share_bars(usage["purposes"], "cost_usd_micros"),
        "active_runs": tenant_active_runs(tenant_id=tenant.pk),
        "cooling": cooling, "cooling_error": cooling_error,
    }
