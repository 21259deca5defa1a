"""Every model call is an LLM call (issue 26): chat titles, memory extraction, a knowledge
search's rerank (API) and a run's query rewrite and rerank write LLMCall rows of their purpose,
for their agent and user, fallback attempts included; the tenant's monthly budget counts them
and refuses them once spent (the run they serve unaffected); the usage API shows them by
purpose, agent and user; a purge of deleted chats keeps every LLM call, so a month's totals do
not change; another tenant never sees them.

Against the scripted model servers (``fake_llm``, ``second_fake_llm``); the in-run test also
against the real embedded embedder (``embedding_server``).
"""

from __future__ import annotations

import json
from datetime import timedelta
from decimal import Decimal

import pytest
from asgiref.sync import async_to_sync
from django.utils import timezone

from agents.models import CapabilityBinding
from agents.tests.factories import agent_with_route, bind_builtin
from llm.metering import CallSite, LLMCallPurpose
from llm.models import ModelRouteEntry
from llm.records import AttemptRecord
from llm.testing import Fail, Reply, ToolCalls
from memory.services import memory_extract_session
from memory.tests.factories import memory_binding
from sessions import tasks
from sessions.chat_services import chat_title_from
from sessions.llm_calls import llm_calls_record
from sessions.models import ChatSession, LLMCall, Message, Run
from sessions.runner.loop import execute_run
from sessions.selectors import tenant_month_cost_usd_micros
from sessions.tests.conftest import post_message_sync
from tenants.models import Tenant
from tenants.scoping import tenant_scope

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("all_tenants_scope")]

QUESTION = "Please plan a trip to Kyoto in May, with temples and food"


def _rows(tenant, purpose) -> list[LLMCall]:
    return list(LLMCall.all_tenants.filter(tenant=tenant, purpose=purpose).order_by("id"))


def _entry_ids(agent) -> list[int]:
    return list(ModelRouteEntry.all_tenants.filter(route=agent.route).order_by("position").values_list("pk", flat=True))


def _answered_chat(world, agent, *, user=None) -> tuple[ChatSession, Run]:
    """A chat whose first run completed (its user message and reply stored), titled from the message."""
    user = user or world.member
    session = ChatSession.all_tenants.create(tenant=world.tenant, agent=agent, user=user,
                                             title=chat_title_from(QUESTION))
    run = Run.all_tenants.create(tenant=world.tenant, session=session, user=user, input=QUESTION,
                                 status="completed", reply="Day one: Fushimi Inari. Day two: Nishiki market.")
    for position, (role, text) in enumerate((("user", QUESTION), ("assistant", run.reply))):
        Message.all_tenants.create(tenant=world.tenant, session=session, run=run, position=position, role=role,
                                   content=text)
    return session, run


def _spend(world, micros: int, *, budget_usd: str | None = None) -> None:
    """This month's spending of the tenant so far (one title call), and its monthly budget."""
    with tenant_scope(world.tenant.pk):
        llm_calls_record(site=CallSite(tenant_id=world.tenant.pk, purpose=LLMCallPurpose.TITLE),
                         attempts=[_attempt(cost=micros)])
    if budget_usd is not None:
        Tenant.objects.filter(pk=world.tenant.pk).update(monthly_budget_usd=Decimal(budget_usd))


def _attempt(*, cost: int = 0, tokens=(10, 2), status="succeeded", entry_index=0) -> AttemptRecord:
    return AttemptRecord(entry_index=entry_index, provider_name="p", model="m", attempt=1, latency_ms=5,
                         first_token_ms=None, prompt_tokens=tokens[0], completion_tokens=tokens[1],
                         usage_estimated=False, status=status, error_class=None if status == "succeeded" else "server",
                         error="" if status == "succeeded" else "boom", cost_usd_micros=cost)


# --- each purpose writes its rows ------------------------------------------------------------


