"""Concurrent runs on one worker process.

N runs start at once on one event loop (as the worker's RunHost hosts them). The fake model (its own process)
takes 1 s before every answer (3 turns: two tool calls, then a 50-token answer), so a run
needs ~3 s of model time; if runs overlap fully, N runs finish in ~3 s whatever N is.

Run: ``.venv/bin/python bench/concurrent_runs.py [--n 50 100 200]``
"""

from __future__ import annotations

import argparse
import asyncio
import time

from _harness import BenchTenant, fake_model, percentile

from sessions.models import Run
from sessions.runner.loop import execute_run




async def run_all(run_ids: list[int]) -> list[float]:
    async def one(run_id: int) -> float:
        start = time.perf_counter()
        await execute_run(run_id)
        return time.perf_counter() - start

    return await asyncio.gather(*(one(r) for r in run_ids))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, nargs="+", default=[50, 100, 200])
    args = parser.parse_args()
    with fake_model("slow3") as base_url, BenchTenant(base_url, read_timeout_seconds=60.0) as bench:
        for n in args.n:
            runs = [bench.new_run() for _ in range(n)]
            started = time.perf_counter()
            durations = asyncio.run(run_all([r.pk for r in runs]))
            wall = time.perf_counter() - started
            statuses = list(Run.all_tenants.filter(pk__in=[r.pk for r in runs]).values_list("status", flat=True))
            completed = statuses.count("completed")
            print(
                f"N={n:4d}: wall {wall:5.1f} s (ideal ~3 s), completed {completed}/{n}, "
                f"run time p50 {percentile(durations, 0.5):.1f} s p95 {percentile(durations, 0.95):.1f} s"
            )


if __name__ == "__main__":
    main()
