"""The web process's side of the event fan-out, alone: CPU per session event received.

``S`` sessions each have one receiver, as the WebSocket consumers of ``/ws/sessions/<id>/``
have. A thread publishes ``E`` events per session with the project's publish script
(``sessions.events``: stored in the session's stream and published on the session's pub/sub
channel in one Redis script). Measured: CPU of the event loop's thread per event received,
not the publisher's, on two paths:

- ``live`` (what the consumers use since session 15): ``sessions.live``, one subscription
  connection, a ``hiredis.Reader``, each message put in the session's ``asyncio.Queue``;
- ``layer`` (before): a channel per session in its Channels group on the events layer (the
  project's ``CHANNEL_LAYERS["events"]``, channels_redis's pub/sub layer): redis-py's reply
  parser, the layer's msgpack decoding and its per-channel queues.

Both receivers then take each message with one ``await`` of a queue. Channels' own dispatch
to a consumer (``await_many_dispatch``), which the ``layer`` path also paid, is not counted.

Run: ``.venv/bin/python bench/fanout_receive.py [--sessions 100] [--events 100] [--rounds 3] [--path live|layer|both]``
"""

from __future__ import annotations

import argparse
import asyncio
import os
import threading
import time
from functools import partial

from _harness import cpu_seconds

import redis.utils
from sessions import events


def _publish_all(session_ids: list[int], per_session: int) -> None:
    client = events._sync_redis()
    text = " ".join(f"{time.time():.6f}" for _ in range(3))  # a batch of three streamed tokens
    for _ in range(per_session):
        pipe = client.pipeline(transaction=False)
        for sid in session_ids:
            _, payload, channel = events._prepared(session_id=sid, run_id=1, type="content_token", data={"text": text})
            pipe.eval(events._PUBLISH_LUA, *events._script_args(sid, payload, channel))
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
        await live_join(events._pubsub_group_channel(sid), queue.put_nowait)  # returns once subscribed
    per_event = await _cpu_per_event(session_ids, per_session, [queue.get for queue in queues.values()])
    for sid, queue in queues.items():
        live_leave(events._pubsub_group_channel(sid), queue.put_nowait)
    return per_event


async def one_round(session_ids: list[int], per_session: int) -> float:
    layer = events.events_layer()
    channels = {sid: await layer.new_channel() for sid in session_ids}
    for sid, channel in channels.items():
        await layer.group_add(events.group_name(sid), channel)
    await asyncio.sleep(0.2)  # subscriptions in place
    per_event = await _cpu_per_event(session_ids, per_session, [partial(layer.receive, c) for c in channels.values()])
    for sid, channel in channels.items():
        await layer.group_discard(events.group_name(sid), channel)
    return per_event


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=100)
    parser.add_argument("--events", type=int, default=100, help="events per session")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--path", choices=["live", "layer", "both"], default="both")
    args = parser.parse_args()
    paths = ["live", "layer"] if args.path == "both" else [args.path]
    base = 10**9 + int(time.time()) % 10**6 * 1000  # session ids no real session has
    session_ids = list(range(base, base + args.sessions))
    kind = "hiredis" if redis.utils.HIREDIS_AVAILABLE else "redis-py's Python parser"
    print(f"reply parser: {kind}; {args.sessions} sessions x {args.events} events per round")

    async def rounds() -> None:
        for n in range(args.rounds):
            for path in paths:
                per_event = await (one_round_live if path == "live" else one_round)(session_ids, args.events)
                print(f"round {n + 1}, {path}: {per_event * 1e6:.1f} us of the receiving loop's CPU per event", flush=True)

    asyncio.run(rounds())
    client = events._sync_redis()
    for sid in session_ids:
        client.delete(*events._keys(sid))


if __name__ == "__main__":
    main()
