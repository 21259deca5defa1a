"""The run trace: the console page (tenant admins, every field) and
``GET /api/v1/runs/<id>/trace/`` (the run's own user, member fields only), each held to its
tenant and user."""

from __future__ import annotations

import asyncio
import json

import pytest
from django.test import Client
from django.urls import reverse

from agents.tests.factories import agent_with_route, bind_builtin
from console.trace import ADMIN_ONLY_FIELDS, run_trace
from llm.testing import Fail, Reply, ToolCalls
from sessions.models import Run
from sessions.runner.loop import execute_run
from sessions.tests.conftest import post_message_sync

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("no_enqueue"),
    pytest.mark.usefixtures("all_tenants_scope"),
]


@pytest.fixture
def traced_run(world, fake_llm, second_fake_llm) -> Run:
    """A finished run of the member: turn 1 fails on entry 1 and falls back to entry 2, which
    asks for test_echo; turn 2 answers (entry 1 again)."""
    agent = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url, second_fake_llm.base_url],
                             name="Tracer", system_prompt="SECRET-SYSTEM-PROMPT be brief")
    bind_builtin(agent, "test_echo")
    fake_llm.script(Fail(500, body={"error": {"message": "upstream exploded key=sk-abc"}}), Reply("Echoed: trace me."))
    second_fake_llm.script(ToolCalls([("test_echo", {"text": "trace me"})]))
    run = post_message_sync(agent=agent, user=world.member, content="Please echo trace me")
    asyncio.run(execute_run(run.pk))
    run = Run.all_tenants.select_related("session__agent", "user").get(pk=run.pk)
    assert run.status == "completed", run.error
    return run


def _keys(value) -> set[str]:
    if isinstance(value, dict):
        return set(value) | {k for v in value.values() for k in _keys(v)}
    if isinstance(value, list):
        return {k for v in value for k in _keys(v)}
    return set()


def test_trace_selector_has_turns_attempts_fallback_tool_call_and_reply(traced_run):
    trace = run_trace(run=traced_run, admin=True)
    assert [t["turn"] for t in trace["turns"]] == [0, 1]
    first = trace["turns"][0]
    assert [(a["entry_index"], a["status"], a["is_fallback"]) for a in first["attempts"]] == [
        (0, "failed", False), (1, "succeeded", True)]
    assert first["attempts"][0]["error_class"] == "server"
    assert first["prompt"][0]["content"] == "Please echo trace me"
    [tool] = first["tool_calls"]
    assert tool["name"] == "test_echo" and tool["arguments"] == {"text": "trace me"} and tool["status"] == "succeeded"
    assert "trace me" in tool["result"] and tool["duration_ms"] is not None
    assert trace["turns"][1]["completion"]["content"] == "Echoed: trace me."
    assert trace["turns"][1]["prompt"][0]["role"] == "tool"
    assert trace["run"]["reply"] == "Echoed: trace me."
    assert trace["run"]["system_prompt"].startswith("SECRET-SYSTEM-PROMPT")
    assert trace["totals"]["fallbacks"] == 1 and trace["totals"]["llm_calls"] == 3


def test_trace_api_gives_the_runs_user_member_fields_only(world, traced_run):
    response = world.client().get(f"/api/v1/runs/{traced_run.pk}/trace/")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["turns"][0]["tool_calls"][0]["arguments"] == {"text": "trace me"}
    assert body["run"]["reply"] == "Echoed: trace me."
    assert not (_keys(body) & ADMIN_ONLY_FIELDS), _keys(body) & ADMIN_ONLY_FIELDS
    text = json.dumps(body)
    assert "SECRET-SYSTEM-PROMPT" not in text and "sk-abc" not in text and "exploded" not in text
    assert body["turns"][0]["attempts"][0]["error"]  # a plain sentence instead


def test_trace_api_is_404_for_anyone_but_the_runs_user(world, other_world, traced_run):
    url = f"/api/v1/runs/{traced_run.pk}/trace/"
    for client in (world.client(admin=True), other_world.client(), other_world.client(admin=True)):
        response = client.get(url)
        assert response.status_code == 404 and response.json()["message"] == "Run not found."
    assert world.client().get("/api/v1/runs/999999/trace/").status_code == 404