def test_a_title_request_and_its_fallback_are_llm_calls_of_the_chats_agent_and_user(world, fake_llm,
                                                                                     second_fake_llm):
    agent = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url, second_fake_llm.base_url])
    ModelRouteEntry.all_tenants.filter(route=agent.route).update(input_price_per_mtok=Decimal("2"),
                                                                 output_price_per_mtok=Decimal("8"))
    session, run = _answered_chat(world, agent)
    fake_llm.script(Fail(500))
    second_fake_llm.script(Reply("Kyoto Trip in May", usage=(120, 6)))

    assert tasks.chat_session_title_generate(session_id=session.pk, run_id=run.pk,
                                             tenant_id=world.tenant.pk) == "Kyoto Trip in May"

    failed, answered = _rows(world.tenant, "title")
    entries = _entry_ids(agent)
    assert [(c.entry_index, c.route_entry_id, c.status, c.error_class) for c in (failed, answered)] == [
        (0, entries[0], "failed", "server"), (1, entries[1], "succeeded", "")]
    assert all((c.run_id, c.turn, c.agent_id, c.user_id) == (None, None, agent.pk, world.member.pk)
               for c in (failed, answered))
    assert (answered.prompt_tokens, answered.completion_tokens, answered.cost_usd_micros) == (120, 6, 288)
    assert not LLMCall.all_tenants.filter(run=run).exists()  # the run's trace keeps its own turns only


def test_memory_extraction_calls_are_llm_calls_of_the_sessions_agent_and_user(world, fake_llm, second_fake_llm):
    agent = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url, second_fake_llm.base_url])
    memory_binding(agent)
    session, _run = _answered_chat(world, agent)
    fake_llm.script(Fail(503))
    second_fake_llm.script(Reply(json.dumps({"memories": []})))  # nothing to remember: no embedding call

    with tenant_scope(world.tenant.pk):
        outcome = memory_extract_session(session_id=session.pk)

    assert (outcome.batches, outcome.error) == (1, "")
    calls = _rows(world.tenant, "memory")
    assert [(c.entry_index, c.status) for c in calls] == [(0, "failed"), (1, "succeeded")]
    assert {(c.run_id, c.agent_id, c.user_id) for c in calls} == {(None, agent.pk, world.member.pk)}


def test_the_search_apis_rerank_calls_are_llm_calls_of_the_searching_member(world, fake_llm):
    from knowledge.rerank import route_reranker

    agent = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url])
    fake_llm.script(Reply("2"), Reply("9"))
    with tenant_scope(world.tenant.pk):
        rerank = route_reranker(route=agent.route, tenant=world.tenant, user_id=world.admin.pk)
        assert rerank("Which animals sleep in winter?", ["Birds migrate.", "Bears hibernate."]) == [2.0, 9.0]

    calls = _rows(world.tenant, "rerank")
    assert len(calls) == 2 and {(c.user_id, c.agent_id, c.route_entry_id) for c in calls} == {
        (world.admin.pk, None, _entry_ids(agent)[0])}


def test_llm_calls_record_refuses_a_turn_and_another_tenants_site(world, other_world):
    with tenant_scope(world.tenant.pk), pytest.raises(ValueError, match="turn"):
        llm_calls_record(site=CallSite(tenant_id=world.tenant.pk, purpose="turn"), attempts=[_attempt()])
    with tenant_scope(world.tenant.pk), pytest.raises(ValueError, match="tenant"):
        llm_calls_record(site=CallSite(tenant_id=other_world.tenant.pk, purpose="title"), attempts=[_attempt()])
    assert not LLMCall.all_tenants.exists()


# --- budgets -----------------------------------------------------------------------------------


