"""The monthly budget check at 10k, 100k and 1M LLM calls this month, before and after the rollup.

Every model turn (and every metered call outside runs: titles, memory, rewrites, reranks) asks
how much the tenant has spent this calendar month. Before: the sum of the month's LLM calls
(``LLMCall.objects.filter(created_at__gte=month_start).aggregate(Sum("cost_usd_micros"))``,
what ``sessions.selectors.tenant_month_cost_usd_micros`` was). After: the sum of the month's
``UsageMonth`` rows (at most 8, kept by triggers and the runner's turn save;
sessions/migrations/0009_usage_month.py, 0013_usage_month_runner_counts.py),
through the selector (ORM, the metered calls' path) and through the runner's plain SQL on its
event loop's pool (``DatabaseRunStore.tenant_month_cost_usd_micros``, the turns' path).

A throwaway tenant gets plain-SQL inserted calls spread over this month (10k, then 90k more,
then 900k more); the table is vacuumed and analysed (as the owner) before each measurement,
the old query's best case. Each check runs in the tenant's scope, as the application's role,
under row-level security. Also printed: the time of each bulk INSERT (its rollup write included).

``--insert-overhead`` also times single-row LLM call INSERTs on the runner's pool (the
runner's statement, autocommit; round trip, and PostgreSQL's own execution time and the
trigger's from ``EXPLAIN ANALYZE``) with the rollup triggers enabled and disabled: it disables
them for everyone for a few seconds, so use it only on a database of your own
(``DATABASE_URL=postgres://agent_platform_app@127.0.0.1:5433/<yours>`` after ``migrate``).

Run: ``.venv/bin/python bench/budget_check.py [--sizes 10000,100000,1000000] [--insert-overhead]``
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid

from _harness import percentile
from _stats import machine
from django.db import connection
from django.db.models import Sum

from sessions.models import LLMCall, UsageMonth
from sessions.runner.adapters import DatabaseRunStore
from sessions.runner.pg import pg_connection
from sessions.runs import statements
from sessions.selectors import month_start, tenant_month_cost_usd_micros
from tenants import rls
from tenants.models import Tenant
from tenants.scoping import tenant_scope
from tenants.services import tenant_create

_FILL_SQL = f"""
WITH filled AS (
    INSERT INTO "{LLMCall._meta.db_table}" ({statements.columns_sql(statements.LLM_CALL_COLUMNS)})
    SELECT %(tenant_id)s, NULL, NULL, 'turn', NULL, NULL, 1, NULL, 0, 'bench', 'm', 'succeeded', '', '', 10, NULL,
           100 + i %% 50, 20 + i %% 7, false, 150 + i %% 13, 0, true,
           %(start)s + (now() - %(start)s) * (i::float8 / %(n)s)
    FROM generate_series(1, %(n)s) AS i
    RETURNING "tenant_id", "created_at", "prompt_tokens", "completion_tokens", "cost_usd_micros"
)
{statements.rollup_add_sql("filled")}
"""
"""``n`` calls of the tenant, spread evenly from the month's start to now, written
``rolled_up`` and added to the rollup in the same statement (the row-level trigger would
write the rollup row once per call: sessions/migrations/0013_usage_month_runner_counts.py)."""


def old_month_cost() -> int:
    """The check as it was: the month's calls summed (requires tenant scope)."""
    total = LLMCall.objects.filter(created_at__gte=month_start()).aggregate(total=Sum("cost_usd_micros"))["total"]
    return int(total or 0)


def timed_ms(fn, repeats: int) -> list[float]:
    """``repeats`` timings of ``fn()`` in ms (after one untimed call: connection, plan)."""
    fn()
    out = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        out.append((time.perf_counter() - started) * 1000)
    return out


async def timed_async_ms(make, repeats: int) -> list[float]:
    await make()
    out = []
    for _ in range(repeats):
        started = time.perf_counter()
        await make()
        out.append((time.perf_counter() - started) * 1000)
    return out


def line(label: str, values: list[float]) -> str:
    return (f"  {label:<52} n={len(values):<4} p50={percentile(values, 0.5):9.3f} ms "
            f"p95={percentile(values, 0.95):9.3f} ms")


def vacuum_analyze() -> None:
    with rls.owner_mode(), connection.cursor() as cursor:
        for table in (LLMCall._meta.db_table, UsageMonth._meta.db_table):
            cursor.execute(f'VACUUM ANALYZE "{table}"')


