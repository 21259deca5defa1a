"""The monthly usage rollup (sessions.UsageMonth) against the LLM calls it sums.

Triggers on the LLM call table keep it (sessions/migrations/0009_usage_month.py, 0013: a
row-level INSERT trigger that skips the calls written ``rolled_up``), and the runner's turn
save adds its own call in the same statement (sessions.runs.statements.TURN_SAVE_SQL); the monthly
budget checks read it (sessions.selectors.tenant_month_cost_usd_micros, the runner's
sessions.runner.database.tenant_month_cost_usd_micros). Every test compares the rollup, row by
row (tenant, month, shard), with sums computed here in Python from the calls themselves.
"""

from __future__ import annotations

import asyncio
import importlib
import threading
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest
from django.db import IntegrityError, connection, connections, transaction
from django.db.utils import ProgrammingError

from agents.tests.factories import agent_with_route
from llm.metering import CallSite, LLMCallPurpose
from llm.records import AttemptRecord
from llm.types import ChatMessage
from sessions import runs
from sessions.llm_calls import llm_call_budget_refusal, llm_calls_record
from sessions.models import USAGE_MONTH_SHARDS, LLMCall, Run, UsageMonth
from sessions.runner import database
from sessions.runs import claim, records, statements
from sessions.selectors import tenant_month_cost_usd_micros
from sessions.tests.conftest import post_message_sync
from tenants import rls
from tenants.models import Tenant
from tenants.scoping import tenant_scope

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("no_enqueue"),
    pytest.mark.usefixtures("all_tenants_scope"),
]

SUMS = ("llm_calls", "prompt_tokens", "completion_tokens", "cost_usd_micros")


def _month(when: datetime) -> datetime.date:
    return when.astimezone(UTC).date().replace(day=1)


def calls_summed() -> dict[tuple[int, object], tuple[int, int, int, int]]:
    """``{(tenant_id, month): (calls, prompt, completion, cost)}`` from the LLM calls, summed
    in Python (the month of ``created_at`` in UTC)."""
    sums: dict[tuple[int, object], Counter] = {}
    for call in LLMCall.all_tenants.all():
        sums.setdefault((call.tenant_id, _month(call.created_at)), Counter()).update({
            "llm_calls": 1, "prompt_tokens": call.prompt_tokens, "completion_tokens": call.completion_tokens,
            "cost_usd_micros": call.cost_usd_micros})
    return {key: tuple(c[k] for k in SUMS) for key, c in sums.items()}


def rollup() -> dict[tuple[int, object], tuple[int, int, int, int]]:
    """The rollup's shards summed, keyed as :func:`calls_summed`'s; a month summing to
    nothing (every call of it deleted or moved) left out."""
    sums: dict[tuple[int, object], Counter] = {}
    for u in UsageMonth.all_tenants.all():
        assert 0 <= u.shard < USAGE_MONTH_SHARDS
        sums.setdefault((u.tenant_id, u.month), Counter()).update({k: getattr(u, k) for k in SUMS})
    return {key: tuple(c[k] for k in SUMS) for key, c in sums.items() if any(c[k] for k in SUMS)}


def assert_rollup_exact() -> None:
    expected = calls_summed()
    assert expected, "the test made calls"
    assert rollup() == expected


def attempt(*, cost: int, tokens: tuple[int, int] = (10, 2), status: str = "succeeded") -> AttemptRecord:
    return AttemptRecord(entry_index=0, attempt=1, provider_name="p", model="m", status=status,
                         error_class=None if status == "succeeded" else "server", error="",
                         latency_ms=5, first_token_ms=None, prompt_tokens=tokens[0], completion_tokens=tokens[1],
                         usage_estimated=False, cost_usd_micros=cost, retry_wait_ms=0)


def orm_call(tenant: Tenant, *, cost: int, tokens: tuple[int, int] = (3, 4), run: Run | None = None) -> LLMCall:
    return LLMCall.all_tenants.create(
        tenant=tenant, run=run, turn=0 if run else None, purpose="turn" if run else "title", attempt=1, entry_index=0,
        provider_name="p", model="m", status="succeeded", prompt_tokens=tokens[0], completion_tokens=tokens[1],
        cost_usd_micros=cost)