def test_a_spent_monthly_budget_refuses_titles_memory_and_reranks_without_calling_the_model(world, fake_llm):
    from knowledge.rerank import route_reranker
    from knowledge.retrieval import SearchError

    agent = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url])
    memory_binding(agent)
    session, run = _answered_chat(world, agent)
    _spend(world, 5_000_000, budget_usd="5")

    assert tasks.chat_session_title_generate(session_id=session.pk, run_id=run.pk, tenant_id=world.tenant.pk) == ""
    assert ChatSession.all_tenants.get(pk=session.pk).title == chat_title_from(QUESTION)
    with tenant_scope(world.tenant.pk):
        outcome = memory_extract_session(session_id=session.pk)
        rerank = route_reranker(route=agent.route, tenant=world.tenant)
        with pytest.raises(SearchError) as refused:
            rerank("q", ["a", "b"])
    assert outcome.error.startswith("BudgetExceeded: The tenant has used $5.00 of its $5.00 monthly model budget")
    assert refused.value.code == "budget_exceeded"
    assert fake_llm.requests == []
    assert LLMCall.all_tenants.filter(tenant=world.tenant).count() == 1  # only the spending itself

    Tenant.objects.filter(pk=world.tenant.pk).update(monthly_budget_usd=Decimal("5.01"))
    fake_llm.script(Reply("Kyoto in May"))
    assert tasks.chat_session_title_generate(session_id=session.pk, run_id=run.pk,
                                             tenant_id=world.tenant.pk) == "Kyoto in May"


@pytest.mark.django_db(transaction=True)
def test_title_and_memory_calls_count_in_the_monthly_budget_of_runs(world, fake_llm, no_enqueue):
    agent = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url])
    ModelRouteEntry.all_tenants.filter(route=agent.route).update(input_price_per_mtok=Decimal("1.5"))
    bind_builtin(agent, "test_echo")
    for purpose in ("title", "memory"):
        with tenant_scope(world.tenant.pk):
            llm_calls_record(site=CallSite(tenant_id=world.tenant.pk, purpose=purpose, agent_id=agent.pk),
                             attempts=[_attempt(cost=5_000_000)])
    Tenant.objects.filter(pk=world.tenant.pk).update(monthly_budget_usd=Decimal("10"))
    with tenant_scope(world.tenant.pk):
        assert tenant_month_cost_usd_micros() == 10_000_000

    run = post_message_sync(agent=agent, user=world.member, content="go")
    async_to_sync(execute_run)(run.pk)

    run.refresh_from_db()
    assert (run.status, run.reason) == ("failed", "budget_exceeded") and "monthly model budget" in run.error
    assert fake_llm.requests == []


# --- a run's query rewrite and rerank ----------------------------------------------------------------

SAILING = ("Sailing club handbook", "# Sailing club handbook\n\n## Opening hours\n"
           "The boathouse opens at 8 in the morning and closes at sunset from April to October.\n")
KITCHEN = ("Kitchen rules", "# Kitchen rules\n\n## Cleaning\nWash your own cup. The dishwasher runs every evening at six.\n")


def _knowledge_agent(world, fake_llm, embedding_server):
    from knowledge.ingestion import document_ingest
    from knowledge.services import document_add_text, knowledge_base_create
    from llm.services import provider_save

    with tenant_scope(world.tenant.pk):
        provider = provider_save(tenant=world.tenant, name="test embedder", base_url=embedding_server)
        kb = knowledge_base_create(tenant=world.tenant, name="Club", embedding_provider=provider,
                                   embedding_model="all-minilm-l6-v2", dimensions=384)
        for title, text in (SAILING, KITCHEN):
            added = document_add_text(knowledge_base=kb, title=title, text=text)
            assert document_ingest(document_id=added.document.pk, generation=added.document.generation) == "ready"
    agent = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url])
    binding = CapabilityBinding(tenant=world.tenant, agent=agent, kind="knowledge",
                                config={"knowledge_bases": [kb.pk], "top_k": 1, "rewrite": True, "rerank": True})
    binding.full_clean()
    binding.save()
    return agent


