"""Platform overhead per turn.

A FakeLLMServer (in its own process) answers instantly with one tool call per turn (test_echo) for 19 turns, then
a final answer: 20-turn runs, executed one after another by the real runner against the
real PostgreSQL and Redis. A turn's time is the gap between consecutive assistant messages
of a run: model request and stream, persistence (messages, tool calls, LLM calls), tool
execution and every event published. The fake model's own time is near zero, so this is
the platform's overhead.

Run: ``.venv/bin/python bench/turn_overhead.py [--runs 10]``
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import time

from _harness import BenchTenant, fake_model, summary
from _pg_stats import DatabaseWatch

from sessions.models import Message
from sessions.runner.loop import execute_run

TURNS = 20



def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--db", type=int, nargs="?", const=25, metavar="TOP",
                        help="also print PostgreSQL's CPU per run and turn over the runs' execution (the whole "
                             "cluster: a throwaway one tells this benchmark's) and, if pg_stat_statements is "
                             "loaded, its TOP statements per run")
    args = parser.parse_args()
    with fake_model("turns20") as base_url, BenchTenant(base_url, max_loop_count=TURNS + 1) as bench:
        gaps_ms: list[float] = []
        db = DatabaseWatch(turns_per_run=TURNS, top=args.db) if args.db is not None else None
        started = time.perf_counter()
        runs = [bench.new_run() for _ in range(args.runs)]  # made first, so --db counts the runs' execution only
        if db is not None:
            db.start()
        for run in runs:
            asyncio.run(execute_run(run.pk))
        if db is not None:
            db.stop()
        for run in runs:
            stamps = list(
                Message.all_tenants.filter(run_id=run.pk, role="assistant").order_by("position")
                .values_list("created_at", flat=True)
            )
            assert len(stamps) == TURNS, f"run {run.pk} took {len(stamps)} turns"
            gaps_ms += [(b - a).total_seconds() * 1000 for a, b in zip(stamps, stamps[1:], strict=False)]
        wall = time.perf_counter() - started
    print(f"machine: {platform.machine()}, {platform.python_implementation()} {platform.python_version()}")
    print(f"{args.runs} runs x {TURNS} turns (1 tool call per turn) in {wall:.1f} s")
    print(f"per-turn overhead: {summary(gaps_ms)}")
    if db is not None:
        print(db.report(args.runs))


if __name__ == "__main__":
    main()
