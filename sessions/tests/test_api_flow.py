"""The end-user API flow through a real Celery worker: session → message → run → activities."""

from __future__ import annotations

import time

import pytest

from agents.tests.factories import agent_with_route, bind_builtin
from llm.testing import Reply, ToolCalls

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("all_tenants_scope")]


def wait_for_run(client, run_id, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        body = client.get(f"/api/v1/runs/{run_id}/").json()
        if body["status"] in ("completed", "failed", "cancelled"):
            return body
        time.sleep(0.1)
    raise AssertionError(f"run {run_id} still {body['status']} after {timeout} s")


def test_message_to_completed_run_with_activities(world, other_world, fake_llm, celery_worker):
    agent = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url])
    bind_builtin(agent, "test_echo")
    fake_llm.script(ToolCalls([("test_echo", {"text": "hello"})]), Reply("It said hello."))
    client = world.client()

    agents = client.get("/api/v1/agents/").json()["results"]
    assert [a["name"] for a in agents] == [agent.name]
    session = client.post("/api/v1/sessions/", {"agent": agent.pk}, format="json").json()
    posted = client.post(f"/api/v1/sessions/{session['id']}/messages/", {"content": "say hello"}, format="json")
    assert posted.status_code == 201
    assert posted.json()["run"]["status"] == "queued"
    run = wait_for_run(client, posted.json()["run"]["id"])
    assert run["status"] == "completed" and run["reply"] == "It said hello."
    assert [c["name"] for c in run["tool_calls"]] == ["test_echo"]

    activities = client.get(f"/api/v1/runs/{run['id']}/activities/").json()
    kinds = [(a["kind"], a.get("name") or a.get("model")) for a in activities["results"]]
    assert kinds == [("llm_call", "model-0"), ("tool_call", "test_echo"), ("llm_call", "model-0")]

    detail = client.get(f"/api/v1/sessions/{session['id']}/").json()
    assert [(r["input"], r["reply"]) for r in detail["runs"]] == [("say hello", "It said hello.")]
    assert detail["title"] == "say hello"

    foreign = other_world.client()
    assert foreign.get(f"/api/v1/sessions/{session['id']}/").status_code == 404
    assert foreign.get(f"/api/v1/runs/{run['id']}/").status_code == 404


def test_messages_posted_while_a_run_is_busy_are_answered_in_order(world, fake_llm, celery_worker):
    from llm.testing import Delay

    agent = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url])
    fake_llm.script(Delay(0.5, Reply("answer one")), Reply("answer two"))
    client = world.client()
    session = client.post("/api/v1/sessions/", {"agent": agent.pk}, format="json").json()
    r1 = client.post(f"/api/v1/sessions/{session['id']}/messages/", {"content": "one"}, format="json").json()["run"]
    r2 = client.post(f"/api/v1/sessions/{session['id']}/messages/", {"content": "two"}, format="json").json()["run"]
    assert wait_for_run(client, r1["id"])["reply"] == "answer one"
    assert wait_for_run(client, r2["id"])["reply"] == "answer two"
    second_request = fake_llm.requests[1]["messages"]
    assert [(m["role"], m["content"]) for m in second_request[1:]] == [
        ("user", "one"), ("assistant", "answer one"), ("user", "two"),
    ]


def test_empty_message_is_a_400_with_a_message(world, fake_llm):
    agent = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url])
    client = world.client()
    session = client.post("/api/v1/sessions/", {"agent": agent.pk}, format="json").json()
    resp = client.post(f"/api/v1/sessions/{session['id']}/messages/", {"content": "   "}, format="json")
    assert resp.status_code == 400
    assert resp.json()["message"] == "Validation error."