def _search_once(body):
    """The run asks knowledge_search once, then answers; the rewrite and rerank prompts get short answers."""
    last = body["messages"][-1]
    text = last.get("content") or ""
    if text.startswith("You judge search results"):
        return Reply("9" if "dishwasher" in text else "1")
    if text.startswith("Rewrite the question"):
        return Reply("boathouse hours")
    if last["role"] == "tool":
        return Reply("Done.")
    return ToolCalls([("knowledge_search", {"query": "When does the boathouse open?"})])


@pytest.fixture
def no_ingest_task(monkeypatch):
    monkeypatch.setattr("knowledge.tasks.document_ingest_enqueue", lambda **kwargs: None)


@pytest.mark.django_db(transaction=True)
def test_a_runs_query_rewrite_and_rerank_are_llm_calls_and_a_spent_budget_skips_them(
        world, fake_llm, embedding_server, no_enqueue, no_ingest_task):
    agent = _knowledge_agent(world, fake_llm, embedding_server)
    fake_llm.respond(_search_once)
    run = post_message_sync(agent=agent, user=world.member, content="Go")
    async_to_sync(execute_run)(run.pk)

    assert Run.all_tenants.get(pk=run.pk).status == "completed"
    [rewrite] = _rows(world.tenant, "query_rewrite")
    reranks = _rows(world.tenant, "rerank")
    assert len(reranks) >= 2
    assert {(c.run_id, c.turn, c.agent_id, c.user_id, c.route_entry_id) for c in [rewrite, *reranks]} == {
        (None, None, agent.pk, world.member.pk, _entry_ids(agent)[0])}
    turns = list(LLMCall.all_tenants.filter(run_id=run.pk))
    assert len(turns) == 2 and {(c.purpose, c.agent_id, c.user_id) for c in turns} == {
        ("turn", agent.pk, world.member.pk)}

    # The month's budget spent (the route is unpriced, so the run's own turns still fit):
    # the rewrite and the rerank are refused and logged, the search goes on without them.
    with tenant_scope(world.tenant.pk):
        assert tenant_month_cost_usd_micros() == 0
    _spend(world, 1_000_000, budget_usd="1")
    before = len(fake_llm.requests)
    second = post_message_sync(agent=agent, user=world.member, content="Again")
    async_to_sync(execute_run)(second.pk)

    assert Run.all_tenants.get(pk=second.pk).status == "completed"
    prompts = [r["messages"][-1].get("content") or "" for r in fake_llm.requests[before:]]
    assert len(prompts) == 2 and not any(p.startswith(("Rewrite the question", "You judge")) for p in prompts)
    assert len(_rows(world.tenant, "query_rewrite")) == 1 and len(_rows(world.tenant, "rerank")) == len(reranks)


# --- usage -------------------------------------------------------------------------------------


def _calls_of_every_purpose(world):
    """One LLM call of each purpose in ``world``'s tenant this month: a run turn (2 USD) for the
    member, a title (1 USD) for the member, a rerank (0.5 USD) for the admin with no agent."""
    agent = agent_with_route(tenant=world.tenant, base_urls=["http://127.0.0.1:9/v1"], name="Helper")
    session, run = _answered_chat(world, agent)
    LLMCall.all_tenants.create(tenant=world.tenant, run=run, turn=0, agent=agent, user=world.member, attempt=1,
                               entry_index=0, provider_name="p", model="m", status="succeeded", prompt_tokens=100,
                               completion_tokens=10, cost_usd_micros=2_000_000)
    with tenant_scope(world.tenant.pk):
        llm_calls_record(site=CallSite(tenant_id=world.tenant.pk, purpose="title", agent_id=agent.pk,
                                       user_id=world.member.pk), attempts=[_attempt(cost=1_000_000)])
        llm_calls_record(site=CallSite(tenant_id=world.tenant.pk, purpose="rerank", user_id=world.admin.pk),
                         attempts=[_attempt(cost=500_000)])
    return agent, session


