"""The ``a2a`` capability kind (capabilities/a2a): a remote A2A agent as a tool of our agents.

End to end over the live server: the admin registers agent B's card URL (our own A2A server at
``/a2a/<b>/``) with a bearer token as an encrypted header, binds it to agent A; the fake model
scripts A's call of the tool; B's run answers through the a2a-sdk client (streaming: progress
events on A's tool call); A's tool call has B's answer. Then: a remote task that fails is a
failed tool call with the reason; the card URL on a loopback address is refused when saved and
when a run opens the tool, unless the operator allows it (``OUTBOUND_ALLOWED_CIDRS``, which the
test settings set for 127.0.0.0/8)."""

from __future__ import annotations

import time

import pytest

from agents.tests.factories import agent_with_route
from capabilities.a2a.models import A2aAgent
from llm.testing import Fail, Reply, ToolCalls
from sessions.models import Run, ToolCall
from sessions.tests.conftest import post_message_sync

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("all_tenants_scope")]


def _wait_run(run_id: int, seconds: float = 60) -> Run:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        run = Run.all_tenants.get(pk=run_id)
        if run.status in ("completed", "failed", "cancelled"):
            return run
        time.sleep(0.1)
    raise AssertionError(f"run {run_id} still {Run.all_tenants.get(pk=run_id).status}")


def _events(session_id: int) -> list[dict]:
    import asyncio

    from sessions.events import events_since

    return asyncio.run(events_since(session_id=session_id, after_seq=0))


def _remote(world, live_server_url: str, slug: str = "paris-expert") -> dict:
    """Register our own server's agent ``slug`` as a remote A2A agent through the admin API."""
    response = world.client(admin=True).post("/api/v1/admin/a2a-agents/", {
        "name": "Paris", "card_url": f"{live_server_url}/a2a/{slug}/.well-known/agent-card.json",
        "headers": {"Authorization": f"Bearer {world.member_token}"}}, format="json")
    assert response.status_code == 201, response.content
    return response.json()


def _bind(world, agent, remote_id: int) -> None:
    response = world.client(admin=True).post("/api/v1/admin/bindings/", {
        "agent": agent.pk, "kind": "a2a", "config": {"a2a_agent": remote_id}}, format="json")
    assert response.status_code == 201, response.content


def test_our_agent_calls_a_remote_a2a_agent_as_a_tool(world, other_world, fake_llm, celery_worker, live_server_url):
    agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], name="Paris Expert",
                     description="Knows everything about Paris.")
    asker = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], name="Asker")
    remote = _remote(world, live_server_url)
    # the credential is write-only and stored encrypted
    assert "headers" not in remote and remote["has_headers"] is True
    stored = A2aAgent.all_tenants.get(pk=remote["id"])
    assert world.member_token not in stored.headers_encrypted and stored.headers_encrypted
    _bind(world, asker, remote["id"])
    # another tenant's admin can neither see it nor bind it
    assert other_world.client(admin=True).get(f"/api/v1/admin/a2a-agents/{remote['id']}/").status_code == 404
    foreign = agent_with_route(tenant=other_world.tenant, base_urls=[fake_llm.base_url], name="Foreign")
    refused = other_world.client(admin=True).post("/api/v1/admin/bindings/", {
        "agent": foreign.pk, "kind": "a2a", "config": {"a2a_agent": remote["id"]}}, format="json")
    assert refused.status_code == 400 and "not found" in refused.content.decode()

    fake_llm.script(
        ToolCalls([("paris-expert", {"message": "What is the capital of France?"})]),  # A asks B
        Reply("The capital of France is Paris, as always.", chunk_size=8),  # B's run
        Reply("B says: Paris."),  # A's answer
    )
    run = _wait_run(post_message_sync(agent=asker, user=world.member, content="Ask the expert").pk)
    assert run.status == "completed" and run.reply == "B says: Paris."
    [call] = ToolCall.all_tenants.filter(run__session__agent=asker)
    assert (call.name, call.status) == ("paris-expert", "succeeded")
    assert call.result == "The capital of France is Paris, as always."
    assert call.result_data["state"] == "TASK_STATE_COMPLETED"
    remote_run = Run.all_tenants.get(pk=int(call.result_data["task_id"]))
    assert remote_run.session.agent.slug == "paris-expert" and remote_run.input == "What is the capital of France?"
    # the model saw the card's skill as the tool, and the answer framed as untrusted
    first = fake_llm.requests[0]
    [tool] = [t["function"] for t in first["tools"] if t["function"]["name"] == "paris-expert"]
    assert "Knows everything about Paris." in tool["description"]
    assert tool["parameters"]["required"] == ["message"]
    assert "The capital of France is Paris" in fake_llm.requests[2]["messages"][-1]["content"]
    # streamed: the tool card's progress events
    progress = [e["data"] for e in _events(run.session_id) if e["type"] == "tool_call_progress"]
    assert progress and all(p["tool_call_id"] == call.pk for p in progress)
    assert any("completed" in p["message"] for p in progress)
    assert any("characters received" in p["message"] for p in progress)
    # the card is kept on the row for the console
    assert A2aAgent.all_tenants.get(pk=remote["id"]).card_snapshot["name"] == "Paris Expert"


