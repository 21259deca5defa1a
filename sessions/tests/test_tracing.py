"""Golden spans of runs (OpenTelemetry GenAI conventions, agent_platform/telemetry.py and
sessions/runner/tracing.py), recorded with the SDK's InMemorySpanExporter: a run with a model
fallback and a tool call, a skill's sub-run, the tenant's content opt-in, and tracing off."""

from __future__ import annotations

import asyncio
import contextvars

import pytest
from channels.db import database_sync_to_async as sync_to_async
from opentelemetry import trace
from opentelemetry.propagate import inject
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from agent_platform import telemetry
from agents.tests.factories import agent_with_route, bind_builtin
from llm.testing import Fail, Reply, ToolCalls
from sessions.runner import tracing
from sessions.runner.loop import execute_run
from sessions.tests.conftest import post_message, reload_run
from sessions.tests.test_subruns import make_agent
from tenants.models import Tenant

runs = pytest.mark.django_db(transaction=True)


def _tracing_to_memory(provider):
    """Tracing on through ``provider`` to a new in-memory exporter: ``(exporter, provider)``."""
    exporter = InMemorySpanExporter()
    processor = SimpleSpanProcessor(exporter)
    provider.add_span_processor(processor)
    telemetry.enable(provider, processor)
    return exporter, provider


@pytest.fixture
def spans():
    """The platform's spans of the test, in end order (tracing on with an in-memory exporter)."""
    exporter, _ = _tracing_to_memory(TracerProvider())
    tracing._content_cache.clear()
    try:
        yield exporter
    finally:
        telemetry.disable()
        tracing._content_cache.clear()


def _by_name(finished):
    return {s.name: s for s in finished}


def _set_trace_content(tenant, on: bool):
    Tenant.objects.filter(pk=tenant.pk).update(trace_content=on)


@runs
@pytest.mark.usefixtures("all_tenants_scope", "no_enqueue")
async def test_a_run_with_a_fallback_and_a_tool_call(world, fake_llm, spans):
    agent = await sync_to_async(agent_with_route)(tenant=world.tenant, base_urls=[fake_llm.base_url] * 2,
                                                  name="Helper")
    await sync_to_async(bind_builtin)(agent, "test_echo")
    await sync_to_async(_set_trace_content)(world.tenant, True)
    fake_llm.script(Fail(503), ToolCalls([("test_echo", {"text": "hi"})]), Reply("All done."))
    run = await post_message(agent=agent, user=world.member, content="Say hi")
    await execute_run(run.pk)
    assert (await reload_run(run.pk)).status == "completed"

    finished = spans.get_finished_spans()
    names = [s.name for s in finished]
    [root] = [s for s in finished if s.name == "invoke_agent Helper"]
    chats = [s for s in finished if s.name.startswith("chat ")]
    [tool] = [s for s in finished if s.name == "execute_tool test_echo"]
    assert len(finished) == 5, names
    # One trace, everything under invoke_agent.
    assert root.parent is None
    assert {s.context.trace_id for s in finished} == {root.context.trace_id}
    assert all(s.parent.span_id == root.context.span_id for s in [*chats, tool])
    assert all(s.attributes["tenant.id"] == world.tenant.pk for s in finished)

    assert dict(root.attributes) == {
        "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "Helper", "gen_ai.agent.id": str(agent.pk),
        "gen_ai.conversation.id": str(run.session_id), "gen_ai.provider.name": "openai",
        "gen_ai.request.model": "model-0", "tenant.id": world.tenant.pk, "agent_platform.run.id": run.pk,
        "agent_platform.run.depth": 0, "agent_platform.run.status": "completed",
        "gen_ai.input.messages": '[{"role": "user", "parts": [{"type": "text", "content": "Say hi"}]}]',
        "gen_ai.output.messages": '[{"role": "assistant", "parts": [{"type": "text", "content": "All done."}]}]',
    }
    # The fallback: the first attempt failed on entry 0, the second answered on entry 1.
    failed, answered, last = sorted(chats, key=lambda s: s.start_time)
    assert failed.name == "chat model-0" and failed.attributes["error.type"] == "overloaded"
    assert failed.status.status_code == trace.StatusCode.ERROR
    assert (failed.attributes["agent_platform.model.attempt"], answered.attributes["agent_platform.model.attempt"]) == (1, 2)
    assert answered.name == "chat model-1" and "error.type" not in answered.attributes
    assert answered.attributes["gen_ai.response.finish_reasons"] == ("tool_calls",)
    assert answered.attributes["gen_ai.operation.name"] == "chat"
    assert answered.attributes["gen_ai.provider.name"] == "openai"
    assert answered.attributes["gen_ai.request.model"] == "model-1"
    assert answered.attributes["gen_ai.usage.input_tokens"] > 0 and answered.attributes["gen_ai.usage.output_tokens"] > 0
    assert answered.attributes["gen_ai.conversation.id"] == str(run.session_id)
    assert answered.kind == trace.SpanKind.CLIENT and answered.start_time <= answered.end_time
    assert last.attributes["gen_ai.response.finish_reasons"] == ("stop",)
    # The tool call, with its arguments and result (the tenant opted in to content).
    assert tool.attributes["gen_ai.operation.name"] == "execute_tool"
    assert tool.attributes["gen_ai.tool.name"] == "test_echo"
    assert tool.attributes["gen_ai.tool.call.arguments"] == '{"text": "hi"}'
    assert tool.attributes["gen_ai.tool.call.result"] == "echo: hi"
    assert answered.end_time <= tool.start_time <= tool.end_time <= last.start_time


