"""Platform overhead per turn.

A FakeLLMServer (in its own process) answers instantly with one tool call per turn (test_echo) for 19 turns, then
a final answer: 20-turn runs, executed one after another by the real runner against the
real PostgreSQL and Redis. A turn's time is the gap between consecutive assistant messages
of a run: model request and stream, persistence (messages, tool calls, LLM calls), tool
execution and every event published. The fake model's own time is near zero, so this is
the platform's overhead.

Run: ``.venv/bin/python bench/turn_overhead.py [--runs 10] [--output-schema] [--routing-rules] [--tracing on]
[--worker-tuning] [--no-parts] [--model-timeout SECONDS]``

``--tracing off|on|on-libraries|alternate``: prints the process CPU per turn with the platform's spans
off or on (bench/_tracing_mode.py; issue 40's goal: off adds nothing measurable, on at most 5 %);
``alternate``: off and on run by run in this one process, compared pair by pair.

``--worker-tuning``: the interpreter tuned as the worker's run host tunes it
(:func:`sessions.runner.host.tune_interpreter_for_runs`: ``gc.freeze()`` of everything alive once
set up, ``RUN_HOST_GC_THRESHOLDS``, ``RUN_HOST_SWITCH_INTERVAL_MS``) before the runs; without it,
CPython's defaults, whose full collections walk the whole of Django (bench/README.md, "Tracing cost").

``--no-parts``: skip the microbenchmarks of the parts printed after the runs (the tracing mode's
off-path / on-path costs, the ``--output-schema`` / ``--routing-rules`` checks): the process then runs
only the set-up and the runs, as ``bench/tracing_instructions.py`` needs for its instruction counts.
``--model-timeout SECONDS``: the agent's route entries' connect and read (idle) timeouts for this
benchmark's tenant (default: the test factory's 2 s and 5 s); for a process slowed down by Valgrind,
whose model client would otherwise give up (``model_unavailable``). Production defaults are untouched.

``--output-schema``: the agent has an output JSON Schema (issue 39's structured output: the
final answer is JSON, checked once per run; every turn tells the model the format);
``--routing-rules``: the agent has five routing rules (:func:`_rules`) that never match: every turn
matches them and stays on the agent's route. Either prints, too, the CPU of the non-model
checks by themselves (the answer's schema check; the rules' choice per turn), in µs.
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import time

from _harness import BenchTenant, fake_model, summary
from _pg_stats import DatabaseWatch
from _tracing_mode import MODES, TracingMode, off_path_costs, on_path_costs

from sessions.models import Message, Run
from sessions.runner.loop import execute_run

TURNS = 20

OUTPUT_SCHEMA = {
    "type": "object",
    "properties": {"done": {"type": "boolean"}, "turns": {"type": "integer", "minimum": 1},
                   "summary": {"type": "string", "maxLength": 500}},
    "required": ["done", "turns", "summary"],
    "additionalProperties": False,
}


def _rules(route: str) -> list[dict]:
    """Five rules on ``route`` that never match a turn of this benchmark (each kind of condition but images)."""
    return [
        {"name": "code", "route": route, "regex": r"(?i)\b(python|javascript|sql)\b"},
        {"name": "money", "route": route, "keywords": ["refund", "invoice", "chargeback"]},
        {"name": "pictures", "route": route, "images": True},
        {"name": "long", "route": route, "min_tokens": 1_000_000},
        {"name": "saver", "route": route, "min_budget_share": 0.9},
    ]


def _check_costs(*, output_schema: bool, routing_rules: bool) -> list[str]:
    """The non-model checks alone, CPU µs per call (best of 5 rounds of 2,000 calls)."""
    import timeit
    from types import SimpleNamespace

    from agents.routing import TurnFacts, rule_choose, rules_compile
    from llm.types import ChatMessage
    from sessions.runner.routing import turn_facts
    from sessions.runner.structured_output import native_response_format, output_problem

    lines = []
    fmt = {"type": "json_schema", "name": "answer", "schema": OUTPUT_SCHEMA, "strict": False}
    if output_schema:
        from _fake_model import JSON_ANSWER

        check = min(timeit.repeat(lambda: output_problem(fmt, JSON_ANSWER), number=2000, repeat=5)) / 2000
        per_turn = min(timeit.repeat(lambda: native_response_format(fmt), number=2000, repeat=5)) / 2000
        lines.append(f"output schema: the answer's check {check * 1e6:.1f} µs (once per answer); "
                     f"the format per turn {per_turn * 1e6:.1f} µs")
    if routing_rules:
        rules = rules_compile(_rules("r"))
        history = SimpleNamespace(messages=[ChatMessage(role="user", content="go " * 50)] + [
            ChatMessage(role="assistant", content="turn") for _ in range(TURNS)])
        spec = SimpleNamespace(routing_rules=rules, max_cost_per_run_usd_micros=None, run_id=1)
        facts = TurnFacts(text="go " * 50, has_images=False, prompt_tokens=500, budget_share=0.1)

        loop = asyncio.new_event_loop()
        both = min(timeit.repeat(lambda: (loop.run_until_complete(turn_facts(spec, history, None)),
                                          rule_choose(rules, facts)), number=2000, repeat=5)) / 2000
        loop.close()
        lines.append(f"routing rules (5, none matching): the turn's facts and choice {both * 1e6:.1f} µs per turn; "
                     "an agent without rules: skipped (no call)")
    return lines



def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--db", type=int, nargs="?", const=25, metavar="TOP",
                        help="also print PostgreSQL's CPU per run and turn over the runs' execution (the whole "
                             "cluster: a throwaway one tells this benchmark's) and, if pg_stat_statements is "
                             "loaded, its TOP statements per run")
    parser.add_argument("--output-schema", action="store_true", help="the agent has an output JSON Schema")
    parser.add_argument("--routing-rules", action="store_true", help="the agent has five routing rules, none matching")
    parser.add_argument("--tracing", choices=MODES, default="off",
                        help="also print the process CPU per turn with tracing off / on (bench/_tracing_mode.py)")
    parser.add_argument("--worker-tuning", action="store_true",
                        help="the worker's interpreter tuning (gc.freeze, its GC thresholds and switch interval)")
    parser.add_argument("--no-parts", action="store_true",
                        help="skip the parts' microbenchmarks after the runs (the tracing paths' and checks' costs)")
    parser.add_argument("--model-timeout", type=float, metavar="SECONDS",
                        help="the route entries' connect and read timeouts (e.g. under Valgrind); default: 2 s, 5 s")
    args = parser.parse_args()
    tracing = TracingMode(args.tracing)
    tracing.install()
    if args.worker_tuning:
        from sessions.runner.host import tune_interpreter_for_runs

        tune_interpreter_for_runs()
    fields = {"output_schema": OUTPUT_SCHEMA} if args.output_schema else {}
    with (fake_model("turns20json" if args.output_schema else "turns20") as base_url,
          BenchTenant(base_url, max_loop_count=TURNS + 1, **fields) as bench):
        if args.model_timeout is not None:
            bench.agent.route.entries.update(connect_timeout_seconds=args.model_timeout,
                                             read_timeout_seconds=args.model_timeout)
        if args.routing_rules:
            bench.agent.routing_rules = _rules(bench.agent.route.name)
            bench.agent.full_clean()
            bench.agent.save()
        gaps_ms: list[float] = []
        db = DatabaseWatch(turns_per_run=TURNS, top=args.db) if args.db is not None else None
        started = time.perf_counter()
        runs = [bench.new_run() for _ in range(args.runs)]  # made first, so --db counts the runs' execution only
        if db is not None:
            db.start()
        tracing.start()
        for run in runs:
            tracing.run_starts()
            asyncio.run(execute_run(run.pk))
            tracing.run_ended()
        tracing.stop()
        if db is not None:
            db.stop()
        for run in runs:
            stamps = list(
                Message.all_tenants.filter(run_id=run.pk, role="assistant").order_by("position")
                .values_list("created_at", flat=True)
            )
            if len(stamps) != TURNS:
                ended = Run.all_tenants.get(pk=run.pk)
                raise SystemExit(f"run {run.pk} took {len(stamps)} turns: {ended.status} {ended.reason} {ended.error}")
            if args.output_schema:
                assert Run.all_tenants.get(pk=run.pk).structured["turns"] == 20, f"run {run.pk}: no structured answer"
            gaps_ms += [(b - a).total_seconds() * 1000 for a, b in zip(stamps, stamps[1:], strict=False)]
        wall = time.perf_counter() - started
    print(f"machine: {platform.machine()}, {platform.python_implementation()} {platform.python_version()}")
    print(f"{args.runs} runs x {TURNS} turns (1 tool call per turn) in {wall:.1f} s")
    print(f"per-turn overhead: {summary(gaps_ms)}")
    print(tracing.report(args.runs * TURNS))
    if not args.no_parts:
        print(off_path_costs() if args.tracing == "off" else on_path_costs())
        for line in _check_costs(output_schema=args.output_schema, routing_rules=args.routing_rules):
            print(line)
    if db is not None:
        print(db.report(args.runs))


if __name__ == "__main__":
    main()