def test_the_usage_api_shows_every_purpose_by_agent_user_and_purpose_to_this_tenant_only(world, other_world):
    agent, _session = _calls_of_every_purpose(world)
    body = world.client(admin=True).get("/api/v1/admin/usage/").json()
    assert (body["llm_calls"], body["cost_usd"]) == (3, "3.500000")
    assert [(p["purpose"], p["llm_calls"], p["cost_usd"]) for p in body["by_purpose"]] == [
        ("turn", 1, "2.000000"), ("title", 1, "1.000000"), ("rerank", 1, "0.500000")]
    assert [(a["agent_id"], a["agent"], a["cost_usd"]) for a in body["by_agent"]] == [
        (agent.pk, "Helper", "3.000000"), (None, None, "0.500000")]
    assert [(u["user"], u["cost_usd"]) for u in body["by_user"]] == [
        (world.member.username, "3.000000"), (world.admin.username, "0.500000")]

    mine = world.client().get("/api/v1/usage/me/").json()
    assert (mine["llm_calls"], mine["cost_usd"]) == (2, "3.000000")
    assert {p["purpose"] for p in mine["by_purpose"]} == {"turn", "title"}

    theirs = other_world.client(admin=True).get("/api/v1/admin/usage/").json()
    assert (theirs["llm_calls"], theirs["by_agent"], theirs["by_user"], theirs["by_purpose"]) == (0, [], [], [])
    assert other_world.client().get("/api/v1/usage/me/").json()["llm_calls"] == 0
    with tenant_scope(other_world.tenant.pk):
        assert not LLMCall.objects.exists() and tenant_month_cost_usd_micros() == 0


def _and_a_compaction(world, agent, session) -> None:
    """One compaction call (0.25 USD) of the member's run in ``session``, as the runner writes it."""
    run = Run.all_tenants.get(session=session)
    LLMCall.all_tenants.create(tenant=world.tenant, run=run, turn=1, purpose="compaction", agent=agent,
                               user=world.member, attempt=1, entry_index=0, provider_name="p", model="m",
                               status="succeeded", prompt_tokens=300, completion_tokens=30, cost_usd_micros=250_000)


def _sums(body) -> tuple:
    return (body["llm_calls"], body["cost_usd"], [(p["purpose"], p["llm_calls"], p["cost_usd"]) for p in body["by_purpose"]])


def test_the_usage_apis_purpose_filter_counts_only_those_purposes_of_this_tenant(world, other_world):
    agent, session = _calls_of_every_purpose(world)
    _and_a_compaction(world, agent, session)
    admin = world.client(admin=True)
    everything = admin.get("/api/v1/admin/usage/").json()
    assert _sums(everything) == (4, "3.750000", [("turn", 1, "2.000000"), ("title", 1, "1.000000"),
                                                 ("rerank", 1, "0.500000"), ("compaction", 1, "0.250000")])

    only = admin.get("/api/v1/admin/usage/?purpose=compaction").json()
    assert _sums(only) == (1, "0.250000", [("compaction", 1, "0.250000")])
    assert (only["prompt_tokens"], only["completion_tokens"]) == (300, 30)
    assert [(a["agent"], a["llm_calls"], a["cost_usd"]) for a in only["by_agent"]] == [("Helper", 1, "0.250000")]
    assert [(u["user"], u["cost_usd"]) for u in only["by_user"]] == [(world.member.username, "0.250000")]

    both = admin.get("/api/v1/admin/usage/?purpose=turn,compaction").json()
    assert _sums(both) == (2, "2.250000", [("turn", 1, "2.000000"), ("compaction", 1, "0.250000")])
    assert admin.get("/api/v1/admin/usage/?purpose=turn&purpose=compaction").json() == both
    assert admin.get("/api/v1/admin/usage/?purpose=compaction,turn,,compaction").json() == both
    assert admin.get("/api/v1/admin/usage/?purpose=").json() == everything, "a blank filter is no filter"
    assert _sums(admin.get("/api/v1/admin/usage/?purpose=memory").json()) == (0, "0.000000", [])

    member = world.client()
    assert _sums(member.get("/api/v1/usage/me/?purpose=compaction").json()) == (
        1, "0.250000", [("compaction", 1, "0.250000")])
    assert _sums(member.get("/api/v1/usage/me/?purpose=title,rerank").json()) == (
        1, "1.000000", [("title", 1, "1.000000")]), "the admin's rerank is not the member's"
    assert {p["purpose"] for p in member.get("/api/v1/usage/me/").json()["by_purpose"]} == {"turn", "title",
                                                                                            "compaction"}

    assert _sums(other_world.client(admin=True).get("/api/v1/admin/usage/?purpose=compaction").json()) == (
        0, "0.000000", [])
    assert _sums(other_world.client().get("/api/v1/usage/me/?purpose=compaction,turn").json()) == (0, "0.000000", [])
    assert world.client().get("/api/v1/admin/usage/?purpose=compaction").status_code == 403


