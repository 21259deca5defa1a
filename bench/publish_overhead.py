"""The worker's side of the event fan-out, alone: event-loop CPU per event published.

``S`` sessions each publish a ``content_token`` event per loop turn, ``R`` turns, through the
event loop's pipelined publisher (``sessions.events.event_publish_nowait``, as the runner's
text batcher does): the event's JSON, the publish script's command, its write to Redis, and
the reading of Redis's reply that resolves the publish's future. Measured: the loop thread's
CPU (``time.thread_time``) per event, the best of ``--rounds`` rounds, so a busy moment of the
machine counts less. Redis's own time is not in it.

Run: ``.venv/bin/python bench/publish_overhead.py [--sessions 20] [--turns 100] [--rounds 5]``
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time

from _harness import ROOT  # noqa: F401 - sets up Django and sys.path
from _stats import machine

from agent_platform.redis_clients import sync_redis
from sessions import events


async def _round(session_ids: list[int], turns: int) -> float:
    """Loop-thread CPU seconds per event of one round."""
    started = time.thread_time()
    for _ in range(turns):
        sent = [events.event_publish_nowait(session_id=sid, run_id=1, type="content_token", data={"text": " token"})
                for sid in session_ids]
        await asyncio.sleep(0.001)  # a turn of a busy loop: replies arrive while other work runs
        await asyncio.gather(*sent)
    return (time.thread_time() - started) / (turns * len(session_ids))


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=20)
    parser.add_argument("--turns", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    base = 10_000_000 + os.getpid() * 1000
    session_ids = [base + i for i in range(args.sessions)]
    await events.event_publish(session_id=session_ids[0], run_id=1, type="content_token", data={"text": "warm"})
    per_event = [await _round(session_ids, args.turns) for _ in range(args.rounds)]
    await events.publisher_aclose()
    print(machine())
    print(f"{args.sessions} sessions × {args.turns} turns, {args.rounds} rounds: loop CPU per event published "
          f"best {min(per_event) * 1e6:.1f} µs, median {sorted(per_event)[len(per_event) // 2] * 1e6:.1f} µs")
    cleanup = sync_redis()
    for sid in session_ids:
        cleanup.delete(*events.session_keys(sid))


if __name__ == "__main__":
    asyncio.run(main())
