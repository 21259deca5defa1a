"""Storage per turn in PostgreSQL and history load time as sessions grow.

For each size (default 100, 250 and 500 turns) one session runs that many model turns
through the real runner (fake model ``tools:<n>`` in _fake_model.py: ``bench_read_file`` calls,
4 results in 5 of 4,000 characters, the fifth 200, then an answer), without compaction (a
10 M-token window), so the whole history is loaded every turn: the worst case.

Printed per size:

- bytes per turn: the on-disk size of the session's rows (``pg_column_size`` of whole rows,
  TOAST-compressed values as stored; indexes not included) in messages, tool calls, LLM
  calls and the run, divided by the turns;
- ``history_load`` (sessions/runner/adapters.py, the run store's history read) time: what every turn of a run pays before it
  calls the model, on the async pool the runner uses (sessions/runner/pg.py). ``--repeat``
  calls (default 30) after one warm-up: wall time p50/p95/max and this process's CPU time
  p50 (steadier than wall time on a shared machine; PostgreSQL's own work is not in it).

Targets (issue 4): linear growth, load ≤ 25 ms at 500 turns.

Run: ``.venv/bin/python bench/storage.py [--turns 100 250 500] [--repeat 30] [--explain]``
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

import _bench_tools  # noqa: F401  (registers bench_read_file)
from _harness import BenchTenant, fake_model, percentile
from django.db import connection

from agents.tests.factories import bind_builtin
from llm.models import ModelRouteEntry
from sessions.models import LLMCall, Message, Run, ToolCall
from sessions.runner import adapters
from sessions.runner.loop import execute_run
from tenants.scoping import tenant_scope

NO_COMPACTION_WINDOW = 10_000_000


def _row_bytes(model, **filters) -> int:
    table = model._meta.db_table
    where = " AND ".join(f"{column} = %s" for column in filters)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT COALESCE(SUM(pg_column_size(t.*)), 0), COUNT(*) FROM {table} t WHERE {where}",
                       list(filters.values()))
        total, _ = cursor.fetchone()
    return int(total)


async def _timed_loads(run_id: int, repeat: int) -> tuple[Any, list[float], list[float]]:
    """``history_load`` of run ``run_id`` as the runner calls it at a run's first turn (the run's
    session and the compaction cursor looked up too), ``repeat`` times after a warm-up (the
    pool's connection, prepared statements); wall and CPU milliseconds of each."""
    history = await adapters.history_load(run_id)
    times, cpu = [], []
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.thread_time()
        await adapters.history_load(run_id)
        times.append((time.perf_counter() - t0) * 1000)
        cpu.append((time.thread_time() - c0) * 1000)
    return history, times, cpu


def measure(turns: int, repeat: int, explain: bool) -> None:
    with fake_model(f"tools:{turns}") as base_url, BenchTenant(
        base_url, max_loop_count=turns + 10, read_timeout_seconds=60.0, turn_timeout_seconds=600.0
    ) as bench:
        bind_builtin(bench.agent, "bench_read_file")
        ModelRouteEntry.all_tenants.filter(route=bench.agent.route).update(max_input_tokens=NO_COMPACTION_WINDOW)
        run = bench.new_run(f"Review the {turns - 1} modules of the code base, one by one.")
        started = time.perf_counter()
        asyncio.run(execute_run(run.pk))
        build_seconds = time.perf_counter() - started
        run = Run.all_tenants.get(pk=run.pk)
        assert run.status == "completed" and run.loop_count == turns, (run.status, run.loop_count, run.error)

        sizes = {
            "messages": _row_bytes(Message, session_id=run.session_id),
            "tool calls": _row_bytes(ToolCall, run_id=run.pk),
            "LLM calls": _row_bytes(LLMCall, run_id=run.pk),
            "run": _row_bytes(Run, id=run.pk),
        }
        total = sum(sizes.values())
        with tenant_scope(run.tenant_id):
            history, times, cpu = asyncio.run(_timed_loads(run.pk, repeat))
            if explain:
                with connection.cursor() as cursor:
                    cursor.execute("EXPLAIN (ANALYZE, BUFFERS) " + adapters.HISTORY_SQL.format(after_cursor=""),
                                   {"tenant_id": run.tenant_id, "session_id": run.session_id, "run_id": run.pk})
                    plan = "\n".join(r[0] for r in cursor.fetchall())
        print(
            f"{turns:4d} turns: {len(history.messages)} messages, {total / turns:,.0f} bytes/turn "
            f"({', '.join(f'{k} {v / turns:,.0f}' for k, v in sizes.items())}); "
            f"history_load p50 {percentile(times, 0.5):.1f} ms p95 {percentile(times, 0.95):.1f} ms "
            f"max {max(times):.1f} ms (this process's CPU p50 {percentile(cpu, 0.5):.1f} ms); "
            f"built in {build_seconds:.0f} s",
            flush=True,
        )
        if explain:
            print(plan)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, nargs="+", default=[100, 250, 500])
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--explain", action="store_true", help="print the plan of the messages query")
    args = parser.parse_args()
    for turns in args.turns:
        measure(turns, args.repeat, args.explain)


if __name__ == "__main__":
    main()
