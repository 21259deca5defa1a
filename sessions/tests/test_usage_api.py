import pytest

from agents.tests.factories import AgentFactory
from sessions.models import ChatSession, LLMCall, Run

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("all_tenants_scope")]


def _spend(world, agent_name, micros, tokens=(100, 10)):
    agent = AgentFactory(tenant=world.tenant, name=agent_name)
    session = ChatSession.all_tenants.create(tenant=world.tenant, agent=agent, user=world.member)
    run = Run.all_tenants.create(tenant=world.tenant, session=session, user=world.member, input="x",
                                 cost_usd_micros=micros)
    LLMCall.all_tenants.create(tenant=world.tenant, run=run, turn=0, agent=agent, user=world.member, attempt=1,
                               entry_index=0, provider_name="p",
                               model="m", status="succeeded", prompt_tokens=tokens[0], completion_tokens=tokens[1],
                               cost_usd_micros=micros)
    return session, run


def test_usage_totals_and_per_agent_for_this_month_only_this_tenant(world, other_world):
    _spend(world, "Alpha", 1_500_000)
    _, beta_run = _spend(world, "Beta", 250)
    Run.all_tenants.filter(pk=beta_run.pk).update(purpose="api")
    _spend(other_world, "Theirs", 99_000_000)
    body = world.client(admin=True).get("/api/v1/admin/usage/").json()
    assert [(p["run_purpose"], p["cost_usd"]) for p in body["by_run_purpose"]] == [
        ("chat", "1.500000"), ("api", "0.000250")
    ]
    assert body["cost_usd"] == "1.500250" and body["llm_calls"] == 2 and body["prompt_tokens"] == 200
    assert [(a["agent"], a["cost_usd"]) for a in body["by_agent"]] == [("Alpha", "1.500000"), ("Beta", "0.000250")]
    empty = world.client(admin=True).get("/api/v1/admin/usage/?month=2020-01").json()
    assert (empty["month"], empty["llm_calls"], empty["cost_usd"]) == ("2020-01", 0, "0.000000")


def test_usage_rejects_a_bad_month_and_members(world):
    resp = world.client(admin=True).get("/api/v1/admin/usage/?month=November")
    assert resp.status_code == 400 and "YYYY-MM" in resp.json()["message"]
    assert world.client().get("/api/v1/admin/usage/").status_code == 403


def test_run_and_session_show_their_cost(world):
    session, run = _spend(world, "Alpha", 2_000_000)
    client = world.client()
    assert client.get(f"/api/v1/runs/{run.pk}/").json()["cost_usd"] == "2.000000"
    detail = client.get(f"/api/v1/sessions/{session.pk}/").json()
    assert detail["usage"]["cost_usd"] == "2.000000"
    [activity] = client.get(f"/api/v1/runs/{run.pk}/activities/").json()["results"]
    assert activity["cost_usd"] == "2.000000"
