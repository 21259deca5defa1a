"""The run lifecycle's and the runner's hand-written SQL (sessions/runs/statements.py,
sessions/runner/database.py) against the models they write.

The hot writes (a message per turn and per tool result, an LLM call per turn, tool call
inserts and updates) and the history read are plain SQL for their CPU cost, run on the
loop's async psycopg pool (sessions/runner/pg.py; each ``asyncio.run`` here opens and closes
one). These tests fail when a
model gains a column those INSERTs do not write, and check the rows they write through the
ORM, tenant scope included.
"""

from __future__ import annotations

import asyncio

import pytest

from llm.records import AttemptRecord
from llm.types import ChatMessage, ToolCallRequest
from sessions import runs
from sessions.models import LLMCall, LLMCallBody, Message, Run, ToolCall
from sessions.runner import database
from sessions.runs import claim, ending, statements
from sessions.tests.conftest import post_message_sync
from tenants.scoping import tenant_scope

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("no_enqueue"),
    pytest.mark.usefixtures("all_tenants_scope"),
]


def claim_sync(run_id: int):
    """The claim's transaction and the configuration load, as :func:`sessions.runs.run_claim`
    makes them on its thread (without its event)."""
    return database._spec(claim._claim(run_id))


def _columns(model) -> set[str]:
    return {f.column for f in model._meta.concrete_fields} - {"id"}


def test_the_inserts_write_every_column_of_their_models() -> None:
    assert set(statements.MESSAGE_COLUMNS) == _columns(Message)
    assert set(statements.LLM_CALL_COLUMNS) == _columns(LLMCall)
    assert set(statements.TOOL_CALL_COLUMNS) == _columns(ToolCall)
    assert set(statements.LLM_CALL_BODY_COLUMNS) == _columns(LLMCallBody)


def _claimed(world, fake_llm_url: str):
    from agents.tests.factories import agent_with_route

    agent = agent_with_route(tenant=world.tenant, base_urls=[fake_llm_url])
    run = post_message_sync(agent=agent, user=world.member, content="hi")
    with tenant_scope(world.tenant.pk):
        return claim_sync(run.pk)


def test_a_turn_with_tool_calls_writes_what_the_orm_reads_back(world, other_world, fake_llm) -> None:
    spec = _claimed(world, fake_llm.base_url)
    record = AttemptRecord(
        entry_index=0, attempt=1, provider_name="local", model="m", status="succeeded", error_class=None, error="",
        latency_ms=12, first_token_ms=3, prompt_tokens=7, completion_tokens=5, usage_estimated=False,
        cost_usd_micros=9, retry_wait_ms=0,
    )
    message = ChatMessage(role="assistant", content="Let me look.", tool_calls=(
        ToolCallRequest(id="c1", name="echo", arguments='{"text": "ä"}'),
        ToolCallRequest(id="c2", name="echo", arguments="not json"),
    ))
    published: list[tuple[str, dict]] = []

    async def publish(event_type: str, data: dict) -> None:
        published.append((event_type, data))

    with tenant_scope(world.tenant.pk):
        calls = asyncio.run(runs.assistant_message_save(spec=spec, turn=0, message=message, reasoning="thinking", llm_call=record))
        asyncio.run(runs.tool_call_start(pk=calls[0]["pk"], name="echo", arguments={"text": "ä"}, publish=publish))
        assert asyncio.run(runs.tool_call_finish(spec=spec, pk=calls[0]["pk"], name="echo", status="succeeded",
                                                content="ä", data={"n": 1}, error="", duration_ms=4, publish=publish))
        assert not asyncio.run(runs.tool_call_finish(spec=spec, pk=calls[0]["pk"], name="echo", status="failed",
                                                    content="", data=None, error="late", duration_ms=1,
                                                    publish=publish)), "recorded once"
    with tenant_scope(other_world.tenant.pk):
        assert not asyncio.run(runs.tool_call_finish(spec=spec, pk=calls[1]["pk"], name="echo", status="succeeded",
                                                    content="no", data=None, error="", duration_ms=1,
                                                    publish=publish)), "another tenant's call"
    with tenant_scope(world.tenant.pk):
        assert asyncio.run(runs.tool_call_finish(spec=spec, pk=calls[1]["pk"], name="echo", status="failed",
                                                content="", data=None, error="bad arguments", duration_ms=1,
                                                publish=publish))
        history = asyncio.run(database.history_load(spec.run_id, session_id=spec.session_id, subrun=False))

    rows = list(Message.all_tenants.filter(run_id=spec.run_id).order_by("position"))
    assert [(m.role, m.content, m.tenant_id) for m in rows] == [
        ("user", "hi", world.tenant.pk), ("assistant", "Let me look.", world.tenant.pk),
        ("tool", "ä", world.tenant.pk), ("tool", "Error: bad arguments", world.tenant.pk),
    ]
    assert [m.position for m in rows] == sorted({m.position for m in rows}), "positions are distinct and ordered"
    assert rows[1].tool_calls == [{"id": "c1", "name": "echo", "arguments": '{"text": "ä"}'},
                                  {"id": "c2", "name": "echo", "arguments": "not json"}]
    assert rows[1].reasoning == "thinking" and rows[2].tool_call_id == "c1" and rows[2].name == "echo"
    assert rows[3].tool_call_id == "c2" and rows[3].name == "echo"

    first, second = ToolCall.all_tenants.filter(run_id=spec.run_id).order_by("id")
    assert (first.status, first.result, first.result_data, first.duration_ms) == ("succeeded", "ä", {"n": 1}, 4)
    assert first.started_at is not None and first.finished_at is not None
    assert (first.call_id, first.name, first.arguments, first.arguments_raw, first.turn, first.tenant_id) == (
        "c1", "echo", {"text": "ä"}, '{"text": "ä"}', 0, world.tenant.pk)
    assert [c["pk"] for c in calls] == [first.pk, second.pk], "returned in the model's order"
    assert (second.call_id, second.arguments, second.arguments_raw) == ("c2", {}, "not json")
    assert (second.status, second.result_data, second.error) == ("failed", None, "bad arguments")
    # each write published its event; the refused ones (recorded before, another tenant's) nothing
    assert [(t, d["tool_call_id"]) for t, d in published] == [
        ("tool_call_started", first.pk), ("tool_call_succeeded", first.pk), ("tool_call_failed", second.pk)]

    llm_call = LLMCall.all_tenants.get(run_id=spec.run_id)
    assert (llm_call.tenant_id, llm_call.turn, llm_call.prompt_tokens, llm_call.first_token_ms, llm_call.cost_usd_micros) == (
        world.tenant.pk, 0, 7, 3, 9)
    run = Run.all_tenants.get(pk=spec.run_id)
    assert (run.loop_count, run.prompt_tokens, run.completion_tokens, run.cost_usd_micros) == (1, 7, 5, 9)

    assert [(m.role, m.content) for m in history.messages] == [
        ("user", "hi"), ("assistant", "Let me look."), ("tool", "ä"), ("tool", "Error: bad arguments")]
    assert history.messages[1].tool_calls[1] == ToolCallRequest(id="c2", name="echo", arguments="not json")


