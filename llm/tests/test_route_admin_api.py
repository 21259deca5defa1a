"""Route test and entry health, through the admin API and the console."""

from __future__ import annotations

import pytest

from agents.tests.factories import agent_with_route
from llm.testing import Fail, Reply

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("all_tenants_scope")]


def test_route_test_reports_latency_or_the_error_class_per_entry(world, fake_llm, second_fake_llm):
    route = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url, second_fake_llm.base_url]).route
    fake_llm.script(Reply("OK"))
    second_fake_llm.script(Fail(401, body={"error": {"message": "Incorrect API key provided"}}))
    resp = world.client(admin=True).post(f"/api/v1/admin/routes/{route.pk}/test/")
    assert resp.status_code == 200, resp.content
    first, second = resp.json()
    assert (first["ok"], first["reply"], first["error_class"]) == (True, "OK", None) and first["latency_ms"] >= 0
    assert (second["ok"], second["error_class"]) == (False, "auth") and "Incorrect API key" in second["error"]
    assert fake_llm.requests[0]["messages"] == [{"role": "user", "content": "Reply with the single word: OK"}]
    assert world.client().post(f"/api/v1/admin/routes/{route.pk}/test/").status_code == 403


def test_entry_health_shows_a_cooldown_after_an_auth_failure(world, fake_llm, second_fake_llm, no_enqueue):
    import asyncio

    from sessions.runner.loop import execute_run
    from sessions.tests.conftest import post_message_sync

    agent = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url, second_fake_llm.base_url])
    fake_llm.script(Fail(401, body={"error": {"message": "bad key"}}))
    second_fake_llm.script(Reply("fine"))
    run = post_message_sync(agent=agent, user=world.member, content="hi")
    asyncio.run(execute_run(run.pk))
    health = world.client(admin=True).get(f"/api/v1/admin/routes/{agent.route_id}/health/").json()
    assert [(h["position"], h["state"], h["last_error_class"]) for h in health] == [
        (0, "open", "auth"), (1, "closed", None),
    ]
    assert health[0]["cooldown_until"] is not None


def test_console_shows_entry_health_and_runs_the_route_test(client, world, fake_llm):
    route = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url]).route
    fake_llm.script(Reply("OK"))
    client.force_login(world.admin)
    page = client.get(f"/admin/llm/modelroute/{route.pk}/change/").content.decode()
    assert "Entry health" in page and "Working normally" in page  # the closed breaker, in plain words
    resp = client.post("/admin/llm/modelroute/", {"action": "test_routes", "_selected_action": [route.pk]}, follow=True)
    assert "OK in" in resp.content.decode()