def raw_insert(tenant: Tenant, *, at: datetime, cost: int) -> None:
    """One LLM call written with plain SQL (the runner's INSERT), at ``at``."""
    params = dict.fromkeys(statements.LLM_CALL_COLUMNS) | {
        "tenant_id": tenant.pk, "purpose": "title", "attempt": 1, "entry_index": 0, "provider_name": "p",
        "model": "m", "status": "succeeded", "error_class": "", "error": "", "latency_ms": 1, "prompt_tokens": 1,
        "completion_tokens": 1, "usage_estimated": False, "cost_usd_micros": cost, "retry_wait_ms": 0,
        "rolled_up": False, "created_at": at,
    }
    with connection.cursor() as cursor:
        cursor.execute(statements.LLM_CALL_INSERT_SQL, params)


def claimed_spec(world):
    """A claimed run's spec (the runner's configuration), as the runner has it."""
    agent = agent_with_route(tenant=world.tenant, base_urls=["http://127.0.0.1:9/v1"])
    run = post_message_sync(agent=agent, user=world.member, content="hi")
    with tenant_scope(world.tenant.pk):
        return database._spec(claim._claim(run.pk))


# --- every writer ----------------------------------------------------------------------------------


def test_the_rollup_equals_the_calls_written_by_every_writer(world, other_world):
    spec = claimed_spec(world)
    with tenant_scope(world.tenant.pk):
        # the runner's plain SQL: a model turn's one statement (its LLM call a CTE), and a failed attempt
        asyncio.run(runs.assistant_message_save(spec=spec, turn=0, message=ChatMessage(role="assistant", content="a"),
                                                llm_call=attempt(cost=1_000, tokens=(100, 20))))
        asyncio.run(runs.llm_call_record(spec=spec, turn=1, record=attempt(cost=7, tokens=(5, 0), status="failed")))
        # a run's compaction summary (the runner's plain INSERT, purpose compaction)
        asyncio.run(runs.llm_call_record(spec=spec, turn=1, record=attempt(cost=3, tokens=(40, 8)),
                                         purpose=LLMCallPurpose.COMPACTION))
        # calls outside a run's turns (titles, memory, rewrites, reranks): one bulk INSERT
        llm_calls_record(site=CallSite(tenant_id=world.tenant.pk, purpose=LLMCallPurpose.MEMORY),
                         attempts=[attempt(cost=c, tokens=(c, 1)) for c in (11, 13, 17, 19, 23, 29, 31, 37, 41)])
    # the ORM (fixtures, the admin), either tenant
    orm_call(world.tenant, cost=500, run=Run.all_tenants.get(pk=spec.run_id))
    orm_call(other_world.tenant, cost=2_000)
    LLMCall.all_tenants.bulk_create([
        LLMCall(tenant=other_world.tenant, purpose="rerank", attempt=1, entry_index=0, provider_name="p", model="m",
                status="succeeded", prompt_tokens=i, completion_tokens=1, cost_usd_micros=100 + i)
        for i in range(12)
    ])

    assert_rollup_exact()
    assert list(LLMCall.all_tenants.filter(rolled_up=True).values_list("purpose", "cost_usd_micros")) == [
        ("turn", 1_000)], "only the turn save counts its own call"
    mine = 1_000 + 7 + 3 + sum((11, 13, 17, 19, 23, 29, 31, 37, 41)) + 500
    theirs = 2_000 + sum(100 + i for i in range(12))
    with tenant_scope(world.tenant.pk):
        assert tenant_month_cost_usd_micros() == mine
        assert asyncio.run(database.tenant_month_cost_usd_micros(world.tenant.pk)) == mine
    with tenant_scope(other_world.tenant.pk):
        assert tenant_month_cost_usd_micros() == theirs
        assert asyncio.run(database.tenant_month_cost_usd_micros(other_world.tenant.pk)) == theirs


def test_a_month_is_the_utc_calendar_month_whatever_the_connections_time_zone(world):
    end_of_january = datetime(2025, 1, 31, 23, 59, 59, 999_999, tzinfo=UTC)  # Feb 1st in Kiribati
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL TIME ZONE 'Pacific/Kiritimati'")
        raw_insert(world.tenant, at=end_of_january, cost=3)
        raw_insert(world.tenant, at=end_of_january + timedelta(microseconds=1), cost=5)
        raw_insert(world.tenant, at=datetime(2025, 2, 28, 23, 0, tzinfo=UTC), cost=7)
        raw_insert(world.tenant, at=datetime(2024, 12, 31, 23, 0, tzinfo=UTC), cost=11)

    assert_rollup_exact()
    assert sorted(m for (_t, m) in rollup()) == [datetime(2024, 12, 1).date(), datetime(2025, 1, 1).date(),
                                                       datetime(2025, 2, 1).date()]
    with tenant_scope(world.tenant.pk):
        assert tenant_month_cost_usd_micros(datetime(2025, 1, 15, tzinfo=UTC)) == 3
        assert tenant_month_cost_usd_micros(datetime(2025, 2, 1, tzinfo=UTC)) == 5 + 7
        assert tenant_month_cost_usd_micros(datetime(2024, 12, 31, 23, 30, tzinfo=UTC)) == 11
        assert tenant_month_cost_usd_micros() == 0  # none this month