@runs
@pytest.mark.usefixtures("all_tenants_scope", "no_enqueue")
async def test_a_sub_run_is_a_child_of_its_tool_call_and_content_stays_off_by_default(world, fake_llm, spans):
    agent = await make_agent(world, fake_llm.base_url, builtins=["test_echo"], skills=[("researcher", ["test_e*"], {})],
                             name="Lead")
    fake_llm.script(
        ToolCalls([("researcher", {"task": "Find out about X"})]),
        Reply("X is a letter."),  # the sub-run
        Reply("The skill says: X is a letter."),
    )
    run = await post_message(agent=agent, user=world.member, content="Tell me about X")
    await execute_run(run.pk)
    assert (await reload_run(run.pk)).status == "completed"

    finished = spans.get_finished_spans()
    [root] = [s for s in finished if s.parent is None]
    assert root.name == "invoke_agent Lead"
    [skill_call] = [s for s in finished if s.name == "execute_tool researcher"]
    [sub] = [s for s in finished if s.name.startswith("invoke_agent ") and s is not root]
    assert skill_call.parent.span_id == root.context.span_id
    assert sub.parent.span_id == skill_call.context.span_id
    assert sub.attributes["agent_platform.run.depth"] == 1 and sub.attributes["agent_platform.run.status"] == "completed"
    [sub_chat] = [s for s in finished if s.name.startswith("chat ") and s.parent.span_id == sub.context.span_id]
    assert sub_chat.attributes["gen_ai.response.finish_reasons"] == ("stop",)
    assert len([s for s in finished if s.name.startswith("chat ")]) == 3
    assert all(s.attributes["tenant.id"] == world.tenant.pk for s in finished)
    assert {s.context.trace_id for s in finished} == {root.context.trace_id}
    # No content unless the tenant opts in.
    content_keys = {"gen_ai.input.messages", "gen_ai.output.messages", "gen_ai.tool.call.arguments",
                    "gen_ai.tool.call.result"}
    assert not any(content_keys & set(s.attributes) for s in finished)


@runs
@pytest.mark.usefixtures("all_tenants_scope", "no_enqueue")
async def test_a_failed_run_sets_error_type_to_its_reason(world, fake_llm, spans):
    agent = await sync_to_async(agent_with_route)(tenant=world.tenant, base_urls=[fake_llm.base_url], name="Solo")
    fake_llm.script(Fail(503))
    run = await post_message(agent=agent, user=world.member, content="Hello")
    await execute_run(run.pk)
    assert (await reload_run(run.pk)).status == "failed"
    finished = spans.get_finished_spans()
    [root] = [s for s in finished if s.name == "invoke_agent Solo"]
    assert root.attributes["error.type"] == "model_unavailable"
    assert root.status.status_code == trace.StatusCode.ERROR


