"""Model call records' cost per turn: the same 20-turn runs as ``turn_overhead.py`` with the
tenant's ``record_llm_bodies`` off and on, in alternating rounds.

A FakeLLMServer (its own process) answers each turn at once with one tool call (test_echo) for 19
turns, then answers; the runs execute one after another through the real runner, PostgreSQL and
Redis. Each round prints, for off and then on: this process's CPU per turn
(``time.process_time()`` over the runs' execution: the loop and its database threads; the fake
model is another process), the turn gaps (p50/p95 between consecutive assistant messages) and how
many records were written (off: none; on: one per model call). Then the parts alone: the capture
and the body columns of one turn's attempt (``body_columns``: serialising, the key's redaction,
the byte count), best of five rounds.

Run: ``.venv/bin/python bench/llm_bodies.py [--runs 5] [--rounds 3]``
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import statistics
import time
import timeit

from _harness import BenchTenant, fake_model, summary

from sessions.models import LLMCallBody, Message
from sessions.runner.loop import execute_run
from tenants.models import Tenant

TURNS = 20


def _round(bench: BenchTenant, *, runs: int, on: bool) -> tuple[float, list[float], int]:
    """``runs`` runs with recording ``on``: (process CPU ms per turn, turn gaps in ms, records written)."""
    Tenant.objects.filter(pk=bench.tenant.pk).update(record_llm_bodies=on)
    before = LLMCallBody.all_tenants.filter(tenant_id=bench.tenant.pk).count()
    made = [bench.new_run() for _ in range(runs)]
    cpu = time.process_time()
    for run in made:
        asyncio.run(execute_run(run.pk))
    cpu_ms = (time.process_time() - cpu) * 1000 / (runs * TURNS)
    gaps: list[float] = []
    for run in made:
        stamps = list(Message.all_tenants.filter(run_id=run.pk, role="assistant").order_by("position")
                      .values_list("created_at", flat=True))
        assert len(stamps) == TURNS, f"run {run.pk} took {len(stamps)} turns"
        gaps += [(b - a).total_seconds() * 1000 for a, b in zip(stamps, stamps[1:], strict=False)]
    written = LLMCallBody.all_tenants.filter(tenant_id=bench.tenant.pk).count() - before
    return cpu_ms, gaps, written


def _parts() -> str:
    """The work recording adds per model call, alone: a turn-sized request's body columns."""
    import json

    from llm.records import AttemptRecord, BodyCapture
    from sessions.llm_bodies import body_columns

    messages = [{"role": "system", "content": "You are a test agent."}, {"role": "user", "content": "go"}]
    for i in range(10):
        messages += [{"role": "assistant", "content": "", "tool_calls": [
            {"id": f"c{i}", "type": "function", "function": {"name": "test_echo", "arguments": '{"text": "x"}'}}]},
            {"role": "tool", "tool_call_id": f"c{i}", "content": "echo: x"}]
    request = json.dumps({"model": "m", "messages": messages, "stream": True, "tools": []})

    def one() -> None:
        capture = BodyCapture(secrets=("sk-bench-key-0123456789",))
        capture.request = request
        capture.response = {"object": "chat.completion", "choices": [{"index": 0, "message": {
            "role": "assistant", "content": "", "tool_calls": []}, "finish_reason": "tool_calls"}],
            "usage": {"prompt_tokens": 100, "completion_tokens": 10}}
        body_columns(AttemptRecord(entry_index=0, provider_name="p", model="m", attempt=1, latency_ms=1,
                                   first_token_ms=1, prompt_tokens=1, completion_tokens=1, usage_estimated=False,
                                   status="succeeded", error_class=None, error="", bodies=capture))

    best = min(timeit.repeat(one, number=2000, repeat=5)) / 2000
    return (f"parts alone: capture + body columns of a {len(request):,}-byte request (20 messages) "
            f"{best * 1e6:.1f} µs per model call")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    cpu: dict[bool, list[float]] = {False: [], True: []}
    with fake_model("turns20") as base_url, BenchTenant(base_url, max_loop_count=TURNS + 1) as bench:
        asyncio.run(execute_run(bench.new_run().pk))  # warm-up run, not counted
        for number in range(1, args.rounds + 1):
            for on in (False, True):
                cpu_ms, gaps, written = _round(bench, runs=args.runs, on=on)
                cpu[on].append(cpu_ms)
                print(f"round {number} record_llm_bodies={'on ' if on else 'off'}: CPU {cpu_ms:.2f} ms per turn, "
                      f"turns {summary(gaps)}, records written {written}")
    print(f"machine: {platform.machine()}, {platform.python_implementation()} {platform.python_version()}")
    off, on = statistics.fmean(cpu[False]), statistics.fmean(cpu[True])
    print(f"mean CPU per turn: off {off:.2f} ms, on {on:.2f} ms ({(on - off) / off * 100:+.1f} %)")
    print(_parts())


if __name__ == "__main__":
    main()