def test_updates_move_and_deletes_subtract_their_calls(world, other_world):
    calls = [orm_call(world.tenant, cost=100 * (i + 1)) for i in range(10)]
    orm_call(other_world.tenant, cost=1)
    LLMCall.all_tenants.filter(pk=calls[0].pk).update(cost_usd_micros=1_000_000, prompt_tokens=9)
    LLMCall.all_tenants.filter(pk__in=[c.pk for c in calls[1:3]]).update(
        created_at=datetime(2025, 3, 3, tzinfo=UTC))  # the console's tests back-date calls
    LLMCall.all_tenants.filter(pk=calls[3].pk).delete()
    assert_rollup_exact()
    with tenant_scope(world.tenant.pk):
        assert tenant_month_cost_usd_micros() == 1_000_000 + sum(100 * (i + 1) for i in range(4, 10))
        assert tenant_month_cost_usd_micros(datetime(2025, 3, 9, tzinfo=UTC)) == 200 + 300


def test_a_transaction_writes_its_calls_to_one_shard_of_each_month(world):
    may = datetime(2020, 5, 9, tzinfo=UTC)
    with transaction.atomic():
        for cost in (1, 2, 3):  # three statements
            raw_insert(world.tenant, at=may, cost=cost)
        raw_insert(world.tenant, at=may + timedelta(days=30), cost=4)
        with connection.cursor() as cursor:
            cursor.execute("SELECT txid_current()")
            shard = cursor.fetchone()[0] % USAGE_MONTH_SHARDS
    rows = UsageMonth.all_tenants.filter(tenant=world.tenant).order_by("month")
    assert [(u.month, u.shard, u.llm_calls, u.cost_usd_micros) for u in rows] == [
        (datetime(2020, 5, 1).date(), shard, 3, 6), (datetime(2020, 6, 1).date(), shard, 1, 4)]


def test_an_update_that_changes_no_sum_writes_no_rollup_row(world):
    spec = claimed_spec(world)
    run = Run.all_tenants.get(pk=spec.run_id)
    call = orm_call(world.tenant, cost=5, run=run)
    before = {u.pk: (u.llm_calls, u.cost_usd_micros, _xmin(u.pk)) for u in UsageMonth.all_tenants.all()}
    LLMCall.all_tenants.filter(pk=call.pk).update(run=None, status="failed")  # a purged run: SET NULL
    assert {u.pk: (u.llm_calls, u.cost_usd_micros, _xmin(u.pk)) for u in UsageMonth.all_tenants.all()} == before


def _xmin(pk: int) -> str:
    """The transaction that wrote the rollup row last (changes with every write to it)."""
    with connection.cursor() as cursor:
        cursor.execute(f'SELECT xmin::text FROM "{UsageMonth._meta.db_table}" WHERE id = %s', [pk])
        return cursor.fetchone()[0]


def test_a_tenant_with_calls_can_be_deleted_whichever_table_goes_first(world, other_world):
    for tenant in (world.tenant, other_world.tenant):
        orm_call(tenant, cost=9)
    calls, usage = LLMCall._meta.db_table, UsageMonth._meta.db_table
    with transaction.atomic(), connection.cursor() as cursor:  # a cascade that deletes the rollup first
        cursor.execute(f'DELETE FROM "{usage}" WHERE tenant_id = %s', [other_world.tenant.pk])
        cursor.execute(f'DELETE FROM "{calls}" WHERE tenant_id = %s', [other_world.tenant.pk])
    assert not UsageMonth.all_tenants.filter(tenant=other_world.tenant).exists(), "no negative row made"
    world.tenant.delete()  # Django's cascade, in its own order
    assert not UsageMonth.all_tenants.exists() and not LLMCall.all_tenants.exists()


# --- the runner's turn save counts its own call ------------------------------------------------------


