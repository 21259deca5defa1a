"""Model call records (issue 40): a tenant's opt-in to keeping the exact request and response
bodies of its model calls (sessions/llm_bodies.py), on the fake model.

Off (the default) nothing is kept; on, each attempt's row holds the request exactly as the
provider received it and the assembled answer, never the provider key; tenant admins read
them in the console's trace, the run's member does not; retention deletes them; the tenant
settings API and the console change the opt-in.
"""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from agents.tests.factories import agent_with_route, bind_builtin
from llm.models import ModelProvider
from llm.records import AttemptRecord, BodyCapture
from llm.testing import Fail, Reply, ToolCalls
from sessions.llm_bodies import body_columns, body_cut, llm_bodies_purge
from sessions.models import LLMCall, LLMCallBody, Run
from sessions.runner.loop import execute_run
from sessions.tests.conftest import post_message_sync
from tenants.crypto import secret_encrypt
from tenants.models import AuditEvent, Tenant
from tenants.scoping import tenant_scope

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("no_enqueue"),
    pytest.mark.usefixtures("all_tenants_scope"),
]

API_KEY = "sk-live-SECRET-KEY-0123456789abcdef"


def _record_bodies(tenant, on: bool = True, days: int = 7) -> None:
    Tenant.objects.filter(pk=tenant.pk).update(record_llm_bodies=on, llm_body_retention_days=days)


def _agent(world, fake_llm):
    """An agent on two entries of the fake model (both with the provider key :data:`API_KEY`)
    and the test_echo tool."""
    agent = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url] * 2, name="Recorder")
    bind_builtin(agent, "test_echo")
    ModelProvider.all_tenants.filter(tenant=world.tenant).update(
        api_key_encrypted=secret_encrypt(tenant=world.tenant, plaintext=API_KEY))
    return agent


def _run(world, fake_llm, content: str = "Please echo hello") -> Run:
    """A run of the member: entry 0 fails (503), entry 1 asks for test_echo, then answers."""
    agent = _agent(world, fake_llm)
    fake_llm.script(Fail(503), ToolCalls([("test_echo", {"text": "hello"})]), Reply("Echoed: hello."))
    run = post_message_sync(agent=agent, user=world.member, content=content)
    asyncio.run(execute_run(run.pk))
    run = Run.all_tenants.select_related("session__agent", "user").get(pk=run.pk)
    assert run.status == "completed", run.error
    return run


def test_off_by_default_nothing_is_kept(world, fake_llm):
    assert Tenant.objects.get(pk=world.tenant.pk).record_llm_bodies is False
    run = _run(world, fake_llm)
    assert LLMCall.all_tenants.filter(run=run).count() == 3
    assert not LLMCallBody.all_tenants.exists()


def test_on_keeps_each_attempts_exact_request_and_answer_and_never_the_key(world, fake_llm):
    _record_bodies(world.tenant)
    run = _run(world, fake_llm)
    calls = list(LLMCall.all_tenants.filter(run=run).order_by("created_at", "id"))
    bodies = {b.llm_call_id: b for b in LLMCallBody.all_tenants.filter(llm_call__run=run)}
    assert [c.status for c in calls] == ["failed", "succeeded", "succeeded"] and set(bodies) == {c.pk for c in calls}
    received = fake_llm.requests
    assert len(received) == 3
    for call, sent in zip(calls, received, strict=True):
        body = bodies[call.pk]
        assert body.tenant_id == world.tenant.pk and body.created_at == call.created_at
        assert json.loads(body.request) == sent  # exactly what the provider got
        assert body.request_bytes == len(body.request.encode()) and not body.request_truncated
    assert json.loads(bodies[calls[0].pk].request)["model"] == "model-0"
    # The failed attempt has no answer; the answers are the streams assembled.
    assert bodies[calls[0].pk].response == "" and bodies[calls[0].pk].response_bytes == 0
    asked = json.loads(bodies[calls[1].pk].response)
    [choice] = asked["choices"]
    assert choice["finish_reason"] == "tool_calls"
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in choice["message"]["tool_calls"]] \
        == [("test_echo", {"text": "hello"})]
    assert asked["usage"]["prompt_tokens"] == calls[1].prompt_tokens
    answered = json.loads(bodies[calls[2].pk].response)
    assert answered["choices"][0]["message"]["content"] == "Echoed: hello."
    assert answered["choices"][0]["finish_reason"] == "stop"
    # The second turn's request carries the tool call and its result, as sent.
    assert [m["role"] for m in json.loads(bodies[calls[2].pk].request)["messages"]][-2:] == ["assistant", "tool"]
    # The provider key (sent in the Authorization header) is nowhere in the stored rows.
    for body in bodies.values():
        row = LLMCallBody.all_tenants.filter(pk=body.pk).values().get()
        assert API_KEY not in json.dumps(row, default=str)


