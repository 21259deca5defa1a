"""The web process's side of the event fan-out, alone: CPU per session event received.

``S`` sessions each have one receiver, as the WebSocket consumers of ``/ws/sessions/<id>/``
have. A thread publishes ``E`` events per session with the project's publish script
(``sessions.events``: stored in the session's stream and published on the session's pub/sub
channel in one Redis script). Measured: CPU of the event loop's thread per event received,
not the publisher's, on the path the consumers use (``live``): ``sessions.live``, one
subscription connection (its own asyncio streams), a ``hiredis.Reader``, each message put in
the session's ``asyncio.Queue`` and taken with one ``await``.

The ``layer`` path measured until issue 24 (a channel per session on channels_redis's pub/sub
layer, 26-39 us per event against 6-10 us; bench/README.md, session 15) is gone: events are
published on a channel of the project's own (``sessions.events.live_channel``), not on
channels_redis's private group channel names, and no channel layer carries them.

Run: ``.venv/bin/python bench/fanout_receive.py [--sessions 100] [--events 100] [--rounds 3]``
"""

from __future__ import annotations

import argparse
import asyncio
import os
import threading
import time

import redis.utils
from _harness import cpu_seconds

from agent_platform.redis_clients import sync_redis
from sessions import events


def _publish_all(session_ids: list[int], per_session: int) -> None:
    client = sync_redis()
    text = " ".join(f"{time.time():.6f}" for _ in range(3))  # a batch of three streamed tokens
    for _ in range(per_session):
        pipe = client.pipeline(transaction=False)
        for sid in session_ids:
            _, payload = events._prepared(session_id=sid, run_id=1, type="content_token", data={"text": text})
            pipe.eval(events._PUBLISH_LUA, *events._script_args(sid, payload))
        pipe.execute()


async def _cpu_per_event(session_ids: list[int], per_session: int, receives: list) -> float:
    """Publish ``per_session`` events to every session from a thread; the loop thread's CPU
    per event, until each ``receive()`` (one per session) has returned ``per_session`` times."""

    async def receive_all(receive) -> None:
        for _ in range(per_session):
            await receive()

    loop_thread = threading.get_native_id()
    before = cpu_seconds(os.getpid(), loop_thread)
    publisher = threading.Thread(target=_publish_all, args=(session_ids, per_session))
    receivers = [asyncio.create_task(receive_all(receive)) for receive in receives]
    publisher.start()
    await asyncio.wait_for(asyncio.gather(*receivers), timeout=120)
    cpu = cpu_seconds(os.getpid(), loop_thread) - before
    publisher.join()
    return cpu / (len(session_ids) * per_session)


async def one_round_live(session_ids: list[int], per_session: int) -> float:
    from sessions.live import live_join, live_leave

    queues = {sid: asyncio.Queue() for sid in session_ids}
    for sid, queue in queues.items():
        await live_join(events.live_channel(sid), queue.put_nowait)  # returns once subscribed
    per_event = await _cpu_per_event(session_ids, per_session, [queue.get for queue in queues.values()])
    for sid, queue in queues.items():
        live_leave(events.live_channel(sid), queue.put_nowait)
    return per_event


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=100)
    parser.add_argument("--events", type=int, default=100, help="events per session")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    base = 10**9 + int(time.time()) % 10**6 * 1000  # session ids no real session has
    session_ids = list(range(base, base + args.sessions))
    kind = "hiredis" if redis.utils.HIREDIS_AVAILABLE else "redis-py's Python parser"
    print(f"reply parser: {kind}; {args.sessions} sessions x {args.events} events per round")

    async def rounds() -> None:
        for n in range(args.rounds):
            per_event = await one_round_live(session_ids, args.events)
            print(f"round {n + 1}, live: {per_event * 1e6:.1f} us of the receiving loop's CPU per event", flush=True)

    asyncio.run(rounds())
    client = sync_redis()
    for sid in session_ids:
        client.delete(*events.session_keys(sid))


if __name__ == "__main__":
    main()