def measure(tenant_id: int, calls: int, repeats: int) -> None:
    with tenant_scope(tenant_id):
        old_repeats = max(5, min(repeats, 2_000_000 // max(calls, 1)))
        old = timed_ms(old_month_cost, old_repeats)
        new = timed_ms(tenant_month_cost_usd_micros, repeats)
        runner = asyncio.run(timed_async_ms(lambda: DatabaseRunStore.tenant_month_cost_usd_micros(tenant_id), repeats))
        assert old_month_cost() == tenant_month_cost_usd_micros() == asyncio.run(
            DatabaseRunStore.tenant_month_cost_usd_micros(tenant_id)), "the rollup differs from the calls"
    print(f"{calls:,} calls this month:")
    print(line("before: sum of the month's calls (ORM)", old))
    print(line("after: sum of the rollup (selector, ORM)", new))
    print(line("after: sum of the rollup (runner, loop pool)", runner))


def _insert_params(tenant_id: int) -> dict:
    from django.utils import timezone

    return dict.fromkeys(statements.LLM_CALL_COLUMNS) | {
        "tenant_id": tenant_id, "purpose": "turn", "attempt": 1, "entry_index": 0, "provider_name": "bench",
        "model": "m", "status": "succeeded", "error_class": "", "error": "", "latency_ms": 1, "prompt_tokens": 10,
        "completion_tokens": 2, "usage_estimated": False, "cost_usd_micros": 3, "retry_wait_ms": 0,
        "rolled_up": False, "created_at": timezone.now(),
    }


async def _single_inserts(tenant_id: int, count: int) -> tuple[list[float], list[float], list[float]]:
    """``count`` single-row INSERTs, each in its own transaction (autocommit), as
    ``EXPLAIN (ANALYZE)`` so PostgreSQL reports its own time: (round trip ms, server
    execution ms, of which the rollup trigger ms)."""
    explain = "EXPLAIN (ANALYZE, FORMAT JSON) " + statements.LLM_CALL_INSERT_SQL
    trip, server, trigger = [], [], []
    for i in range(count + 20):
        started = time.perf_counter()
        async with pg_connection() as conn:
            plan = (await (await conn.execute(explain, _insert_params(tenant_id))).fetchone())[0]
        if i >= 20:  # the first ones open the connection and prepare the statement
            trip.append((time.perf_counter() - started) * 1000)
            plan = plan[0] if isinstance(plan, list) else plan
            server.append(plan["Execution Time"])
            trigger.append(sum(t["Time"] for t in plan.get("Triggers", []) if t["Trigger Name"].startswith("usage_")))
    return trip, server, trigger


def _toggle_triggers(enable: bool) -> None:
    with rls.owner_mode(), connection.cursor() as cursor:
        for event in ("insert", "update", "delete"):
            cursor.execute(f'ALTER TABLE "{LLMCall._meta.db_table}" {"ENABLE" if enable else "DISABLE"} '
                           f"TRIGGER usage_month_on_{event}")


def insert_overhead(tenant_id: int, count: int) -> None:
    """Single-row inserts with the rollup triggers on, off, on again (interleaved against
    drift); the calls inserted while they were off are deleted while still off, so the rollup
    stays exact."""
    results = {}
    for label, enabled in (("triggers enabled", True), ("triggers disabled", False),
                           ("triggers enabled again", True)):
        _toggle_triggers(enabled)
        with tenant_scope(tenant_id):
            newest = LLMCall.objects.order_by("-id").values_list("id", flat=True).first() or 0
            try:
                results[label] = asyncio.run(_single_inserts(tenant_id, count))
            finally:
                if not enabled:
                    LLMCall.objects.filter(id__gt=newest).delete()
                    _toggle_triggers(True)
    print(f"single-row LLM call INSERT on the runner's pool (autocommit, EXPLAIN ANALYZE), {count} each:")
    for label, (trip, server, trigger) in results.items():
        print(line(f"{label}: round trip", trip))
        print(line(f"{label}: PostgreSQL's execution", server))
        if any(trigger):
            print(line(f"{label}: of which the rollup trigger", trigger))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000,100000,1000000", help="calls this month, cumulative steps")
    parser.add_argument("--repeats", type=int, default=200, help="timed checks per figure (fewer for slow ones)")
    parser.add_argument("--insert-overhead", action="store_true", help="see the module docstring: own database only")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    slug = f"bench-budget-{uuid.uuid4().hex[:8]}"
    tenant = tenant_create(name=slug, slug=slug)
    print(f"machine: {machine()}")
    try:
        have = 0
        for size in sizes:
            started = time.perf_counter()
            with tenant_scope(tenant.pk), connection.cursor() as cursor:
                cursor.execute(_FILL_SQL, {"tenant_id": tenant.pk, "start": month_start(), "n": size - have})
            print(f"inserted {size - have:,} calls in one statement (rollup included): "
                  f"{time.perf_counter() - started:.2f} s")
            have = size
            vacuum_analyze()
            measure(tenant.pk, size, args.repeats)
        if args.insert_overhead:
            insert_overhead(tenant.pk, 500)
    finally:
        started = time.perf_counter()
        with tenant_scope(tenant.pk):
            LLMCall.objects.all().delete()
            assert not tenant_month_cost_usd_micros(), "the delete trigger left a sum"
        Tenant.objects.filter(pk=tenant.pk).delete()
        print(f"deleted the tenant's calls and the tenant: {time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    main()