def test_writes_and_reads_stay_inside_the_current_tenant(world, other_world, fake_llm) -> None:
    spec = _claimed(world, fake_llm.base_url)
    message = ChatMessage(role="assistant", content="x")
    record = AttemptRecord(
        entry_index=0, attempt=1, provider_name="local", model="m", status="succeeded", error_class=None, error="",
        latency_ms=12, first_token_ms=None, prompt_tokens=7, completion_tokens=5, usage_estimated=False,
        cost_usd_micros=9, retry_wait_ms=0,
    )
    with_call = ChatMessage(role="assistant", content="x", tool_calls=(ToolCallRequest(id="c1", name="echo", arguments="{}"),))
    with tenant_scope(other_world.tenant.pk):
        with pytest.raises(Exception, match="not found"):
            asyncio.run(runs.assistant_message_save(spec=spec, turn=0, message=message))
        with pytest.raises(Exception, match="not found"):
            asyncio.run(runs.assistant_message_save(spec=spec, turn=0, message=with_call, llm_call=record))
    assert not ToolCall.all_tenants.filter(run_id=spec.run_id).exists(), "no tool call written for another tenant's run"
    assert not LLMCall.all_tenants.filter(run_id=spec.run_id).exists()
    assert Run.all_tenants.get(pk=spec.run_id).prompt_tokens == 0 and Run.all_tenants.get(pk=spec.run_id).loop_count == 0
    with tenant_scope(other_world.tenant.pk):
        assert asyncio.run(database.history_load(spec.run_id, session_id=spec.session_id, subrun=False)).messages == []
        with pytest.raises(Run.DoesNotExist):
            asyncio.run(database.history_load(spec.run_id))  # the run itself is looked up in this tenant
        with pytest.raises(Run.DoesNotExist):
            asyncio.run(database.run_usage(spec.run_id))
    with tenant_scope(world.tenant.pk):
        assert [m.content for m in asyncio.run(database.history_load(spec.run_id)).messages] == ["hi"]
        assert asyncio.run(database.run_usage(spec.run_id)).tokens == 0
    assert Message.all_tenants.filter(run_id=spec.run_id).count() == 1  # the user's message only


def _finish_on_a_thread(spec, **ended):
    return runs.run_end(**ended, may_have_steered=False, may_have_subruns=False)


def _finish_on_the_loop(spec, **ended):
    return asyncio.run(ending._run_end_pipelined(**ended, session_id=spec.session_id))