def _console(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_console_trace_page_shows_the_whole_run_to_its_tenants_admin(world, traced_run):
    client = _console(world.admin)
    # The run's page is its trace.
    change = client.get(reverse("admin:agent_sessions_run_change", args=[traced_run.pk]))
    trace_url = reverse("admin:agent_sessions_run_trace", args=[traced_run.pk])
    assert change.status_code == 302 and change["Location"] == trace_url
    page = client.get(trace_url)
    assert page.status_code == 200
    html = page.content.decode()
    for seen in ("test_echo", "trace me", "Echoed: trace me.", "SECRET-SYSTEM-PROMPT", "fallback", "model-0",
                 "model-1", "server", "Please echo trace me"):
        assert seen in html, seen
    transcript_url = reverse("admin:agent_sessions_chatsession_transcript", args=[traced_run.session_id])
    assert f'{transcript_url}#run-{traced_run.pk}' in html
    session_change = client.get(reverse("admin:agent_sessions_chatsession_change", args=[traced_run.session_id]))
    assert session_change.status_code == 302 and session_change["Location"] == transcript_url
    transcript = client.get(transcript_url)
    assert transcript.status_code == 200 and trace_url in transcript.content.decode()


def test_console_trace_and_transcript_are_404_for_another_tenants_admin(other_world, traced_run):
    client = _console(other_world.admin)
    assert client.get(reverse("admin:agent_sessions_run_trace", args=[traced_run.pk])).status_code == 404
    assert client.get(reverse("admin:agent_sessions_chatsession_transcript",
                              args=[traced_run.session_id])).status_code == 404
    assert client.get(reverse("admin:agent_sessions_run_trace", args=["nope"])).status_code == 404
    # and their run list does not show it
    listing = client.get(reverse("admin:agent_sessions_run_changelist"))
    assert listing.status_code == 200 and "Please echo" not in listing.content.decode()
    assert reverse("admin:agent_sessions_run_trace", args=[traced_run.pk]) not in listing.content.decode()


def test_run_list_search_and_filters(world, traced_run):
    client = _console(world.admin)
    url = reverse("admin:agent_sessions_run_changelist")
    trace_url = reverse("admin:agent_sessions_run_trace", args=[traced_run.pk])
    assert trace_url in client.get(url, {"q": "echo trace"}).content.decode()
    assert trace_url not in client.get(url, {"q": "no such words"}).content.decode()
    assert trace_url in client.get(url, {"status__exact": "completed"}).content.decode()
    assert trace_url not in client.get(url, {"status__exact": "failed"}).content.decode()
    agent_id = traced_run.session.agent_id
    assert trace_url in client.get(url, {"session__agent__id__exact": agent_id}).content.decode()


def test_a_compaction_shows_in_the_turn_that_needed_it(traced_run):
    from sessions.models import Compaction, LLMCall

    second_turn_start = LLMCall.all_tenants.filter(run=traced_run, turn=1).order_by("created_at").first().created_at
    compaction = Compaction.all_tenants.create(
        tenant_id=traced_run.tenant_id, session_id=traced_run.session_id, run=traced_run, attempt=1,
        status="succeeded", summary="The user asked for an echo.", messages_summarized=3, tokens_before=900,
        tokens_after=120,
    )
    Compaction.all_tenants.filter(pk=compaction.pk).update(created_at=second_turn_start)
    trace = run_trace(run=traced_run, admin=False)
    assert [len(t["compactions"]) for t in trace["turns"]] == [0, 1]
    assert trace["turns"][1]["compactions"][0]["tokens_after"] == 120 and trace["totals"]["compactions"] == 1


# --- compaction calls are not the answer's retries --------------------------------------------


def _compacting_run(world, fake_llm, *, summaries, max_retries=0) -> Run:
    """A run of the member whose third turn compacts before answering: two echo turns of
    1,600 characters each pass 0.7 × the 2,000-token window; ``summaries`` are the scripted
    answers to the summarizer's requests (in order), then the answer "Both echoed."."""
    from llm.models import ModelRouteEntry

    agent = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], max_retries=max_retries)
    bind_builtin(agent, "test_echo")
    ModelRouteEntry.all_tenants.filter(route=agent.route).update(max_input_tokens=2000)
    fake_llm.script(ToolCalls([("test_echo", {"text": "a" * 1600})]), ToolCalls([("test_echo", {"text": "b" * 1600})]),
                    *summaries, Reply("Both echoed."))
    run = post_message_sync(agent=agent, user=world.member, content="echo two long texts")
    asyncio.run(execute_run(run.pk))
    return Run.all_tenants.select_related("session__agent", "user").get(pk=run.pk)


