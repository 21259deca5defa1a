"""Guardrails' CPU per turn: an agent without guardrails vs the same agent with deny-list,
regex and PII guardrails at all four points (issue 39's goal: ≤ 1 ms added per turn for the
non-model kinds).

Like bench/turn_overhead.py: a FakeLLMServer (its own process) answers with one tool call
(test_echo) per turn for 19 turns, then a final answer; 20-turn runs executed by the real
runner against the real PostgreSQL and Redis. This process's CPU time (the runner's: the fake
model's is in its own process) over the runs' execution, per turn, for both agents, runs of one
and the other alternating (``--rounds`` rounds of ``--runs`` runs each); then the guardrails'
checks alone on the texts of one turn (the tool call's arguments and result), in µs.

The guarded agent has 8 guardrails: input (deny-list, PII), tool call (regex, PII masking),
tool result (PII masking, deny-list), output (PII, regex); none trips on this conversation, so
every one runs on its text of every turn.

Run: ``.venv/bin/python bench/guardrails.py [--runs 5] [--rounds 3]``
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import statistics
import time

from _harness import BenchTenant, fake_model

from guardrails.models import Guardrail
from sessions.models import Message
from sessions.runner.loop import execute_run

TURNS = 20

GUARDRAILS = [
    ("input", "deny_list", "block", {"words": ["project falcon", "internal only", "password"]}),
    ("input", "pii", "block", {"types": ["card", "iban"]}),
    ("tool_call", "regex", "block", {"pattern": r"(?i)\brm\s+-rf\b|DROP\s+TABLE"}),
    ("tool_call", "pii", "mask", {}),
    ("tool_result", "pii", "mask", {}),
    ("tool_result", "deny_list", "block", {"words": ["begin private key", "api_key="]}),
    ("output", "pii", "block", {}),
    ("output", "regex", "block", {"pattern": r"sk-[A-Za-z0-9]{20,}"}),
]


def _guard(bench: BenchTenant) -> None:
    for i, (point, kind, action, config) in enumerate(GUARDRAILS):
        Guardrail.all_tenants.create(tenant=bench.tenant, agent=bench.agent, name=f"g{i}", point=point, kind=kind,
                                     action=action, config=config, position=i)


def _cpu_per_turn_ms(bench: BenchTenant, runs: int) -> float:
    """This process's CPU per turn over ``runs`` runs of ``bench``'s agent (ms)."""
    made = [bench.new_run() for _ in range(runs)]
    started = time.process_time()
    for run in made:
        asyncio.run(execute_run(run.pk))
    cpu = time.process_time() - started
    for run in made:
        turns = Message.all_tenants.filter(run_id=run.pk, role="assistant").count()
        assert turns == TURNS, f"run {run.pk} took {turns} turns (a guardrail tripped?)"
    return cpu / (runs * TURNS) * 1000


def _checks_alone_us() -> float:
    """The guarded agent's tool-call and tool-result guardrails on one turn's texts, µs (best of 5 × 2,000)."""
    import json
    import timeit

    from guardrails.checks import GuardrailSpec, check_text

    specs = [GuardrailSpec(name=f"g{i}", point=p, kind=k, action=a, config=c) for i, (p, k, a, c) in enumerate(GUARDRAILS)]
    arguments = json.dumps({"text": "turn 7"})
    result = "echo: turn 7"
    per_turn = [(s, arguments) for s in specs if s.point == "tool_call"] + [(s, result) for s in specs
                                                                            if s.point == "tool_result"]
    best = min(timeit.repeat(lambda: [check_text(s, t) for s, t in per_turn], number=2000, repeat=5))
    return best / 2000 * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    plain_ms: list[float] = []
    guarded_ms: list[float] = []
    with (fake_model("turns20") as base_url,
          BenchTenant(base_url, max_loop_count=TURNS + 1) as plain,
          BenchTenant(base_url, max_loop_count=TURNS + 1) as guarded):
        _guard(guarded)
        _cpu_per_turn_ms(plain, 1), _cpu_per_turn_ms(guarded, 1)  # warm-up: connections, caches
        for _ in range(args.rounds):
            plain_ms.append(_cpu_per_turn_ms(plain, args.runs))
            guarded_ms.append(_cpu_per_turn_ms(guarded, args.runs))
    plain, guarded = statistics.median(plain_ms), statistics.median(guarded_ms)
    print(f"machine: {platform.machine()}, {platform.python_implementation()} {platform.python_version()}")
    print(f"{args.rounds} rounds x {args.runs} runs x {TURNS} turns per agent (1 tool call per turn)")
    print(f"runner CPU per turn, no guardrails: {plain:.3f} ms (rounds: {', '.join(f'{v:.3f}' for v in plain_ms)})")
    print(f"runner CPU per turn, {len(GUARDRAILS)} guardrails: {guarded:.3f} ms "
          f"(rounds: {', '.join(f'{v:.3f}' for v in guarded_ms)})")
    print(f"added per turn: {guarded - plain:+.3f} ms (median of rounds)")
    print(f"the tool-call and tool-result checks alone: {_checks_alone_us():.1f} µs per turn")


if __name__ == "__main__":
    main()