def turn_save_explained(spec, *, turn: int, record: AttemptRecord, at: datetime | None = None) -> dict[str, int]:
    """The runner's turn save with its LLM call (``TURN_SAVE_SQL``, the runner's parameters;
    ``at``: the call's ``created_at``) on this thread's connection, as ``EXPLAIN ANALYZE``: it
    runs, and PostgreSQL reports the triggers it fired: ``{trigger name: calls}``, foreign-key
    checks left out."""
    params = records._turn_params(spec=spec, turn=turn, message=ChatMessage(role="assistant", content="x"),
                                  reasoning="", llm_call=record)
    if at is not None:
        params["created_at"] = at
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + statements.TURN_SAVE_WITH_LLM_CALL_SQL, params)
        plan = cursor.fetchone()[0]
    plan = plan[0] if isinstance(plan, list) else plan
    return {t["Trigger Name"]: t["Calls"] for t in plan.get("Triggers", [])
            if not t["Trigger Name"].startswith("RI_ConstraintTrigger")}


def test_the_turn_save_counts_its_call_once_in_its_own_statement_and_fires_no_rollup_trigger(world):
    spec = claimed_spec(world)
    with tenant_scope(world.tenant.pk):
        asyncio.run(runs.assistant_message_save(spec=spec, turn=0, message=ChatMessage(role="assistant", content="a"),
                                                llm_call=attempt(cost=1_500, tokens=(120, 30))))
        assert tenant_month_cost_usd_micros() == 1_500
        assert asyncio.run(database.tenant_month_cost_usd_micros(world.tenant.pk)) == 1_500
        fired = turn_save_explained(spec, turn=1, record=attempt(cost=250, tokens=(9, 4)))
        assert fired == {}, "the rollup's INSERT trigger skips the call the turn save counts"
        failed = "EXPLAIN (ANALYZE, FORMAT JSON) " + statements.LLM_CALL_INSERT_SQL
        with connection.cursor() as cursor:  # any other insert: the trigger counts it
            cursor.execute(failed, records._llm_call_params(spec=spec, turn=2, record=attempt(cost=5, status="failed")))
            plan = cursor.fetchone()[0]
        plan = plan[0] if isinstance(plan, list) else plan
        assert {t["Trigger Name"]: t["Calls"] for t in plan["Triggers"]}.get("usage_month_on_insert") == 1
        assert tenant_month_cost_usd_micros() == 1_500 + 250 + 5
    assert LLMCall.all_tenants.filter(rolled_up=True).count() == 2
    assert LLMCall.all_tenants.filter(rolled_up=False).count() == 1
    assert_rollup_exact()


def test_the_turn_saves_month_is_the_utc_month_of_its_call_and_its_shard_the_transactions(world):
    spec = claimed_spec(world)
    end_of_january = datetime(2025, 1, 31, 23, 59, 59, 999_999, tzinfo=UTC)  # Feb 1st in Kiribati
    with tenant_scope(world.tenant.pk), transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL TIME ZONE 'Pacific/Kiritimati'")
        turn_save_explained(spec, turn=0, record=attempt(cost=3), at=end_of_january)
        turn_save_explained(spec, turn=1, record=attempt(cost=5), at=end_of_january + timedelta(microseconds=1))
        raw_insert(world.tenant, at=end_of_january, cost=7)  # the trigger: the same transaction's shard
        with connection.cursor() as cursor:
            cursor.execute("SELECT txid_current()")
            shard = cursor.fetchone()[0] % USAGE_MONTH_SHARDS
    rows = UsageMonth.all_tenants.filter(tenant=world.tenant).order_by("month")
    assert [(u.month, u.shard, u.llm_calls, u.cost_usd_micros) for u in rows] == [
        (datetime(2025, 1, 1).date(), shard, 2, 10), (datetime(2025, 2, 1).date(), shard, 1, 5)]
    assert_rollup_exact()


def test_a_turn_save_that_writes_no_message_writes_no_call_and_no_count(world, other_world):
    spec = claimed_spec(world)
    with tenant_scope(other_world.tenant.pk), pytest.raises(Exception, match="not found"):  # not its tenant's session
        asyncio.run(runs.assistant_message_save(spec=spec, turn=0, message=ChatMessage(role="assistant", content="a"),
                                                llm_call=attempt(cost=9)))
    assert not LLMCall.all_tenants.exists()
    assert not UsageMonth.all_tenants.exists()