def _rows(calls):
    return [(a["purpose"], a["attempt"], a["status"], a["is_retry"], a["is_fallback"]) for a in calls]


def test_a_turns_compaction_calls_are_not_attempts_or_retries_of_its_answer(world, fake_llm):
    run = _compacting_run(world, fake_llm, summaries=[Reply("## Goal\n- S1"), Reply("## Goal\n- S2")])
    assert run.status == "completed", run.error
    trace = run_trace(run=run, admin=True)
    third = trace["turns"][2]
    assert _rows(third["attempts"]) == [("turn", 1, "succeeded", False, False)]
    assert _rows(third["compaction_calls"]) == [("compaction", 1, "succeeded", False, False)] * 2
    assert [len(t["compactions"]) for t in trace["turns"]] == [0, 0, 2]
    assert [len(t["compaction_calls"]) for t in trace["turns"][:2]] == [0, 0]
    totals = trace["totals"]
    assert (totals["llm_calls"], totals["retries"], totals["fallbacks"], totals["compaction_calls"]) == (5, 0, 0, 2)
    # The member's API shows the same split (purpose on every row).
    body = world.client().get(f"/api/v1/runs/{run.pk}/trace/").json()
    assert [a["purpose"] for a in body["turns"][2]["compaction_calls"]] == ["compaction", "compaction"]
    assert [a["purpose"] for a in body["turns"][2]["attempts"]] == ["turn"]
    assert body["totals"]["retries"] == 0
    # The console page lists them apart, under the turn's compactions.
    page = _console(world.admin).get(reverse("admin:agent_sessions_run_trace", args=[run.pk])).content.decode()
    assert page.count('data-testid="trace-compaction-call" data-purpose="compaction"') == 2
    assert page.count('data-testid="trace-attempt" data-purpose="turn"') == 3
    assert "5 (2 for compaction, 0 retries, 0 fallbacks)" in page


def test_a_summary_request_retried_by_the_router_is_one_retry(world, fake_llm):
    # The summarizer's first attempt fails (500) and the entry retries it once: that retry is
    # the run's only one; the second compaction (a new request) is not a retry.
    down = Fail(500, body={"error": {"message": "summarizer hiccup"}})
    run = _compacting_run(world, fake_llm, summaries=[down, Reply("## Goal\n- S1"), Reply("## Goal\n- S2")],
                          max_retries=1)
    assert run.status == "completed", run.error
    trace = run_trace(run=run, admin=False)
    third = trace["turns"][2]
    assert _rows(third["compaction_calls"]) == [
        ("compaction", 1, "failed", False, False), ("compaction", 2, "succeeded", True, False),
        ("compaction", 1, "succeeded", False, False)]
    assert _rows(third["attempts"]) == [("turn", 1, "succeeded", False, False)]
    assert (trace["totals"]["retries"], trace["totals"]["llm_calls"]) == (1, 6)


def test_failed_compaction_attempts_are_not_retries_and_show_in_their_turn(world, fake_llm):
    down = Fail(500, body={"error": {"message": "summarizer down"}})
    run = _compacting_run(world, fake_llm, summaries=[down, down, down])
    assert run.reason == "compaction_failed"
    trace = run_trace(run=run, admin=True)
    third = trace["turns"][2]
    assert third["attempts"] == [] and _rows(third["compaction_calls"]) == [("compaction", 1, "failed", False, False)] * 3
    assert [c["status"] for c in third["compactions"]] == ["failed"] * 3
    assert trace["totals"]["retries"] == 0
