"""The dashboard on the console's home: a tenant's runs, failures, cost and tokens per day,
per agent and per user for a month, active runs and cooling route entries; never another
tenant's numbers."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest
import redis.asyncio as aioredis
from django.conf import settings
from django.test import Client
from django.urls import reverse

from agents.tests.factories import agent_with_route
from console.dashboard import bar_chart, plain_breaker_state, tenant_month_usage
from llm.health import RedisEntryHealth
from llm.models import ModelRouteEntry
from llm.selectors import entry_health_key
from sessions.models import ChatSession, LLMCall, Run

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("all_tenants_scope")]


def _run(world, agent, *, status="completed", reason="", cost=0, tokens=(0, 0), user=None, when=None):
    user = user or world.member
    session = ChatSession.all_tenants.create(tenant=world.tenant, agent=agent, user=user, title="t")
    run = Run.all_tenants.create(tenant=world.tenant, session=session, user=user, input="hi", status=status,
                                 reason=reason, cost_usd_micros=cost, prompt_tokens=tokens[0],
                                 completion_tokens=tokens[1])
    LLMCall.all_tenants.create(tenant=world.tenant, run=run, turn=0, agent=agent, user=user, attempt=1, entry_index=0,
                               provider_name="p",
                               model="m", status="succeeded", prompt_tokens=tokens[0], completion_tokens=tokens[1],
                               cost_usd_micros=cost)
    if when is not None:
        Run.all_tenants.filter(pk=run.pk).update(created_at=when)
        LLMCall.all_tenants.filter(run=run).update(created_at=when)
    return run


@pytest.fixture
def numbers(world, other_world):
    ours = agent_with_route(tenant=world.tenant, base_urls=["http://127.0.0.1:9/v1"], name="Ours")
    theirs = agent_with_route(tenant=other_world.tenant, base_urls=["http://127.0.0.1:9/v1"], name="Theirs")
    day = datetime(2026, 3, 14, 12, tzinfo=UTC)
    _run(world, ours, cost=1_500_000, tokens=(100, 20), when=day)
    _run(world, ours, status="failed", reason="model_unavailable", cost=500_000, tokens=(10, 0), when=day,
         user=world.admin)
    _run(world, ours, status="running", when=day)
    _run(other_world, theirs, cost=9_000_000, tokens=(7777, 7777), when=day)
    _run(other_world, theirs, status="failed", reason="run_timeout", when=day)
    return ours


def test_month_usage_counts_only_the_tenant(world, numbers):
    usage = tenant_month_usage(tenant_id=world.tenant.pk, start=datetime(2026, 3, 1, tzinfo=UTC),
                               end=datetime(2026, 4, 1, tzinfo=UTC))
    assert usage["runs"] == {"total": 3, "completed": 1, "failed": 1, "cancelled": 0, "active": 1}
    assert [(f["reason"], f["count"]) for f in usage["failures"]] == [("model_unavailable", 1)]
    assert usage["total"]["cost_usd_micros"] == 2_000_000
    assert len(usage["days"]) == 31
    day = usage["days"][13]
    assert (day["day"].day, day["tokens"], day["runs"]) == (14, 130, 3)
    assert [(a["name"], a["runs"], a["cost_usd_micros"]) for a in usage["agents"]] == [("Ours", 3, 2_000_000)]
    assert {u["username"]: u["cost_usd_micros"] for u in usage["users"]} == {
        world.member.username: 1_500_000, world.admin.username: 500_000}
    empty = tenant_month_usage(tenant_id=world.tenant.pk, start=datetime(2026, 4, 1, tzinfo=UTC),
                               end=datetime(2026, 5, 1, tzinfo=UTC))
    assert empty["runs"]["total"] == 0 and empty["total"]["cost_usd_micros"] == 0


def _home(client, **params):
    response = client.get(reverse("admin:index"), params)
    assert response.status_code == 200
    return response.content.decode()


def test_console_home_shows_the_dashboard_of_the_admins_tenant_only(world, other_world, numbers):
    client = Client()
    client.force_login(world.admin)
    html = _home(client, month="2026-03")
    assert 'data-testid="kpi-runs">3<' in html and 'data-testid="kpi-cost">$2.0000<' in html
    assert "Every route entry failed" in html and "Ours" in html
    assert "Theirs" not in html and "run took longer" not in html and "7777" not in html
    # Naming the other tenant changes nothing.
    html = _home(client, month="2026-03", tenant=other_world.tenant.pk)
    assert 'data-testid="kpi-runs">3<' in html and "Theirs" not in html
    # A bad month is said, not a 500.
    assert "Month must look like" in _home(client, month="March")
    # The other admin sees their own numbers.
    other = Client()
    other.force_login(other_world.admin)
    html = _home(other, month="2026-03")
    assert 'data-testid="kpi-runs">2<' in html and "Theirs" in html and ">Ours<" not in html


def test_active_runs_and_cooling_entries(world, numbers):
    entry = ModelRouteEntry.all_tenants.get(route=numbers.route)

    async def open_breaker():
        client = aioredis.Redis.from_url(settings.REDIS_URL)
        try:
            health = RedisEntryHealth(client, prefix=f"{settings.REDIS_KEY_PREFIX}:health")
            await health.record_failure(entry_health_key(entry.pk), "auth")
        finally:
            await client.aclose()

    asyncio.run(open_breaker())
    client = Client()
    client.force_login(world.admin)
    html = _home(client)
    running = Run.all_tenants.get(tenant=world.tenant, status="running")
    assert reverse("admin:agent_sessions_run_trace", args=[running.pk]) in html
    assert "Cooling down after failures" in html and "last error: auth" in html


def test_plain_words_and_chart_geometry():
    assert plain_breaker_state("half_open").startswith("Trying again")
    chart = bar_chart([0, 5, 10], labels=["01", "02", "03"], width=300, height=120)
    assert [b["h"] for b in chart["bars"]] == [0, 50.0, 100.0]
    assert chart["bars"][0]["tick"] == "01"