def test_a_failed_remote_task_is_a_failed_tool_call_with_the_reason(world, fake_llm, celery_worker, live_server_url):
    agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], name="Paris Expert")
    asker = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], name="Asker")
    _bind(world, asker, _remote(world, live_server_url)["id"])
    fake_llm.script(
        ToolCalls([("paris-expert", {"message": "Capital?"})]),
        Fail(400, {"error": {"message": "bad request", "type": "invalid_request_error", "code": None}}),  # B fails
        Reply("The expert failed."),
    )
    run = _wait_run(post_message_sync(agent=asker, user=world.member, content="Ask").pk)
    [call] = ToolCall.all_tenants.filter(run__session__agent=asker)
    assert call.status == "failed", (call.status, call.result, call.error)
    assert "ended the task failed" in (call.error or call.result)
    assert run.status == "completed" and run.reply == "The expert failed."


def test_a_card_on_a_loopback_address_is_refused_unless_the_operator_allows_it(world, fake_llm, celery_worker,
                                                                                 live_server_url, settings):
    agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], name="Paris Expert")
    asker = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], name="Asker")
    remote = _remote(world, live_server_url)  # allowed: the test settings allow 127.0.0.0/8
    _bind(world, asker, remote["id"])

    # the operator's rules without loopback: only the model's host:port stays listed
    settings.OUTBOUND_ALLOWED_CIDRS = []
    settings.OUTBOUND_ALLOWED_HOSTS = [fake_llm.base_url.removeprefix("http://").removesuffix("/v1")]
    saved = world.client(admin=True).post("/api/v1/admin/a2a-agents/", {
        "name": "Metadata", "card_url": "http://169.254.169.254/latest/meta-data/"}, format="json")
    assert saved.status_code == 400 and "card_url" in saved.json().get("extra", saved.json()).__str__()
    loopback = world.client(admin=True).post("/api/v1/admin/a2a-agents/", {
        "name": "Loopback", "card_url": f"{live_server_url}/a2a/paris-expert/.well-known/agent-card.json"},
        format="json")
    assert loopback.status_code == 400 and "loopback" in loopback.content.decode().lower()

    # the row saved while it was allowed: the run's connect is checked again and refused
    fake_llm.script(Reply("No expert today."))
    run = _wait_run(post_message_sync(agent=asker, user=world.member, content="Ask").pk)
    assert run.status == "completed" and run.reply == "No expert today.", (run.reason, run.error)
    assert not any(t["function"]["name"] == "paris-expert" for t in fake_llm.requests[0].get("tools", []))
    unavailable = [e["data"] for e in _events(run.session_id) if e["type"] == "capability_unavailable"]
    assert [u["source"] for u in unavailable] == ["a2a"] and "loopback" in unavailable[0]["error"].lower()
    assert "loopback" in A2aAgent.all_tenants.get(pk=remote["id"]).last_error.lower()
    assert not Run.all_tenants.filter(session__agent__slug="paris-expert").exists()


def test_a_remote_agent_over_its_time_is_a_failed_call_with_the_reason(world, fake_llm, celery_worker,
                                                                        live_server_url):
    from llm.testing import Delay

    agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], name="Paris Expert")
    asker = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], name="Asker")
    remote = _remote(world, live_server_url)
    patched = world.client(admin=True).patch(f"/api/v1/admin/a2a-agents/{remote['id']}/",
                                             {"call_timeout_seconds": 1.0}, format="json")
    assert patched.status_code == 200 and patched.json()["has_headers"] is True  # the headers are kept
    _bind(world, asker, remote["id"])
    fake_llm.script(ToolCalls([("paris-expert", {"message": "Take your time"})]),
                    Delay(20, Reply("far too late")), Reply("The expert was too slow."))
    started = time.monotonic()
    run = _wait_run(post_message_sync(agent=asker, user=world.member, content="Ask").pk)
    [call] = ToolCall.all_tenants.filter(run__session__agent=asker)
    assert call.status in ("failed", "timed_out"), (call.status, call.result, call.error)
    assert "did not answer within 1 s" in (call.error or call.result)
    assert run.reply == "The expert was too slow." and time.monotonic() - started < 15


def test_a_card_without_streaming_is_called_blocking(world, fake_llm, celery_worker, live_server_url, monkeypatch):
    from capabilities.a2a import kind

    real_card = kind._card

    async def no_streaming(spec):
        card = await real_card(spec)
        card.capabilities.streaming = False
        return card

    monkeypatch.setattr(kind, "_card", no_streaming)
    agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], name="Paris Expert")
    asker = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], name="Asker")
    _bind(world, asker, _remote(world, live_server_url)["id"])
    fake_llm.script(ToolCalls([("paris-expert", {"message": "Capital?"})]),
                    Reply("Paris, in one piece.", chunk_size=4), Reply("Paris."))
    run = _wait_run(post_message_sync(agent=asker, user=world.member, content="Ask").pk)
    [call] = ToolCall.all_tenants.filter(run__session__agent=asker)
    assert (call.status, call.result, run.reply) == ("succeeded", "Paris, in one piece.", "Paris.")
    progress = [e["data"]["message"] for e in _events(run.session_id) if e["type"] == "tool_call_progress"]
    assert not any("characters received" in p for p in progress)  # one answer, no chunks