@pytest.mark.parametrize("finish", [_finish_on_a_thread, _finish_on_the_loop], ids=["run_end", "run_end_pipelined"])
def test_run_finish_ends_the_run_its_open_calls_and_hands_on_the_next_queued_run(
    world, other_world, fake_llm, finish,
) -> None:
    from sessions.models import Approval, ChatSession

    spec = _claimed(world, fake_llm.base_url)
    message = ChatMessage(role="assistant", content="", tool_calls=(ToolCallRequest(id="c1", name="echo", arguments="{}"),))
    with tenant_scope(world.tenant.pk):
        [call] = asyncio.run(runs.assistant_message_save(spec=spec, turn=0, message=message))
        approval_id = runs.approval_request(spec=spec, call_pk=call["pk"], kind="approval", tool_name="echo", arguments={})
    session = ChatSession.all_tenants.get(pk=spec.session_id)
    agent = session.agent
    queued = post_message_sync(agent=agent, user=world.member, content="next", session=session)

    with tenant_scope(other_world.tenant.pk), pytest.raises(Run.DoesNotExist):
        finish(spec, run_id=spec.run_id, status="failed", error="x", reason="model_error")
    assert Run.all_tenants.get(pk=spec.run_id).status == "running", "another tenant changed nothing"

    with tenant_scope(world.tenant.pk):
        finished = finish(spec, run_id=spec.run_id, status="failed", error="boom", reason="model_error")
    assert finished.to_start == [queued.pk] and finished.steered == []
    run = Run.all_tenants.get(pk=spec.run_id)
    assert (run.status, run.error, run.reason, run.heartbeat_at) == ("failed", "boom", "model_error", None)
    assert run.finished_at is not None
    call = ToolCall.all_tenants.get(run_id=spec.run_id)
    assert call.status == "cancelled" and call.finished_at == run.finished_at
    assert Approval.all_tenants.get(pk=approval_id).status == "expired"


def test_a_claim_in_another_tenants_scope_finds_no_run(world, other_world, fake_llm) -> None:
    from agents.tests.factories import agent_with_route

    agent = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url])
    run = post_message_sync(agent=agent, user=world.member, content="hi")
    with tenant_scope(other_world.tenant.pk), pytest.raises(runs.RunNotClaimable, match="not found"):
        claim_sync(run.pk)
    assert Run.all_tenants.get(pk=run.pk).status == "queued"
    with tenant_scope(world.tenant.pk):
        spec = claim_sync(run.pk)
    claimed = Run.all_tenants.get(pk=run.pk)
    assert (claimed.status, claimed.attempt, spec.attempt, spec.agent_name) == ("running", 1, 1, agent.name)
    assert claimed.started_at is not None and claimed.heartbeat_at == claimed.started_at


def test_a_runs_configuration_is_read_inside_its_tenant_in_route_order(world, other_world, fake_llm) -> None:
    """``_spec_rows`` (hand-written SQL): entries in route position order with their providers,
    enabled bindings only, and nothing of another tenant even when its rows name this agent."""
    import dataclasses

    from agents.models import AgentInstance, CapabilityBinding
    from agents.tests.factories import agent_with_route, bind_builtin
    from llm.models import ModelRouteEntry

    agent = agent_with_route(tenant=world.tenant, base_urls=["http://127.0.0.1:1/v1", "http://127.0.0.1:2/v1"])
    ModelRouteEntry.all_tenants.filter(route=agent.route, position=0).update(position=5)  # p0 now comes last
    bind_builtin(agent, "test_echo")
    bind_builtin(agent, "get_current_time", enabled=False)
    stray = CapabilityBinding.all_tenants.create(tenant=other_world.tenant, agent=agent, kind="builtin",
                                                 builtin_name="web_fetch")
    run = post_message_sync(agent=agent, user=world.member, content="hi")
    with tenant_scope(world.tenant.pk):
        spec = claim_sync(run.pk)
        claimed = database.ClaimedRun.of(Run.all_tenants.select_related("session").get(pk=run.pk))
    assert [e.base_url for e in spec.entries] == ["http://127.0.0.1:2/v1", "http://127.0.0.1:1/v1"]
    assert [e.provider_name for e in spec.entries] == [f"p1-{agent.route_id}", f"p0-{agent.route_id}"]
    assert [b.name for b in spec.bindings_of("builtin")] == ["test_echo"]
    assert stray.pk not in {b.binding_id for b in spec.bindings_of("builtin")}

    with pytest.raises(AgentInstance.DoesNotExist):
        database._spec_rows(dataclasses.replace(claimed, tenant_id=other_world.tenant.pk))

    from agents.tests.factories import ProviderFactory

    foreign = ProviderFactory(tenant=other_world.tenant, name="foreign", base_url="http://127.0.0.1:3/v1")
    ModelRouteEntry.all_tenants.filter(route=agent.route, position=1).update(provider=foreign)
    with pytest.raises(ValueError, match="not in the run's tenant"):
        database._spec_rows(claimed)