def test_a_key_inside_a_body_is_redacted_and_long_bodies_are_cut_and_marked():
    capture = BodyCapture(secrets=(API_KEY, "short"))
    capture.request = {"messages": [{"role": "user", "content": f"my key is {API_KEY}, short"}]}
    capture.response = {"choices": [{"message": {"content": "ä" * 3000}}]}
    record = AttemptRecord(entry_index=0, provider_name="p", model="m", attempt=1, latency_ms=1, first_token_ms=None,
                           prompt_tokens=0, completion_tokens=0, usage_estimated=False, status="succeeded",
                           error_class=None, error="", bodies=capture)
    columns = body_columns(record, max_bytes=1000)
    assert API_KEY not in columns["request"] and "[redacted]" in columns["request"] and "short" in columns["request"]
    assert not columns["request_truncated"]
    assert columns["response_truncated"] and columns["response_bytes"] > 6000
    assert len(columns["response"].encode()) <= 1000  # cut on a character boundary
    assert body_cut("a\x00b", 10) == ("a\ufffdb", 5, False)
    record.bodies = None
    assert body_columns(record) is None


def _console(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_admins_see_the_bodies_in_the_console_trace_members_do_not(world, other_world, fake_llm):
    _record_bodies(world.tenant)
    run = _run(world, fake_llm)
    url = reverse("admin:agent_sessions_run_trace", args=[run.pk])
    page = _console(world.admin).get(url).content.decode()
    assert page.count('data-testid="trace-bodies"') == 3
    assert "Request / Response" in page and "stream_options" in page and "&quot;finish_reason&quot;: &quot;tool_calls&quot;" in page
    assert API_KEY not in page
    # The member's trace (the chat app's details view) has no bodies at all.
    response = world.client().get(f"/api/v1/runs/{run.pk}/trace/")
    assert response.status_code == 200
    assert "bodies" not in response.content.decode() and "stream_options" not in response.content.decode()
    # Another tenant's admin gets a 404 for the page, and their record list does not show ours.
    other = _console(other_world.admin)
    assert other.get(url).status_code == 404
    listing = other.get(reverse("admin:agent_sessions_llmcallbody_changelist"))
    assert listing.status_code == 200 and "stream_options" not in listing.content.decode()
    assert "Run %d" % run.pk not in listing.content.decode()
    # Their own tenant's list: the records, searchable.
    ours = _console(world.admin).get(reverse("admin:agent_sessions_llmcallbody_changelist"), {"q": "stream_options"})
    assert ours.status_code == 200 and f"Run {run.pk}" in ours.content.decode()


def _body(tenant, *, days_old: float) -> int:
    call = LLMCall.all_tenants.create(tenant=tenant, attempt=1, entry_index=0, provider_name="p", model="m",
                                      status="succeeded", purpose="title")
    return LLMCallBody.all_tenants.create(tenant=tenant, llm_call=call, request="{}",
                                          created_at=timezone.now() - timedelta(days=days_old)).pk


def test_retention_deletes_bodies_past_each_tenants_days_and_all_of_a_tenant_that_stopped(world, other_world):
    third = Tenant.objects.create(name="Initech", slug="initech", wrapped_data_key="x")
    _record_bodies(world.tenant, days=7)
    _record_bodies(other_world.tenant, days=30)
    old_7, new_7 = _body(world.tenant, days_old=8), _body(world.tenant, days_old=6)
    old_30, new_30 = _body(other_world.tenant, days_old=31), _body(other_world.tenant, days_old=8)
    stopped = [_body(third, days_old=0.1), _body(third, days_old=2)]  # record_llm_bodies is off
    assert llm_bodies_purge() == 2 + len(stopped)
    assert set(LLMCallBody.all_tenants.values_list("pk", flat=True)) == {new_7, new_30}
    assert not LLMCallBody.all_tenants.filter(pk__in=[old_7, old_30]).exists()
    # The calls themselves stay (usage and budgets count them).
    assert LLMCall.all_tenants.count() == 6


def test_metered_calls_keep_bodies_only_for_a_tenant_that_records_them(world):
    from llm.metering import CallSite
    from sessions.llm_calls import llm_calls_record

    def attempt() -> AttemptRecord:
        capture = BodyCapture()
        capture.request, capture.response = '{"messages": []}', {"choices": []}
        return AttemptRecord(entry_index=0, provider_name="p", model="m", attempt=1, latency_ms=1, first_token_ms=1,
                             prompt_tokens=1, completion_tokens=1, usage_estimated=False, status="succeeded",
                             error_class=None, error="", bodies=capture)

    site = CallSite(tenant_id=world.tenant.pk, purpose="title")
    with tenant_scope(world.tenant.pk):
        [off] = llm_calls_record(site=site, attempts=[attempt()])
        _record_bodies(world.tenant)
        [on] = llm_calls_record(site=site, attempts=[attempt()])
    assert not LLMCallBody.all_tenants.filter(llm_call=off).exists()
    body = LLMCallBody.all_tenants.get(llm_call=on)
    assert (body.request, json.loads(body.response)) == ('{"messages": []}', {"choices": []})


def test_tenant_settings_api_changes_the_opt_in_for_admins_only(world, other_world):
    admin, member = world.client(admin=True), world.client()
    assert member.get("/api/v1/admin/tenant/").status_code == 403
    assert member.patch("/api/v1/admin/tenant/", {"record_llm_bodies": True}, format="json").status_code == 403
    body = admin.get("/api/v1/admin/tenant/").json()
    assert body == {"id": world.tenant.pk, "name": world.tenant.name, "slug": world.tenant.slug,
                    "record_llm_bodies": False, "llm_body_retention_days": 7, "trace_content": False}
    changed = admin.patch("/api/v1/admin/tenant/", {"record_llm_bodies": True, "llm_body_retention_days": 14},
                          format="json")
    assert changed.status_code == 200, changed.content
    assert (changed.json()["record_llm_bodies"], changed.json()["llm_body_retention_days"]) == (True, 14)
    tenant = Tenant.objects.get(pk=world.tenant.pk)
    assert (tenant.record_llm_bodies, tenant.llm_body_retention_days) == (True, 14)
    event = AuditEvent.all_tenants.filter(tenant=world.tenant, action="update", object_type="tenants.tenant").get()
    assert event.changes["llm_body_retention_days"] == {"from": 7, "to": 14}
    for bad in ({"llm_body_retention_days": 0}, {"llm_body_retention_days": 91}, {"record_llm_bodies": "maybe"},
                {"trace_content": True}, {"name": "Renamed"}):
        response = admin.patch("/api/v1/admin/tenant/", bad, format="json")
        assert response.status_code == 400 and set(response.json()) == {"message", "extra"}, (bad, response.content)
    assert Tenant.objects.get(pk=world.tenant.pk).name == world.tenant.name
    # Another tenant is untouched, and its admin sees only their own.
    assert Tenant.objects.get(pk=other_world.tenant.pk).record_llm_bodies is False
    assert other_world.client(admin=True).get("/api/v1/admin/tenant/").json()["id"] == other_world.tenant.pk


def test_console_tenant_page_lets_a_tenant_admin_change_only_the_opt_in(world, other_world):
    client = _console(world.admin)
    url = reverse("admin:tenants_tenant_change", args=[world.tenant.pk])
    page = client.get(url)
    assert page.status_code == 200
    html = page.content.decode()
    assert 'name="record_llm_bodies"' in html and 'name="llm_body_retention_days"' in html
    assert 'name="monthly_budget_usd"' not in html and 'name="trace_content"' not in html
    response = client.post(url, {"record_llm_bodies": "on", "llm_body_retention_days": "3", "name": "Hacked"})
    assert response.status_code == 302, response.content.decode()[:2000]
    tenant = Tenant.objects.get(pk=world.tenant.pk)
    assert (tenant.record_llm_bodies, tenant.llm_body_retention_days, tenant.name) == (True, 3, world.tenant.name)
    assert client.post(url, {"llm_body_retention_days": "365"}).status_code == 200  # the form's error, no change
    assert Tenant.objects.get(pk=world.tenant.pk).llm_body_retention_days == 3
    # Another tenant's page: not theirs.
    other_url = reverse("admin:tenants_tenant_change", args=[other_world.tenant.pk])
    assert client.get(other_url).status_code in (302, 404)
    client.post(other_url, {"record_llm_bodies": "on", "llm_body_retention_days": "3"})
    assert Tenant.objects.get(pk=other_world.tenant.pk).record_llm_bodies is False
    assert client.get(reverse("admin:tenants_tenant_add")).status_code == 403


# --- traces: the bodies as the chat spans' content ------------------------------------------


@pytest.fixture
def spans():
    """The platform's spans of the test (tracing on with an in-memory exporter)."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from agent_platform import telemetry
    from sessions.runner import tracing

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    processor = SimpleSpanProcessor(exporter)
    provider.add_span_processor(processor)
    telemetry.enable(provider, processor)
    tracing._content_cache.clear()
    try:
        yield exporter
    finally:
        telemetry.disable()
        tracing._content_cache.clear()


def _chat_spans(world, fake_llm, spans, *, trace_content: bool, bodies: bool):
    Tenant.objects.filter(pk=world.tenant.pk).update(trace_content=trace_content, record_llm_bodies=bodies)
    agent = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], name="Spanner")
    bind_builtin(agent, "test_echo")
    fake_llm.script(ToolCalls([("test_echo", {"text": "hi"})]), Reply("Said hi."))
    run = post_message_sync(agent=agent, user=world.member, content="Say hi")
    asyncio.run(execute_run(run.pk))
    assert Run.all_tenants.get(pk=run.pk).status == "completed"
    return sorted((s for s in spans.get_finished_spans() if s.name.startswith("chat ")), key=lambda s: s.start_time)


def test_golden_chat_spans_carry_the_bodies_as_genai_messages(world, fake_llm, spans):
    asked, answered = _chat_spans(world, fake_llm, spans, trace_content=True, bodies=True)
    [request_1, request_2] = fake_llm.requests
    call_id = request_2["messages"][2]["tool_calls"][0]["id"]
    assert json.loads(asked.attributes["gen_ai.input.messages"]) == [
        {"role": "system", "parts": [{"type": "text", "content": "You are a test agent."}]},
        {"role": "user", "parts": [{"type": "text", "content": "Say hi"}]},
    ]
    assert json.loads(asked.attributes["gen_ai.output.messages"]) == [
        {"role": "assistant", "parts": [{"type": "tool_call", "id": call_id, "name": "test_echo",
                                          "arguments": {"text": "hi"}}], "finish_reason": "tool_call"},
    ]
    assert json.loads(answered.attributes["gen_ai.input.messages"])[2:] == [
        {"role": "assistant", "parts": [{"type": "tool_call", "id": call_id, "name": "test_echo",
                                          "arguments": {"text": "hi"}}]},
        {"role": "tool", "parts": [{"type": "tool_call_response", "id": call_id, "response": "echo: hi"}]},
    ]
    assert json.loads(answered.attributes["gen_ai.output.messages"]) == [
        {"role": "assistant", "parts": [{"type": "text", "content": "Said hi."}], "finish_reason": "stop"},
    ]
    assert request_1["messages"][1]["content"] == "Say hi"


@pytest.mark.parametrize(("trace_content", "bodies"), [(True, False), (False, True)])
def test_chat_spans_get_no_content_without_both_opt_ins(world, fake_llm, spans, trace_content, bodies):
    for span in _chat_spans(world, fake_llm, spans, trace_content=trace_content, bodies=bodies):
        assert "gen_ai.input.messages" not in span.attributes and "gen_ai.output.messages" not in span.attributes


def test_anthropic_bodies_as_genai_messages():
    from llm.genai_content import input_messages, output_messages

    request = {"model": "claude", "system": "Be brief.", "messages": [
        {"role": "user", "content": [{"type": "text", "text": "Look"}, {"type": "image", "source": {"data": "AAAA"}}]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "echo", "input": {"a": 1}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "done"}]},
    ]}
    assert input_messages(request) == [
        {"role": "system", "parts": [{"type": "text", "content": "Be brief."}]},
        {"role": "user", "parts": [{"type": "text", "content": "Look"}, {"type": "image"}]},
        {"role": "assistant", "parts": [{"type": "tool_call", "id": "t1", "name": "echo", "arguments": {"a": 1}}]},
        {"role": "user", "parts": [{"type": "tool_call_response", "id": "t1", "response": "done"}]},
    ]
    response = {"type": "message", "content": [{"type": "thinking", "thinking": "hm"}, {"type": "text", "text": "OK"}],
                "stop_reason": "end_turn"}
    assert output_messages(response) == [{"role": "assistant", "finish_reason": "stop", "parts": [
        {"type": "reasoning", "content": "hm"}, {"type": "text", "content": "OK"}]}]


def test_purging_a_chat_deletes_its_records_and_keeps_its_calls(world, fake_llm):
    from django.test import override_settings

    from sessions.chat_services import chat_sessions_purge
    from sessions.models import ChatSession

    _record_bodies(world.tenant)
    run = _run(world, fake_llm)
    ChatSession.all_tenants.filter(pk=run.session_id).update(deleted_at=timezone.now() - timedelta(days=31))
    assert LLMCallBody.all_tenants.count() == 3
    with override_settings(CHAT_PURGE_AFTER_DAYS=30):
        assert chat_sessions_purge() == 1
    assert not LLMCallBody.all_tenants.exists() and LLMCall.all_tenants.count() == 3