@pytest.mark.parametrize("url", ["/api/v1/admin/usage/", "/api/v1/usage/me/"])
@pytest.mark.parametrize("query", ["?purpose=bogus", "?purpose=turn,Compaction", "?purpose=turn&purpose=turns"])
def test_an_unknown_purpose_is_a_400_naming_it_and_the_known_ones(world, url, query):
    resp = world.client(admin=True).get(url + query)
    assert resp.status_code == 400
    body = resp.json()
    unknown = query.rsplit("=", 1)[1].split(",")[-1]
    assert f"Unknown purpose '{unknown}'" in body["message"] and "compaction" in body["message"]
    assert body["extra"]["purposes"] == list(LLMCallPurpose.values)


@pytest.mark.django_db(transaction=True)  # the runner writes on its own connection
def test_the_runner_writes_a_compaction_call_with_its_run_and_turn_and_refuses_an_unknown_purpose(world, no_enqueue):
    from sessions import runs
    from sessions.runner import database
    from sessions.runs import claim

    # no_enqueue: the test claims the run itself; a Celery worker that another test of this
    # process left consuming the queue must not get it first (CI saw "held by a live worker").
    agent = agent_with_route(tenant=world.tenant, base_urls=["http://127.0.0.1:9/v1"])
    run = post_message_sync(agent=agent, user=world.member, content="hi")
    with tenant_scope(world.tenant.pk):
        spec = database._spec(claim._claim(run.pk))
        async_to_sync(runs.llm_call_record)(spec=spec, turn=3, record=_attempt(cost=40, tokens=(7, 2)),
                                            purpose=LLMCallPurpose.COMPACTION)
        with pytest.raises(ValueError, match="unknown LLM call purpose 'bogus'"):
            async_to_sync(runs.llm_call_record)(spec=spec, turn=3, record=_attempt(cost=1), purpose="bogus")
    [row] = LLMCall.all_tenants.filter(run_id=run.pk)
    assert (row.purpose, row.turn, row.agent_id, row.user_id, row.cost_usd_micros) == (
        "compaction", 3, agent.pk, world.member.pk, 40)
    run.refresh_from_db()
    assert (run.prompt_tokens, run.completion_tokens, run.cost_usd_micros) == (7, 2, 40)


