"""Selectors of the console's dashboard (reads only): a tenant's runs, failures, cost and
tokens over a month, active runs and route entries cooling down.

Every query names the tenant explicitly (``tenant_id``): the console decides which tenant an
admin may look at (:func:`dashboard_tenants`) and these functions never look further.
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import Count, Sum
from django.db.models.functions import Coalesce, TruncDate

from llm.metering import LLMCallPurpose
from sessions.models import ACTIVE_RUN_STATUSES, LLMCall, Run, RunFailureReason, RunStatus
from tenants.models import Tenant

PLAIN_BREAKER_STATES = {
    "closed": "Working normally",
    "open": "Cooling down after failures: not used until the time shown",
    "half_open": "Trying again: one test request is allowed through",
}
"""The circuit breaker's states (llm/health.py) in plain words, for the console."""


def plain_breaker_state(state: str) -> str:
    """``"open"`` → "Cooling down after failures: …"; an unknown state is returned as is."""
    return PLAIN_BREAKER_STATES.get(state, state)


def dashboard_tenants(*, user: Any) -> list[Tenant]:
    """The tenants ``user`` may see on the dashboard: all for a superuser, else those they own
    or administer (the console's rule), by name."""
    from tenants.selectors import admin_tenant_ids

    if user.is_superuser:
        return list(Tenant.objects.order_by("name"))
    return list(Tenant.objects.filter(pk__in=admin_tenant_ids(user=user)).order_by("name"))


def _days(start: datetime, end: datetime) -> list[Any]:
    out, day = [], start.date()
    while day < end.date():
        out.append(day)
        day += timedelta(days=1)
    return out


def tenant_month_usage(*, tenant_id: int, start: datetime, end: datetime) -> dict[str, Any]:
    """Runs, failures, cost and tokens of one tenant in [start, end) (UTC).

    Returns:
        ``{"runs": {"total", "completed", "failed", "cancelled", "active"},
        "failures": [{"reason", "label", "count"}] (most first),
        "days": [{"day": date, "cost_usd_micros", "tokens", "prompt_tokens", "completion_tokens", "runs"}]
        (every day of the range, zeros included),
        "agents": [{"agent_id", "name", "runs", "tokens", "cost_usd_micros"}] (costliest first),
        "users": [{"user_id", "username", "runs", "tokens", "cost_usd_micros"}] (costliest first),
        "purposes": [{"purpose", "label", "llm_calls", "tokens", "cost_usd_micros"}] (costliest first),
        "total": {"llm_calls", "prompt_tokens", "completion_tokens", "cost_usd_micros"}}``.
        ``runs`` (and the runs of agents and users) count the runs created in the range;
        days, tokens, costs and ``total`` sum the LLM calls made in the range, whatever their
        purpose (run turns, compactions, chat titles, memory, query rewrites, reranks), purged chats'
        included, by the agent and user each call was made for.
    """
    # tenant-bypass: the console chose tenant_id among the admin's own tenants.
    runs = Run.all_tenants.filter(tenant_id=tenant_id, created_at__gte=start, created_at__lt=end,
                                  parent_tool_call__isnull=True)
    calls = LLMCall.all_tenants.filter(tenant_id=tenant_id, created_at__gte=start, created_at__lt=end)
    by_status = dict(runs.values_list("status").annotate(n=Count("id")).values_list("status", "n"))
    failures = [
        {"reason": reason or "", "label": RunFailureReason(reason).label if reason in RunFailureReason.values
         else (reason or "No reason recorded"), "count": n}
        for reason, n in runs.filter(status=RunStatus.FAILED).values("reason").annotate(n=Count("id"))
        .order_by("-n", "reason").values_list("reason", "n")
    ]
    sums = {
        "prompt_tokens": Coalesce(Sum("prompt_tokens"), 0),
        "completion_tokens": Coalesce(Sum("completion_tokens"), 0),
        "cost_usd_micros": Coalesce(Sum("cost_usd_micros"), 0),
    }
    per_day = {
        row["day"]: row for row in calls.annotate(day=TruncDate("created_at", tzinfo=start.tzinfo))
        .values("day").annotate(**sums).order_by("day")
    }
    runs_per_day = dict(
        runs.annotate(day=TruncDate("created_at", tzinfo=start.tzinfo)).values("day").annotate(n=Count("id"))
        .values_list("day", "n")
    )
    days = []
    for day in _days(start, end):
        row = per_day.get(day, {})
        prompt, completion = row.get("prompt_tokens", 0), row.get("completion_tokens", 0)
        days.append({"day": day, "cost_usd_micros": row.get("cost_usd_micros", 0), "tokens": prompt + completion,
                     "prompt_tokens": prompt, "completion_tokens": completion, "runs": runs_per_day.get(day, 0)})
    agents = _usage_rows(
        calls.values("agent_id", "agent__name").annotate(**sums),
        runs.values_list("session__agent_id", "session__agent__name").annotate(n=Count("id")),
        key="agent_id", name=("name", "agent__name"),
    )
    users = _usage_rows(
        calls.values("user_id", "user__username").annotate(**sums),
        runs.values_list("user_id", "user__username").annotate(n=Count("id")),
        key="user_id", name=("username", "user__username"),
    )
    purposes = [
        {"purpose": r["purpose"], "label": LLMCallPurpose(r["purpose"]).label
         if r["purpose"] in LLMCallPurpose.values else r["purpose"], "llm_calls": r["llm_calls"],
         "tokens": r["prompt_tokens"] + r["completion_tokens"], "cost_usd_micros": r["cost_usd_micros"]}
        for r in calls.values("purpose").annotate(llm_calls=Count("id"), **sums).order_by("-cost_usd_micros", "purpose")
    ]
    total = calls.aggregate(llm_calls=Count("id"), **sums)
    return {
        "runs": {
            "total": sum(by_status.values()),
            "completed": by_status.get(RunStatus.COMPLETED, 0),
            "failed": by_status.get(RunStatus.FAILED, 0),
            "cancelled": by_status.get(RunStatus.CANCELLED, 0),
            "active": sum(by_status.get(s, 0) for s in ACTIVE_RUN_STATUSES),
        },
        "failures": failures, "days": days, "agents": agents, "users": users, "purposes": purposes, "total": total,
    }


