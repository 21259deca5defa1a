"""The API throttles' counters are read in one cache call and written in one per window
(tenants.throttling.throttles_check), under DRF's rules: a message POST spent 8 Redis round
trips on them before (a get and a set for each of ``messages`` and ``runs``, per user and per
tenant)."""

from __future__ import annotations

import uuid
from collections import Counter

import pytest
from django.core.cache import caches

from agents.tests.factories import agent_with_route
from tenants.throttling import throttle_wait, throttles_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("all_tenants_scope")]


@pytest.fixture
def cache_calls(monkeypatch):
    """Counts the default cache's calls that touch throttle keys, by method."""
    cache = caches["default"]
    calls: Counter[str] = Counter()

    def spy(name, keys_of):
        real = getattr(cache, name)

        def wrapper(*args, **kwargs):
            if any(str(key).startswith("throttle_") for key in keys_of(*args)):
                calls[name] += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(cache, name, wrapper)

    spy("get", lambda key, *rest: [key])
    spy("set", lambda key, *rest: [key])
    spy("get_many", lambda keys, *rest: list(keys))
    spy("set_many", lambda data, *rest: list(data))
    return calls


@pytest.fixture
def session_for(world, no_enqueue):
    agent = agent_with_route(tenant=world.tenant, base_urls=["http://127.0.0.1:9/v1"])
    client = world.client()
    session = client.post("/api/v1/sessions/", {"agent": agent.pk}, format="json").json()
    return client, f"/api/v1/sessions/{session['id']}/messages/"


def test_a_message_post_reads_its_four_counters_at_once_and_writes_them_at_once(settings, session_for, cache_calls):
    settings.API_THROTTLE_RATES = {**settings.API_THROTTLE_RATES, "messages.user": "30/minute",
                                   "messages.tenant": "300/minute", "runs.user": "60/minute", "runs.tenant": "600/minute"}
    client, url = session_for
    assert client.post(url, {"content": "go"}, format="json").status_code == 201
    assert cache_calls == {"get_many": 1, "set_many": 1}  # before: 4 gets and 4 sets


def test_the_counters_follow_drfs_rules(settings, world, session_for):
    """Over its rate, a budget refuses (429, Retry-After) and records nothing; the budgets that
    allowed the request still count it, as DRF's own loop does."""
    settings.API_THROTTLE_RATES = {**settings.API_THROTTLE_RATES, "messages.user": "2/minute",
                                   "messages.tenant": "100/minute", "runs.user": "100/hour", "runs.tenant": ""}
    client, url = session_for
    cache = caches["default"]
    user_id, tenant_id = world.member.pk, world.tenant.pk
    keys = [f"throttle_{scope}_{kind}_{ident}" for scope in ("messages", "runs")
            for kind, ident in (("user", user_id), ("tenant", tenant_id))]
    cache.delete_many(keys)  # an earlier run of the suite may have left them (ids repeat across runs)
    assert [client.post(url, {"content": f"m{i}"}, format="json").status_code for i in range(2)] == [201, 201]
    refused = client.post(url, {"content": "m3"}, format="json")
    assert refused.status_code == 429, refused.content
    assert 1 <= int(refused["Retry-After"]) <= 60
    assert len(cache.get(f"throttle_messages_user_{user_id}")) == 2
    assert len(cache.get(f"throttle_messages_tenant_{tenant_id}")) == 3
    assert len(cache.get(f"throttle_runs_user_{user_id}")) == 3  # its own window: an hour
    assert cache.get(f"throttle_runs_tenant_{tenant_id}") is None  # no rate: not counted


def test_throttle_wait_spends_the_same_budgets(settings, cache_calls):
    """The doors that are not DRF views (A2A, MCP, webhooks) share the batched check."""
    user_id, tenant_id = 10**9 + uuid.uuid4().int % 10**6, 10**9 + uuid.uuid4().int % 10**6
    settings.API_THROTTLE_RATES = {**settings.API_THROTTLE_RATES, "messages.user": "1/minute",
                                   "messages.tenant": "100/minute", "runs.user": "100/minute", "runs.tenant": "100/minute"}
    assert throttle_wait(scopes=("messages", "runs"), user_id=user_id, tenant_id=tenant_id) is None
    wait = throttle_wait(scopes=("messages", "runs"), user_id=user_id, tenant_id=tenant_id)
    assert wait is not None and 1 <= wait <= 60
    assert cache_calls == {"get_many": 2, "set_many": 2}


def test_two_throttles_with_one_key_count_twice_as_drf_would(settings):
    """A view naming a scope twice spends it twice (DRF asks each throttle in turn)."""
    from types import SimpleNamespace

    from tenants.throttling import throttles_check

    settings.API_THROTTLE_RATES = {**settings.API_THROTTLE_RATES, "search.user": "3/minute", "search.tenant": ""}
    user_id = 2 * 10**9 + uuid.uuid4().int % 10**6
    request = SimpleNamespace(user=SimpleNamespace(pk=user_id, is_authenticated=True), tenant=None)
    assert throttles_check(throttles_for(("search", "search")), request, None) == []
    waits = throttles_check(throttles_for(("search", "search")), request, None)
    assert len(waits) == 1  # 2 counted, the third allowed, the fourth refused
    assert len(caches["default"].get(f"throttle_search_user_{user_id}")) == 3