def test_the_console_dashboard_counts_every_purpose(world, other_world):
    from console.dashboard import tenant_month_usage
    from sessions.selectors import month_bounds

    agent, _session = _calls_of_every_purpose(world)
    start, end = month_bounds(None)
    usage = tenant_month_usage(tenant_id=world.tenant.pk, start=start, end=end)
    assert usage["total"]["cost_usd_micros"] == 3_500_000
    assert [(p["label"], p["llm_calls"]) for p in usage["purposes"]] == [("Run turn", 1), ("Chat title", 1),
                                                                         ("Rerank", 1)]
    assert [(a["name"], a["runs"], a["cost_usd_micros"]) for a in usage["agents"]] == [
        ("Helper", 1, 3_000_000), (None, 0, 500_000)]
    assert {u["username"]: (u["runs"], u["cost_usd_micros"]) for u in usage["users"]} == {
        world.member.username: (1, 3_000_000), world.admin.username: (0, 500_000)}
    theirs = tenant_month_usage(tenant_id=other_world.tenant.pk, start=start, end=end)
    assert (theirs["total"]["llm_calls"], theirs["purposes"], theirs["agents"]) == (0, [], [])

    _and_a_compaction(world, agent, _session)
    usage = tenant_month_usage(tenant_id=world.tenant.pk, start=start, end=end)
    assert [(p["purpose"], p["label"], p["llm_calls"], p["tokens"]) for p in usage["purposes"]][-1] == (
        "compaction", "Compaction", 1, 330)
    assert usage["total"]["cost_usd_micros"] == 3_750_000


# --- purge ---------------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_purging_deleted_chats_keeps_their_llm_calls_and_the_months_totals(world, settings):
    settings.CHAT_PURGE_AFTER_DAYS = 30
    agent, session = _calls_of_every_purpose(world)
    ChatSession.all_tenants.filter(pk=session.pk).update(deleted_at=timezone.now() - timedelta(days=31))
    before = world.client(admin=True).get("/api/v1/admin/usage/").json()
    mine_before = world.client().get("/api/v1/usage/me/").json()

    assert tasks.chat_sessions_purge() == 1

    assert not ChatSession.all_tenants.filter(pk=session.pk).exists()
    assert not Run.all_tenants.filter(session_id=session.pk).exists()
    turn = LLMCall.all_tenants.get(tenant=world.tenant, purpose="turn")
    assert (turn.run_id, turn.turn, turn.agent_id, turn.user_id, turn.cost_usd_micros) == (
        None, 0, agent.pk, world.member.pk, 2_000_000)
    after = world.client(admin=True).get("/api/v1/admin/usage/").json()
    # the run's purpose goes with the run: its calls count on under run_purpose null (documented)
    by_origin_before, by_origin_after = before.pop("by_run_purpose"), after.pop("by_run_purpose")
    assert after == before
    assert [r["run_purpose"] for r in by_origin_after] == [None]
    assert by_origin_after[0]["llm_calls"] == sum(r["llm_calls"] for r in by_origin_before)
    assert world.client().get("/api/v1/usage/me/").json() == mine_before
    with tenant_scope(world.tenant.pk):
        assert tenant_month_cost_usd_micros() == 3_500_000


def test_the_consoles_llm_call_list_shows_calls_without_a_run_to_their_tenants_admin_only(client, world,
                                                                                         other_world):
    _calls_of_every_purpose(world)
    client.force_login(world.admin)
    page = client.get("/admin/agent_sessions/llmcall/?purpose=title").content.decode()
    assert "Total of the 1 calls listed" in page and "cost $1.000000" in page and "Chat title" in page
    client.force_login(other_world.admin)
    page = client.get("/admin/agent_sessions/llmcall/").content.decode()
    assert "Total of the 0 calls listed" in page


def test_row_level_security_hides_the_calls_from_another_tenants_scope(world, other_world):
    _calls_of_every_purpose(world)
    with tenant_scope(other_world.tenant.pk):
        # tenant-bypass: no ORM filter here on purpose; PostgreSQL's policy must hide the rows.
        assert not LLMCall.all_tenants.filter(tenant_id=world.tenant.pk).exists()
    with tenant_scope(world.tenant.pk):
        assert LLMCall.all_tenants.filter(tenant_id=world.tenant.pk, run__isnull=True).count() == 2