def test_the_migration_reverses_to_the_statement_trigger_and_back(world):
    migration = importlib.import_module("sessions.migrations.0013_usage_month_runner_counts")

    class Rollback(Exception):
        pass

    def definition(cursor) -> str:
        cursor.execute("SELECT pg_get_triggerdef(oid) FROM pg_trigger WHERE tgname = 'usage_month_on_insert'")
        return cursor.fetchone()[0]

    with rls.owner_mode(), pytest.raises(Rollback), transaction.atomic(), connection.cursor() as cursor:
        assert "FOR EACH ROW WHEN ((NOT new.rolled_up))" in definition(cursor)
        for statement in migration.DROP_ROW_TRIGGER:
            cursor.execute(statement)
        assert "FOR EACH STATEMENT" in definition(cursor)
        for statement in migration.CREATE_ROW_TRIGGER:
            cursor.execute(statement)
        assert "FOR EACH ROW WHEN ((NOT new.rolled_up))" in definition(cursor)
        raise Rollback


# --- tenants and row-level security ---------------------------------------------------------------


def test_in_a_tenants_scope_its_calls_roll_up_and_no_other_tenants_row_is_seen_or_written(world, other_world):
    orm_call(other_world.tenant, cost=4_000)
    with tenant_scope(world.tenant.pk):
        # as the application's role, under row-level security: the trigger writes the rollup row
        LLMCall.objects.create(tenant=world.tenant, purpose="title", attempt=1, entry_index=0, provider_name="p",
                               model="m", status="succeeded", cost_usd_micros=25)
        assert tenant_month_cost_usd_micros() == 25
        assert set(UsageMonth.objects.values_list("tenant_id", flat=True)) == {world.tenant.pk}
        with connection.cursor() as cursor:
            cursor.execute(f'SELECT DISTINCT tenant_id FROM "{UsageMonth._meta.db_table}"')
            assert cursor.fetchall() == [(world.tenant.pk,)]
            cursor.execute(f'UPDATE "{UsageMonth._meta.db_table}" SET cost_usd_micros = 0 WHERE tenant_id = %s',
                           [other_world.tenant.pk])
            assert cursor.rowcount == 0
        with pytest.raises(ProgrammingError, match="row-level security"), transaction.atomic():
            UsageMonth.objects.create(tenant=other_world.tenant, month=_month(datetime.now(UTC)), shard=0,
                                      cost_usd_micros=-4_000)
        with pytest.raises(ValueError, match="scope"):
            asyncio.run(database.tenant_month_cost_usd_micros(other_world.tenant.pk))
    assert_rollup_exact()
    with tenant_scope(other_world.tenant.pk):
        assert tenant_month_cost_usd_micros() == 4_000


def test_a_rollup_row_is_unique_per_tenant_month_and_shard(world):
    orm_call(world.tenant, cost=1)
    row = UsageMonth.all_tenants.get()
    with pytest.raises(IntegrityError), transaction.atomic():
        UsageMonth.all_tenants.create(tenant=world.tenant, month=row.month, shard=row.shard)


# --- concurrency -----------------------------------------------------------------------------------


def test_concurrent_inserts_from_several_connections_lose_no_update(world, other_world):
    threads_per_tenant, transactions, calls_each = 4, 6, 5
    start = threading.Barrier(2 * threads_per_tenant)
    errors: list[BaseException] = []

    def insert(tenant: Tenant, offset: int) -> None:
        try:
            with tenant_scope(tenant.pk):
                start.wait(timeout=60)
                for t in range(transactions):
                    with transaction.atomic():  # rollup rows stay locked until each commit
                        for i in range(calls_each):
                            LLMCall.objects.create(tenant=tenant, purpose="rerank", attempt=1, entry_index=0,
                                                   provider_name="p", model="m", status="succeeded",
                                                   prompt_tokens=offset + t, completion_tokens=i,
                                                   cost_usd_micros=1_000 * offset + 10 * t + i)
        except BaseException as exc:  # noqa: BLE001 (reported by the test below)
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=insert, args=(tenant, n))
               for n in range(threads_per_tenant) for tenant in (world.tenant, other_world.tenant)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors, errors
    assert LLMCall.all_tenants.count() == 2 * threads_per_tenant * transactions * calls_each
    assert_rollup_exact()


def test_concurrent_turns_on_the_runners_pool_lose_no_update(world):
    specs = [claimed_spec(world) for _ in range(3)]

    async def turns() -> None:
        await asyncio.gather(*(
            runs.llm_call_record(spec=spec, turn=turn, record=attempt(cost=turn + 1, tokens=(turn, 1)))
            for spec in specs for turn in range(12)
        ))

    with tenant_scope(world.tenant.pk):
        asyncio.run(turns())
        assert tenant_month_cost_usd_micros() == 3 * sum(range(1, 13))
    assert_rollup_exact()