@runs
@pytest.mark.usefixtures("all_tenants_scope", "no_enqueue")
async def test_tracing_off_makes_no_span(world, fake_llm):
    """Off, the run path asks for no tracer (``telemetry.tracer()`` raises then: a span made
    anyway would end the run failed ``internal``) and adds no wrapper around the loop."""
    assert not telemetry.TRACING
    agent = await sync_to_async(agent_with_route)(tenant=world.tenant, base_urls=[fake_llm.base_url], name="Quiet")
    fake_llm.script(Reply("Hi."))

    async def loop():
        return "outcome"

    coro = loop()
    assert tracing.run_traced(None, coro) is coro  # the loop's coroutine itself: no wrapper, no span
    await coro
    run = await post_message(agent=agent, user=world.member, content="Hello")
    await execute_run(run.pk)
    assert (await reload_run(run.pk)).status == "completed"


async def test_a_pooled_mcp_call_carries_its_callers_traceparent(spans):
    """The MCP pool's owner task (a fresh context) runs each call in its caller's trace context,
    so the mcp SDK's injection into ``_meta`` names the caller's span."""
    seen = {}

    async def job():
        inject(seen)  # what the SDK does for a request's _meta

    with telemetry.tracer().start_as_current_span("execute_tool remote") as span:
        wrapped = telemetry.in_caller_trace(job)
    owner = asyncio.get_running_loop().create_task(wrapped(), context=contextvars.Context())
    await owner
    assert seen["traceparent"].split("-")[2] == format(span.get_span_context().span_id, "016x")
    # Without the wrapper the owner's fresh context has no span: nothing would be injected.
    bare = {}

    async def bare_job():
        inject(bare)

    await asyncio.get_running_loop().create_task(bare_job(), context=contextvars.Context())
    assert "traceparent" not in bare


def test_a_span_started_before_its_tenant_was_known_gets_it(spans):
    """An HTTP request's or a Celery task's span starts before the request or task knows its
    tenant: entering the tenant's scope stamps it (tenants/context.py)."""
    from tenants.context import enter_tenant, reset_scope, tenant_scope

    with telemetry.tracer().start_as_current_span("POST /api/v1/sessions/") as request_span:
        token = enter_tenant(7)
        reset_scope(token)
    with telemetry.tracer().start_as_current_span("run/sessions.run_execute") as task_span, tenant_scope(8):
        pass
    assert request_span.attributes["tenant.id"] == 7 and task_span.attributes["tenant.id"] == 8