def test_the_configuration_read_makes_the_same_instances_as_the_orm(world, fake_llm) -> None:
    """``_spec_rows`` turns its pipelined rows into instances itself (field converters, then
    ``Model.from_db``): every column of every instance must equal what the ORM loads,
    JSON, decimals, timestamps and encrypted secrets included."""
    import dataclasses
    from decimal import Decimal

    from agents.models import AgentInstance, CapabilityBinding
    from agents.tests.factories import agent_with_route, bind_builtin
    from llm.models import ModelProvider, ModelRouteEntry
    from tenants.models import Tenant

    agent = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url, "http://127.0.0.1:1/v1"],
                             max_cost_per_run_usd=Decimal("0.25"))
    Tenant.objects.filter(pk=world.tenant.pk).update(monthly_budget_usd=Decimal("12.50"))
    bind_builtin(agent, "test_echo", config={"nested": {"n": 1}}, approval_policy=[{"pattern": "*", "action": "ask"}])
    run = post_message_sync(agent=agent, user=world.member, content="hi")
    claimed = database.ClaimedRun.of(Run.all_tenants.select_related("session").get(pk=run.pk))
    with tenant_scope(world.tenant.pk):
        agent_row, tenant, entries, bindings, _guardrails = database._spec_rows(dataclasses.replace(claimed))
        expected = [
            (agent_row, AgentInstance.all_tenants.get(pk=agent.pk)),
            (tenant, Tenant.objects.get(pk=world.tenant.pk)),
            *[(e, ModelRouteEntry.all_tenants.get(pk=e.pk)) for e in entries],
            *[(e.provider, ModelProvider.all_tenants.get(pk=e.provider_id)) for e in entries],
            *[(b, CapabilityBinding.all_tenants.get(pk=b.pk)) for b in bindings],
        ]
    assert len(entries) == 2 and len(bindings) == 1
    for loaded, orm in expected:
        for f in type(orm)._meta.concrete_fields:
            assert getattr(loaded, f.attname) == getattr(orm, f.attname), (type(orm).__name__, f.attname)
        assert loaded._state.adding is False and loaded._state.db == "default"
    assert bindings[0].config == {"nested": {"n": 1}} and bindings[0].approval_policy[0]["action"] == "ask"
    assert agent_row.max_cost_per_run_usd == Decimal("0.25") and tenant.monthly_budget_usd == Decimal("12.50")


def test_the_configuration_read_survives_a_column_added_while_its_statements_are_prepared(world, fake_llm) -> None:
    """A migration that adds a column while a worker of the previous release runs: the
    worker's prepared statements must not break (PostgreSQL refuses a prepared ``SELECT *``
    whose result columns changed: "cached plan must not change result type")."""
    from django.db import connection

    from agents.tests.factories import agent_with_route

    agent = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url])
    run = post_message_sync(agent=agent, user=world.member, content="hi")
    claimed = database.ClaimedRun.of(Run.all_tenants.select_related("session").get(pk=run.pk))
    with tenant_scope(world.tenant.pk):
        for _ in range(6):  # prepared from the 5th run on this connection
            database._spec_rows(claimed)
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE %s", ['%"agents_agentinstance"%'])
        assert cursor.fetchone()[0] >= 1, "the read was not prepared: this test would prove nothing"
    tables = ["agents_agentinstance", "tenants_tenant", "llm_modelrouteentry", "llm_modelprovider",
              "agents_capabilitybinding"]
    _ddl(connection, [f'ALTER TABLE "{t}" ADD COLUMN "added_by_a_migration" integer' for t in tables])
    try:
        with tenant_scope(world.tenant.pk):
            agent_row, tenant, entries, bindings, _guardrails = database._spec_rows(claimed)
        assert agent_row.pk == agent.pk and tenant.pk == world.tenant.pk and len(entries) == 1
    finally:
        _ddl(connection, [f'ALTER TABLE "{t}" DROP COLUMN "added_by_a_migration"' for t in tables])


def _ddl(connection, statements: list[str]) -> None:
    """Run ``statements`` on a connection of their own, as a migration would (psycopg forgets a
    connection's prepared statements when that connection itself runs DDL)."""
    import psycopg

    from tenants import rls

    with rls.owner_mode():  # the owner's login (DDL): ``connection`` is django.db.connection
        params = connection.get_connection_params()
    keys = ("dbname", "user", "password", "host", "port")
    with psycopg.connect(**{k: params[k] for k in keys if params.get(k)}, autocommit=True) as other:
        for statement in statements:
            other.execute(statement)
