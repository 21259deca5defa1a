"""A listener of every session's live channel for ``scale_out.py --probe``, in its own process:
the worker's half of token → client latency.

``python bench/_live_probe.py`` reads one JSON line on stdin::

    {"redis": "redis://127.0.0.1:6379/0", "pattern": "ap:session:*:live"}

subscribes to ``pattern`` (``PSUBSCRIBE``), prints ``ready``, and records, for every answer
token of a ``content_token`` event published on a matching channel, the time this process
received it minus the time the ``timed3`` fake model wrote it (same host, same clock): model →
worker → Redis ``PUBLISH`` → here, without the web process and the client. When a second line
arrives on stdin it stops and prints one JSON line::

    {"latencies_ms": [float, …], "written_at": [float, …], "to_event_ms": [float, …]}

``to_event_ms`` splits each latency further: the event's ``ts`` (when the worker built the
event) minus the time the model wrote the token, so ``latencies_ms - to_event_ms`` is the
publish itself (the worker's pipelined ``EVAL`` and Redis).

The events are those ``sessions.events`` publishes: a msgpack map ``{"type": "session.event",
"seq": int, "body": "<frame JSON without seq>"}``. This process is idle but for these messages
(~30,000 per 600 runs), so its own scheduling delay is small next to the web process's; it is
still on the same saturated cores, and its figure is an upper bound of the worker's half.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

import msgpack
import redis.asyncio as aioredis


async def main() -> None:
    job = json.loads(sys.stdin.readline())
    client = aioredis.Redis.from_url(job["redis"], client_name="bench-live-probe")
    pubsub = client.pubsub(ignore_subscribe_messages=True)
    await pubsub.psubscribe(job["pattern"])
    latencies: list[float] = []
    written_at: list[float] = []
    to_event: list[float] = []
    loop = asyncio.get_running_loop()
    stop = loop.run_in_executor(None, sys.stdin.readline)
    print("ready", flush=True)
    while not stop.done():
        message = await pubsub.get_message(timeout=0.2)
        if message is None or message["type"] != "pmessage":
            continue
        now = time.time()
        event = msgpack.unpackb(message["data"])
        body = event.get("body")
        if not isinstance(body, str) or '"content_token"' not in body:
            continue
        frame = json.loads(body)
        if frame.get("type") != "content_token":
            continue
        for token in frame["data"]["text"].split():
            try:
                written = float(token)
            except ValueError:
                continue
            latencies.append((now - written) * 1000.0)
            written_at.append(written)
            to_event.append((frame["ts"] - written) * 1000.0)
    await pubsub.aclose()
    await client.aclose()
    print(json.dumps({"latencies_ms": latencies, "written_at": written_at, "to_event_ms": to_event}), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
