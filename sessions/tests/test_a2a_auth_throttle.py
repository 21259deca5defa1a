"""Failed token checks at ``/a2a/<slug>/`` are counted per client address (``a2a_auth.ip``, as
the MCP servers' ``mcp_auth.ip``): a token-guessing burst from one address ends in 429s with
``Retry-After``, before the token is even looked at, over both bindings and the card. A body over
the platform's request size limit is a 413 before the SDK reads it."""

from __future__ import annotations

import httpx
import pytest
from django.core.cache import cache

from agents.tests.factories import agent_with_route

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("all_tenants_scope")]


@pytest.fixture
def failed_token_budget(settings):
    """At most 3 failed token checks per client address and minute; the test's address starts clean."""
    settings.API_THROTTLE_RATES = {**settings.API_THROTTLE_RATES, "a2a_auth.ip": "3/minute"}
    cache.delete("throttle_a2a_auth_ip_127.0.0.1")
    yield
    cache.delete("throttle_a2a_auth_ip_127.0.0.1")


def test_a_token_guessing_burst_is_refused_with_429_and_retry_after(world, live_server_url, failed_token_budget,
                                                                      monkeypatch):
    agent_with_route(tenant=world.tenant, base_urls=["http://127.0.0.1:9/v1"], name="Helper")
    url = f"{live_server_url}/a2a/helper/"
    card = f"{url}.well-known/agent-card.json"
    call = {"jsonrpc": "2.0", "id": 1, "method": "ListTasks", "params": {}}
    version = {"A2A-Version": "1.0"}
    good = {**version, "Authorization": f"Bearer {world.member_token}"}

    # Good tokens spend nothing; no token is no guess.
    for _ in range(5):
        assert httpx.post(url, json=call, headers=good, timeout=10).status_code == 200
    assert httpx.post(url, json=call, headers=version, timeout=10).status_code == 401

    looked_up = []
    from tenants import resolution

    real = resolution.caller_resolve
    monkeypatch.setattr(resolution, "caller_resolve", lambda **kw: looked_up.append(kw) or real(**kw))
    guesses = [f"ap_guess{i}" for i in range(3)]
    statuses = [httpx.post(url, json=call, headers={**version, "Authorization": f"Bearer {g}"}, timeout=10).status_code
                for g in guesses]
    assert statuses == [401, 401, 401] and len(looked_up) == 3

    bad = {**version, "Authorization": "Bearer ap_guess-next"}
    refused = [
        httpx.post(url, json=call, headers=bad, timeout=10),
        httpx.get(f"{url}rest/tasks", headers=bad, timeout=10),
        httpx.get(card, headers=bad, timeout=10),
        httpx.post(url, json=call, headers=good, timeout=10),  # even a good token waits: the address is over
    ]
    for response in refused:
        assert response.status_code == 429, response.text
        assert 0 < int(response.headers["Retry-After"]) <= 60
        assert response.json()["message"].startswith("Too many failed logins from this address")
        assert response.headers["X-Content-Type-Options"] == "nosniff"
    assert len(looked_up) == 3  # refused before the token was looked at

    cache.delete("throttle_a2a_auth_ip_127.0.0.1")  # the window passes
    assert httpx.post(url, json=call, headers=good, timeout=10).status_code == 200


def test_a_body_over_the_platforms_limit_is_a_413_before_the_sdk_reads_it(world, live_server_url, settings):
    agent_with_route(tenant=world.tenant, base_urls=["http://127.0.0.1:9/v1"], name="Helper")
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 10_000
    headers = {"Authorization": f"Bearer {world.member_token}", "A2A-Version": "1.0"}
    big = {"message": {"messageId": "m1", "role": "ROLE_USER", "parts": [{"text": "x" * 20_000}]}}
    url = f"{live_server_url}/a2a/helper/"
    for response in (httpx.post(url, headers=headers, timeout=10,
                                json={"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": big}),
                     httpx.post(f"{url}rest/message:send", headers=headers, json=big, timeout=10)):
        assert response.status_code == 413, response.text
        assert response.json()["message"] == "The request body is larger than 10000 bytes."
    small = httpx.post(url, headers=headers, timeout=10,
                       json={"jsonrpc": "2.0", "id": 2, "method": "GetTask", "params": {"id": "1"}})
    assert small.status_code == 200 and small.json()["error"]["code"] == -32001
