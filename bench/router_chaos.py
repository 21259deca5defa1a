"""Chaos: a flaky primary, a healthy fallback, the real shared health in Redis.

Shape: **single model calls** (one ``Router.stream`` each, 200 by default), ``--concurrency``
of them in flight at a time, all sharing one ``RedisEntryHealth`` (as the workers of one
deployment would).

* Primary (its own child process): fails 50 % of the requests it gets, evenly split between
  HTTP 429 with ``Retry-After: 0``, HTTP 500, and a hang (no bytes at all) that the entry's
  0.3 s first-token timeout cuts; the rest answer normally. Seeded, so runs are comparable.
  ``max_retries=2``.
* Fallback (another child process): always answers.

Reported for the run with shared health, and for the same traffic without health (every
call discovers the primary's state by itself): share of calls completed (target >= 99 %),
mean extra attempts per call (attempts - 1), retries, fallbacks, calls that skipped the
primary because its breaker was open, latency p50/p95, wall time.

Run: ``.venv/bin/python bench/router_chaos.py [--calls 200] [--concurrency 10] [--spacing-ms 0]``
(no Django; Redis at 127.0.0.1:6379). With ``--spacing-ms 300`` the 200 calls spread over a
minute, so the primary's 30 s cooldown expires, half-open probes go out and failed probes
double the cooldown.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import argparse  # noqa: E402
import asyncio  # noqa: E402
import random  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
import uuid  # noqa: E402
from collections import Counter  # noqa: E402
from contextlib import contextmanager  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from typing import Any  # noqa: E402

from _stats import machine, percentile  # noqa: E402

from llm.config import RouteEntryConfig  # noqa: E402
from llm.errors import LLMError  # noqa: E402
from llm.health import RedisEntryHealth  # noqa: E402
from llm.providers import openai_compat  # noqa: E402
from llm.records import AttemptRecord  # noqa: E402
from llm.router import Router  # noqa: E402
from llm.testing import Fail, FakeLLMServer, Hang, Reply, Step  # noqa: E402
from llm.types import ChatMessage, Completion  # noqa: E402

FIRST_TOKEN_TIMEOUT_SECONDS = 0.3
FAILURE_SHARE = 0.5
MESSAGES = [ChatMessage(role="user", content="Status report, please.")]


def serve(role: str, seed: int) -> None:
    """Child process: the flaky primary or the healthy fallback; prints its base URL."""
    rng = random.Random(seed)
    lock = threading.Lock()
    failures: list[Step] = [
        Fail(429, body={"error": {"message": "Rate limit reached", "type": "requests", "code": "rate_limit_exceeded"}},
             headers={"Retry-After": "0"}),
        Fail(500, body={"error": {"message": "The server had an error processing your request.", "type": "server_error"}}),
        Hang(30),
    ]

    def primary(body: dict[str, Any]) -> Step:
        with lock:
            if rng.random() < FAILURE_SHARE:
                return rng.choice(failures)
        return Reply("primary: all systems nominal", chunk_size=8)

    def fallback(body: dict[str, Any]) -> Step:
        return Reply("fallback: all systems nominal", chunk_size=8)

    with FakeLLMServer() as server:
        server.respond(primary if role == "primary" else fallback)
        print(server.base_url, flush=True)
        sys.stdin.read()


@contextmanager
def server_process(role: str, seed: int) -> Any:
    proc = subprocess.Popen(
        [sys.executable, __file__, "--serve", role, "--seed", str(seed)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        yield proc.stdout.readline().strip()  # type: ignore[union-attr]
    finally:
        proc.stdin.close()  # type: ignore[union-attr]
        proc.wait(timeout=10)






@dataclass
class Tally:
    completed: int = 0
    failed: Counter[str] = field(default_factory=Counter)
    attempts: list[int] = field(default_factory=list)
    latencies_ms: list[float] = field(default_factory=list)
    events: Counter[str] = field(default_factory=Counter)
    attempt_classes: Counter[str] = field(default_factory=Counter)
    answered_by: Counter[int] = field(default_factory=Counter)


async def run_chaos(
    primary_url: str, fallback_url: str, *, calls: int, concurrency: int, with_health: bool, spacing_seconds: float
) -> tuple[Tally, float]:
    import redis.asyncio

    route = [
        RouteEntryConfig(
            index=0, provider_name="flaky", base_url=primary_url, api_key="sk-chaos", model="primary",
            max_input_tokens=8192, max_output_tokens=256, connect_timeout_seconds=2, read_timeout_seconds=5,
            first_token_timeout_seconds=FIRST_TOKEN_TIMEOUT_SECONDS, max_retries=2,
            entry_key=f"chaos:{uuid.uuid4().hex}:primary",
        ),
        RouteEntryConfig(
            index=1, provider_name="steady", base_url=fallback_url, api_key="sk-chaos", model="fallback",
            max_input_tokens=8192, max_output_tokens=256, connect_timeout_seconds=2, read_timeout_seconds=5,
            max_retries=2, entry_key=f"chaos:{uuid.uuid4().hex}:fallback",
        ),
    ]
    client = redis.asyncio.Redis(host="127.0.0.1", port=6379)
    prefix = f"bench:router-chaos:{uuid.uuid4().hex}"
    health = RedisEntryHealth(client, prefix=prefix) if with_health else None
    tally = Tally()
    semaphore = asyncio.Semaphore(concurrency)

    async def one(i: int) -> None:
        records: list[AttemptRecord] = []

        async def record(r: AttemptRecord) -> None:
            records.append(r)
            tally.attempt_classes[r.error_class or "succeeded"] += 1

        async def on_event(name: str, data: dict[str, Any]) -> None:
            tally.events[name if name == "model_retry" else f"{name}:{data['error_class']}"] += 1

        router = Router(route, record=record, health=health, on_event=on_event, rng=random.Random(i))
        async with semaphore:
            started = time.perf_counter()
            try:
                async for event in router.stream(MESSAGES, []):
                    if isinstance(event, Completion):
                        tally.completed += 1
                        tally.answered_by[event.entry_index] += 1
            except LLMError as exc:
                tally.failed[type(exc).__name__] += 1
            tally.latencies_ms.append((time.perf_counter() - started) * 1000)
            tally.attempts.append(len(records))

    async def paced(i: int) -> None:
        await asyncio.sleep(i * spacing_seconds)  # call i starts i × spacing after the first
        await one(i)

    started = time.perf_counter()
    try:
        await asyncio.gather(*(paced(i) for i in range(calls)))
    finally:
        wall = time.perf_counter() - started
        keys = [k async for k in client.scan_iter(match=f"{prefix}:*")]
        if keys:
            await client.delete(*keys)
        await client.aclose()
        await openai_compat.aclose_clients()
    return tally, wall


def report(title: str, tally: Tally, wall: float, calls: int) -> None:
    share = tally.completed / calls
    extra = [a - 1 for a in tally.attempts]
    print(f"\n{title}")
    print(f"  completed: {tally.completed}/{calls} = {share:.1%} (target >= 99%): {'OK' if share >= 0.99 else 'BELOW'}")
    if tally.failed:
        print(f"  failed: {dict(tally.failed)}")
    print(f"  mean extra attempts per call: {statistics.fmean(extra):.3f} (max {max(extra)}); "
          f"attempts {sum(tally.attempts)} for {calls} calls")
    print(f"  answered by: primary {tally.answered_by[0]}, fallback {tally.answered_by[1]}")
    print(f"  attempt outcomes: {dict(sorted(tally.attempt_classes.items()))}")
    print(f"  events: {dict(sorted(tally.events.items()))}")
    print(f"  latency per call: p50 {percentile(tally.latencies_ms, 0.5):.1f} ms, p95 {percentile(tally.latencies_ms, 0.95):.1f} ms; "
          f"wall {wall:.1f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument("--seed", type=int, default=20240601)
    parser.add_argument("--spacing-ms", type=float, default=0.0,
                        help="start calls this far apart (default 0: all queued at once); e.g. 300 spreads 200 calls "
                             "over 60 s so the primary's cooldowns expire and half-open probes happen")
    parser.add_argument("--serve", choices=["primary", "fallback"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, args.seed)
        return
    print(f"machine: {machine()}")
    print(f"shape: {args.calls} single model calls, at most {args.concurrency} in flight, started "
          f"{args.spacing_ms:g} ms apart; primary fails {FAILURE_SHARE:.0%} "
          f"(429 Retry-After 0 / 500 / hang cut by a {FIRST_TOKEN_TIMEOUT_SECONDS:g} s first-token timeout), "
          f"max_retries=2; healthy fallback")
    for with_health in (True, False):
        with server_process("primary", args.seed) as primary, server_process("fallback", args.seed) as fallback:
            tally, wall = asyncio.run(
                run_chaos(
                    primary, fallback, calls=args.calls, concurrency=args.concurrency, with_health=with_health,
                    spacing_seconds=args.spacing_ms / 1000,
                )
            )
        title = "with RedisEntryHealth (shared breaker)" if with_health else "without health (each call on its own)"
        report(title, tally, wall, args.calls)


if __name__ == "__main__":
    main()