def _usage_rows(calls: Any, runs: Any, *, key: str, name: tuple[str, str]) -> list[dict[str, Any]]:
    """Per-agent or per-user rows of :func:`tenant_month_usage`: the LLM calls' sums per
    ``key`` value (``calls``: rows with ``key``, ``name[1]`` and the sums) beside the runs
    (``runs``: ``(id, name, count)`` tuples); an agent or user with runs but no LLM call
    shows zeros. Costliest first, then most runs, then by name."""
    out = {r[key]: {key: r[key], name[0]: r[name[1]], "runs": 0,
                    "tokens": r["prompt_tokens"] + r["completion_tokens"], "cost_usd_micros": r["cost_usd_micros"]}
           for r in calls}
    for pk, label, count in runs:
        row = out.setdefault(pk, {key: pk, name[0]: label, "runs": 0, "tokens": 0, "cost_usd_micros": 0})
        row["runs"] = count
    return sorted(out.values(), key=lambda r: (-r["cost_usd_micros"], -r["runs"], r[name[0]] or ""))


def tenant_active_runs(*, tenant_id: int, limit: int = 20) -> list[Run]:
    """The tenant's queued, running and approval-waiting runs (user runs), oldest first, at
    most ``limit``; with session, agent and user loaded."""
    # tenant-bypass: as above.
    return list(
        Run.all_tenants.filter(tenant_id=tenant_id, status__in=ACTIVE_RUN_STATUSES, parent_tool_call__isnull=True)
        .select_related("session__agent", "user").order_by("created_at", "id")[:limit]
    )


def tenant_cooling_entries_or_error(*, tenant_id: int) -> tuple[list[dict[str, Any]], str]:
    """Route entries of the tenant that are not working normally (breaker open or half-open),
    from the shared health state in Redis (one connection, one read per entry).

    Returns:
        ``(entries, error)``: entries ``[{"route_id", "route", "position", "provider", "model",
        "state", "state_label" (plain words), "cooldown_until": aware datetime | None,
        "last_error_class", "failures_last_minute"}]``; ``error`` is "" or, when Redis could
        not be read, a sentence saying so (entries then ``[]``).
    """
    import redis.asyncio as aioredis

    from llm.health import RedisEntryHealth
    from llm.models import ModelRouteEntry
    from llm.selectors import entry_health_key

    # tenant-bypass: the tenant's own route entries.
    entries = list(ModelRouteEntry.all_tenants.filter(tenant_id=tenant_id).select_related("route", "provider")
                   .order_by("route__name", "position"))
    if not entries:
        return [], ""

    async def snapshots() -> list[Any]:
        client = aioredis.Redis.from_url(settings.REDIS_URL)
        try:
            health = RedisEntryHealth(client, prefix=f"{settings.REDIS_KEY_PREFIX}:health")
            return [await health.snapshot(entry_health_key(e.pk)) for e in entries]
        finally:
            await client.aclose()

    try:
        snaps = asyncio.run(snapshots())
    except Exception as exc:  # Redis down: the dashboard still renders
        return [], f"The shared health state could not be read ({type(exc).__name__})."
    out = []
    for entry, snap in zip(entries, snaps, strict=False):
        if snap.state == "closed":
            continue
        until = snap.cooldown_until
        out.append({
            "route_id": entry.route_id, "route": entry.route.name, "position": entry.position,
            "provider": entry.provider.name, "model": entry.model, "state": snap.state,
            "state_label": plain_breaker_state(snap.state),
            "cooldown_until": datetime.fromtimestamp(until).astimezone() if until else None,
            "last_error_class": snap.last_error_class, "failures_last_minute": snap.failures_last_minute,
        })
    return out, ""


def bar_chart(values: list[float], *, labels: list[str], width: int = 620, height: int = 160) -> dict[str, Any]:
    """Geometry of a vertical bar chart drawn as SVG by the template (no script, no style).

    Returns:
        ``{"width", "height", "bars": [{"x", "y", "w", "h", "label", "value", "tick"}], "max"}``;
        ``tick`` is the label to print under the bar (every 5th day and the first), else "".
    """
    top = max(values) if values and max(values) > 0 else 1
    plot_h = height - 20
    slot = width / max(1, len(values))
    bars = []
    for i, (v, label) in enumerate(zip(values, labels, strict=False)):
        h = 0 if v <= 0 else max(1.0, plot_h * v / top)
        bars.append({"x": round(i * slot + 1, 1), "y": round(plot_h - h, 1), "w": round(max(1.0, slot - 2), 1),
                     "h": round(h, 1), "label": label, "value": v,
                     "tick": label if (i == 0 or (i + 1) % 5 == 0) else "", "tx": round(i * slot + slot / 2, 1)})
    return {"width": width, "height": height, "plot_h": plot_h, "bars": bars, "max": top}


def share_bars(rows: list[dict[str, Any]], key: str) -> list[dict[str, Any]]:
    """Adds ``pct`` (0–100, of the largest ``row[key]``) to each row, for horizontal bars."""
    top = max((r[key] for r in rows), default=0) or 1
    return [{**r, "pct": round(100 * r[key] / top, 1)} for r in rows]