def test_with_an_endpoint_the_processes_trace_and_a_task_message_carries_the_context():
    """``configure()`` with OTEL_EXPORTER_OTLP_ENDPOINT installs the SDK and the instrumentations
    (a fresh process: they patch libraries for good; psycopg's and redis's only with
    ``TRACING_STATEMENT_SPANS``); a Celery task published under a span (the
    HTTP request's) carries its trace context in the message headers, which the worker's task
    span continues; without the variable (or with OTEL_SDK_DISABLED) nothing is configured."""
    import os
    import subprocess
    import sys

    script = """
import django, os
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "agent_platform.settings_test")
django.setup()
from agent_platform import telemetry
from tenants.context import current_tenant_id
on = telemetry.configure(service_name="t", tenant_of=current_tenant_id)
print("configured", on, telemetry.TRACING)
if on:
    from celery.signals import before_task_publish
    from opentelemetry import trace
    from sessions.tasks import run_execute
    headers = {"id": "4f7c0b52-task", "task": run_execute.name}  # a protocol-2 message's headers
    with trace.get_tracer("t").start_as_current_span("POST /api/v1/messages") as span:
        before_task_publish.send(sender=run_execute.name, body=((1,), {}, {}), exchange="", routing_key="q",
                                 headers=headers, properties={}, declare=[], retry_policy=None)
    print("trace", format(span.get_span_context().trace_id, "032x"), headers.get("traceparent", "none"))
    from opentelemetry.instrumentation.django import DjangoInstrumentor
    from opentelemetry.instrumentation.psycopg import PsycopgInstrumentor
    print("instrumented", DjangoInstrumentor().is_instrumented_by_opentelemetry,
          PsycopgInstrumentor().is_instrumented_by_opentelemetry, flush=True)
    telemetry.instrument_libraries(statement_spans=True)  # TRACING_STATEMENT_SPANS=1
    print("statements", PsycopgInstrumentor().is_instrumented_by_opentelemetry, flush=True)
os._exit(0)  # no exit-time flush to the (absent) receiver
"""
    base = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    assert not telemetry.endpoint_configured(base)  # then configure() returns at once: nothing installed
    assert not telemetry.endpoint_configured(base | {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4318",
                                                     "OTEL_SDK_DISABLED": "true"})
    assert telemetry.endpoint_configured(base | {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://x:4318/v1/traces"})
    env = base | {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9", "OTEL_EXPORTER_OTLP_TIMEOUT": "1",
                  "OTEL_BSP_SCHEDULE_DELAY": "60000"}
    on = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert "configured True True" in on.stdout, on.stderr[-2000:]
    [trace_line] = [line for line in on.stdout.splitlines() if line.startswith("trace ")]
    _, trace_id, traceparent = trace_line.split()
    assert traceparent.split("-")[1] == trace_id  # the message continues the request's trace
    # SQL and Redis spans (seven a turn, ~20 % of its CPU) only with TRACING_STATEMENT_SPANS.
    assert "instrumented True False" in on.stdout
    assert "statements True" in on.stdout


def test_the_tenant_stamp_keeps_a_span_s_own_tenant_and_stamps_the_others():
    """``TenantSpanProcessor`` (installed by ``configure()``): a library span starting in a
    tenant's scope gets the scope's tenant; a platform span, started with its run's
    ``tenant.id``, is left as it is (no second ``set_attribute``: its own id is kept)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(telemetry.TenantSpanProcessor(lambda: 9))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("t")
    tracer.start_span("SELECT").end()
    tracer.start_span("chat m", attributes={"tenant.id": 5, "gen_ai.operation.name": "chat"}).end()
    library, platform = exporter.get_finished_spans()
    assert library.attributes["tenant.id"] == 9
    assert dict(platform.attributes) == {"tenant.id": 5, "gen_ai.operation.name": "chat"}
    assert list(platform.attributes) == ["tenant.id", "gen_ai.operation.name"]


def test_a_platform_span_follows_the_provider_s_sampler_and_its_parent():
    """``start_platform_span`` (the ``chat`` and ``execute_tool`` spans, made without the SDK's
    live span) decides as ``Tracer.start_span`` does: the provider's sampler, the parent's trace
    id and sampled flag, an unsampled span exported by nothing but still the current span of
    its children (which are then unsampled too)."""
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ParentBased, TraceIdRatioBased

    for sampler, exported in ((None, True), (ParentBased(ALWAYS_OFF), False), (TraceIdRatioBased(0.0), False)):
        exporter, provider = _tracing_to_memory(TracerProvider(sampler=sampler) if sampler else TracerProvider())
        try:
            with telemetry.tracer().start_as_current_span("invoke_agent a") as root:
                span = telemetry.start_platform_span("execute_tool t", trace.SpanKind.INTERNAL, {"tenant.id": 3})
                token = telemetry.attach_span(span)
                with telemetry.tracer().start_as_current_span("invoke_agent sub") as child:
                    carrier = {}
                    inject(carrier)
                telemetry.detach(token)
                span.set_status(trace.StatusCode.ERROR, "boom")
                span.end()
            assert trace.get_current_span() is trace.INVALID_SPAN  # detached
        finally:
            telemetry.disable()
        finished = {s.name: s for s in exporter.get_finished_spans()}
        assert carrier.get("traceparent", "").split("-")[1:3] == [
            format(root.get_span_context().trace_id, "032x"), format(child.get_span_context().span_id, "016x")]
        assert span.context.trace_id == root.get_span_context().trace_id
        assert span.context.trace_flags.sampled is exported
        assert child.get_span_context().trace_flags.sampled is exported
        if not exported:
            assert finished == {}
            continue
        tool = finished["execute_tool t"]
        assert tool.parent.span_id == root.get_span_context().span_id
        assert finished["invoke_agent sub"].parent.span_id == span.context.span_id
        assert tool.kind is trace.SpanKind.INTERNAL and dict(tool.attributes) == {"tenant.id": 3}
        assert tool.status.status_code is trace.StatusCode.ERROR and tool.status.description == "boom"
        assert tool.instrumentation_scope.name == "agent_platform"
        assert tool.instrumentation_scope.schema_url == telemetry.SCHEMA_URL
        assert tool.resource is provider.resource
        assert tool.start_time <= tool.end_time
        assert list(finished) == ["invoke_agent sub", "execute_tool t", "invoke_agent a"]


def test_a_platform_span_applies_the_attribute_value_length_limit(monkeypatch):
    """``OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT`` cuts a platform span's string values as the SDK
    cuts its own spans'; a root platform span starts a trace of its own."""
    monkeypatch.setenv("OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT", "5")
    exporter, _ = _tracing_to_memory(TracerProvider())
    try:
        span = telemetry.start_platform_span("chat m", trace.SpanKind.CLIENT, {"gen_ai.input.messages": "abcdefgh",
                                                                             "gen_ai.usage.input_tokens": 123456789,
                                                                             "reasons": ("stop",)}, start_time=1000)
        span.end(end_time=2000)
    finally:
        telemetry.disable()
    [chat] = exporter.get_finished_spans()
    assert dict(chat.attributes) == {"gen_ai.input.messages": "abcde", "gen_ai.usage.input_tokens": 123456789,
                                     "reasons": ("stop",)}
    assert chat.parent is None and chat.context.trace_id != 0
    assert (chat.start_time, chat.end_time) == (1000, 2000)
    # The OTLP exporter encodes it as it encodes the SDK's spans.
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    [resource_spans] = encode_spans([chat]).resource_spans
    [encoded] = resource_spans.scope_spans[0].spans
    assert resource_spans.scope_spans[0].scope.name == "agent_platform"
    assert encoded.name == "chat m" and encoded.kind == 3  # SPAN_KIND_CLIENT
    assert encoded.trace_id == chat.context.trace_id.to_bytes(16, "big")
    assert {a.key: a.value for a in encoded.attributes}["gen_ai.input.messages"].string_value == "abcde"
    with pytest.raises(RuntimeError, match="tracing is off"):
        telemetry.start_platform_span("chat m", trace.SpanKind.CLIENT, {})


@pytest.mark.parametrize("raised, attribute", [
    (ValueError("bug below"), ("agent_platform.tool_call.raised", "ValueError")),
    (asyncio.CancelledError(), ("error.type", "cancelled")),
])
async def test_a_tool_call_that_raises_still_ends_its_span_and_restores_the_context(spans, raised, attribute):
    """An ``execute_tool`` span whose call raises (a pause for a human, a cancellation, a bug)
    is ended and exported with what happened, and the caller's current span is current again."""
    from types import SimpleNamespace

    class Raising:
        async def call_tool(self, call):
            assert trace.get_current_span().get_span_context().span_id != outer.get_span_context().span_id
            raise raised

    tracing._content_cache[4] = (float("inf"), False)
    call = SimpleNamespace(name="lookup", origin=None, arguments={"q": "x"},
                           context=SimpleNamespace(tool_call_id=11, tenant_id=4, run_id=5, session_id=6))
    with telemetry.tracer().start_as_current_span("invoke_agent a") as outer:
        with pytest.raises(type(raised)):
            await tracing.TracingToolset(Raising()).call_tool(call)
        assert trace.get_current_span() is outer
    tool = _by_name(spans.get_finished_spans())["execute_tool lookup"]
    assert tool.parent.span_id == outer.get_span_context().span_id
    assert tool.attributes[attribute[0]] == attribute[1]
    assert tool.attributes["tenant.id"] == 4 and tool.attributes["gen_ai.tool.call.id"] == "11"
    assert tool.end_time >= tool.start_time