def test_concurrent_turn_saves_and_other_writers_lose_no_update_and_count_nothing_twice(world):
    """Turn saves (their own count), the runner's other inserts of the same runs and metered
    calls, at once. A turn save that locked its rollup row before its run's row deadlocked
    with an insert of the same run (its run's row, then its rollup row) when both
    transactions had the same shard: seen here in 1 of 4 runs before the turn save's order
    was fixed."""
    specs = [claimed_spec(world) for _ in range(4)]
    turns = 10
    start = threading.Barrier(3)
    errors: list[BaseException] = []

    async def saves() -> None:
        await asyncio.gather(*(
            runs.assistant_message_save(spec=spec, turn=turn, message=ChatMessage(role="assistant", content=f"{turn}"),
                                        llm_call=attempt(cost=100 + turn, tokens=(turn, 2)))
            for spec in specs for turn in range(turns)
        ))

    def in_thread(work) -> None:
        try:
            with tenant_scope(world.tenant.pk):
                start.wait(timeout=60)
                work()
        except BaseException as exc:  # noqa: BLE001 (reported by the test below)
            errors.append(exc)
        finally:
            connections.close_all()

    def metered() -> None:  # titles, memory, rewrites, reranks: llm_calls_record, one transaction each
        for i in range(15):
            llm_calls_record(site=CallSite(tenant_id=world.tenant.pk, purpose=LLMCallPurpose.MEMORY),
                             attempts=[attempt(cost=i, tokens=(i, 1)), attempt(cost=1, status="failed")])

    def failed_attempts() -> None:  # the runner's own plain INSERTs (failed attempts), on its pool
        async def inserts() -> None:  # each in a transaction: its run's row, then its rollup row
            await asyncio.gather(*(runs.llm_call_record(spec=spec, turn=t, record=attempt(cost=7, status="failed"))
                                   for spec in specs for t in range(turns)))
        asyncio.run(inserts())

    threads = [threading.Thread(target=in_thread, args=(work,))
               for work in (lambda: asyncio.run(saves()), metered, failed_attempts)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors, errors
    assert LLMCall.all_tenants.filter(rolled_up=True).count() == 4 * turns
    assert LLMCall.all_tenants.count() == 4 * turns + 15 * 2 + 4 * turns
    assert_rollup_exact()
    with tenant_scope(world.tenant.pk):
        assert tenant_month_cost_usd_micros() == (4 * sum(100 + t for t in range(turns)) + sum(range(15)) + 15
                                                  + 4 * 7 * turns)


# --- the migration's fill, the budget -------------------------------------------------------------


def test_the_migrations_fill_sums_the_calls_already_there(world, other_world):
    orm_call(world.tenant, cost=3)
    raw_insert(other_world.tenant, at=datetime(2025, 6, 30, 23, 59, tzinfo=UTC), cost=8)
    llm_calls_record_in(world.tenant, [attempt(cost=c) for c in range(1, 10)])
    expected = rollup()
    migration = importlib.import_module("sessions.migrations.0009_usage_month")
    with connection.cursor() as cursor:
        cursor.execute(f'DELETE FROM "{UsageMonth._meta.db_table}"')
        cursor.execute(migration.FILL)
    assert rollup() == expected
    assert_rollup_exact()


def llm_calls_record_in(tenant: Tenant, attempts: list[AttemptRecord]) -> None:
    with tenant_scope(tenant.pk):
        llm_calls_record(site=CallSite(tenant_id=tenant.pk, purpose=LLMCallPurpose.TITLE), attempts=attempts)


def test_the_budget_refusal_counts_the_rollup_of_this_month_only(world, other_world):
    Tenant.objects.filter(pk=world.tenant.pk).update(monthly_budget_usd=1)
    raw_insert(world.tenant, at=datetime.now(UTC) - timedelta(days=40), cost=5_000_000)  # an earlier month
    orm_call(other_world.tenant, cost=5_000_000)
    llm_calls_record_in(world.tenant, [attempt(cost=999_999)])
    with tenant_scope(world.tenant.pk):
        assert llm_call_budget_refusal(tenant_id=world.tenant.pk) == ""
    llm_calls_record_in(world.tenant, [attempt(cost=1)])
    with tenant_scope(world.tenant.pk):
        assert llm_call_budget_refusal(tenant_id=world.tenant.pk) == (
            "The tenant has used $1.00 of its $1.00 monthly model budget.")
