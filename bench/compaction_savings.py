"""Tokens sent to the model over a 100-turn tool-heavy session, with and without compaction.

One run, 100 model turns, through the real runner (sessions/runner/loop.py) and compaction
(sessions/runner/compaction.py): the fake model (``tool100`` in _fake_model.py, its own
process) calls ``bench_read_file`` for 99 turns (4 turns in 5 return 4,000 characters, the
fifth 200), then answers. The session runs twice:

- **with compaction**: the route entry's context window is ``--window`` tokens (default
  32,000), so the runner compacts whenever the prompt passes 0.7 × window; summarizer calls
  see old tool results masked;
- **without**: the window is 10 M tokens, so nothing is ever compacted: every turn sends the
  whole history (what the runner would have sent without compaction).

"Tokens sent" is the sum of ``prompt_tokens`` over every model request of the run (LLMCall
rows, summarizer calls included), as the fake model reports them: JSON characters of the
request's messages / 4 (tool definitions not counted, in both cases alike).
Target (issue 4): with ≤ 40 % of without.

Run: ``.venv/bin/python bench/compaction_savings.py [--window 32000]``
"""

from __future__ import annotations

import argparse
import asyncio
import time

import _bench_tools  # noqa: F401  (registers bench_read_file)
from _harness import BenchTenant, fake_model

from agents.tests.factories import bind_builtin
from llm.models import ModelRouteEntry
from sessions.models import Compaction, LLMCall, Run
from sessions.runner.loop import execute_run

NO_COMPACTION_WINDOW = 10_000_000


def session(window: int) -> dict:
    """Run the 100-turn session once with a ``window``-token context; its totals."""
    with fake_model("tool100") as base_url, BenchTenant(base_url, max_loop_count=150, read_timeout_seconds=60.0,
                                                         turn_timeout_seconds=600.0) as bench:
        bind_builtin(bench.agent, "bench_read_file")
        ModelRouteEntry.all_tenants.filter(route=bench.agent.route).update(max_input_tokens=window)
        run = bench.new_run("Review the 99 modules of the code base, one by one.")
        started = time.perf_counter()
        asyncio.run(execute_run(run.pk))
        seconds = time.perf_counter() - started
        run = Run.all_tenants.get(pk=run.pk)
        calls = list(LLMCall.all_tenants.filter(run_id=run.pk).values_list("prompt_tokens", "turn"))
        compactions = Compaction.all_tenants.filter(run_id=run.pk, status="succeeded").count()
        return {
            "status": run.status, "turns": run.loop_count, "requests": len(calls), "compactions": compactions,
            "prompt_tokens": sum(p for p, _ in calls), "largest_prompt": max((p for p, _ in calls), default=0),
            "seconds": seconds,
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--window", type=int, default=32_000, help="context window (max_input_tokens), tokens")
    args = parser.parse_args()
    with_ = session(args.window)
    without = session(NO_COMPACTION_WINDOW)
    for name, r in (("with compaction", with_), ("without", without)):
        print(f"{name:16s}: run {r['status']}, {r['turns']} turns, {r['requests']} model requests "
              f"({r['compactions']} compactions), {r['prompt_tokens']:,} prompt tokens sent, "
              f"largest prompt {r['largest_prompt']:,} tokens, {r['seconds']:.1f} s")
    ratio = with_["prompt_tokens"] / without["prompt_tokens"]
    print(f"ratio: {ratio:.1%} of the tokens sent without compaction (target ≤ 40 %), window {args.window:,} tokens")


if __name__ == "__main__":
    main()
