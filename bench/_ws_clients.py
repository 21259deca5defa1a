"""WebSocket clients for benchmarks, in their own process (as browsers would be).

``python bench/_ws_clients.py`` reads one JSON line on stdin::

    {"url": "ws://127.0.0.1:8000", "token": "ap_…", "sessions": [1, 2, …], "timeout": 120}

opens ``/ws/sessions/<id>/?after_seq=0&token=…`` for every session (replay from the start,
then live), prints ``ready`` once all are open, and records every frame until each session
has seen a ``run_completed``/``run_failed``/``run_cancelled`` frame (or ``timeout`` seconds
pass). Then prints one JSON line::

    {"latencies_ms": [float, …],          # per streamed token: receive time − send time
     "sessions": {"<id>": {"seqs": [int, …], "tokens": int, "done": bool}},
     "errors": [str, …]}

Token latency needs the ``timed3`` fake model (bench/_fake_model.py): each content token is
the wall-clock time (seconds since the epoch) the model wrote it; the latency of a token is
the time this process received the frame carrying it minus that. Same host, same clock.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

from websockets.asyncio.client import connect

END_TYPES = {"run_completed", "run_failed", "run_cancelled"}


async def _follow(url: str, session_id: int, ready: asyncio.Event, opened: list[int], total: int,
                  out: dict, latencies: list[float], errors: list[str]) -> None:
    record = out[str(session_id)] = {"seqs": [], "tokens": 0, "done": False}
    try:
        async with connect(url, max_size=None, open_timeout=60, ping_interval=None) as ws:
            opened.append(session_id)
            if len(opened) == total:
                ready.set()
            async for raw in ws:
                now = time.time()
                frame = json.loads(raw)
                if "seq" not in frame:
                    continue
                record["seqs"].append(frame["seq"])
                if frame["type"] == "content_token":
                    for token in frame["data"]["text"].split():
                        try:
                            latencies.append((now - float(token)) * 1000.0)
                        except ValueError:
                            continue
                        record["tokens"] += 1
                if frame["type"] in END_TYPES:
                    record["done"] = True
                    return
    except Exception as exc:  # reported, not raised: one broken socket must not hide the rest
        errors.append(f"session {session_id}: {type(exc).__name__}: {exc}")
        if not ready.is_set():
            opened.append(session_id)
            if len(opened) == total:
                ready.set()


async def main() -> None:
    job = json.loads(sys.stdin.readline())
    base, token, sessions = job["url"], job["token"], job["sessions"]
    out: dict = {}
    latencies: list[float] = []
    errors: list[str] = []
    ready = asyncio.Event()
    opened: list[int] = []
    tasks = [
        asyncio.create_task(_follow(f"{base}/ws/sessions/{sid}/?after_seq=0&token={token}", sid, ready, opened,
                                    len(sessions), out, latencies, errors))
        for sid in sessions
    ]
    await ready.wait()
    print("ready", flush=True)
    done, pending = await asyncio.wait(tasks, timeout=job.get("timeout", 120))
    for task in pending:
        task.cancel()
    print(json.dumps({"latencies_ms": latencies, "sessions": out, "errors": errors}), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
