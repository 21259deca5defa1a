"""Event-stream clients for ``scale_out.py``, in their own process (as browsers would be):
WebSocket and Server-Sent Events followers of sessions, each on the web process it is told.

``python bench/_scale_out_clients.py`` reads one JSON line on stdin::

    {"timeout": 180,
     "follow": [{"session": 1, "base": "127.0.0.1:8001", "kind": "ws" | "sse", "token": "ap_…"}, …]}

opens every stream from seq 0 (``ws://<base>/ws/sessions/<id>/?after_seq=0&token=…``, or
``GET http://<base>/api/v1/sessions/<id>/events?after_seq=0`` with ``Authorization: Bearer``),
prints ``ready`` once all are open (a WebSocket accepted, an SSE response's headers read), and
records every event until each session has seen ``run_completed``/``run_failed``/
``run_cancelled`` (or ``timeout`` seconds pass). Then prints one JSON line::

    {"latencies_ms": {"ws": [float, …], "sse": [float, …]},   # per streamed token
     "written_at": {"ws": [float, …], "sse": [float, …]},     # when the model wrote it (epoch s)
     "sessions": {"<id>": {"seqs": [int, …], "tokens": int, "done": bool, "ended_at": float | null,
                            "end": "run_completed" | "run_failed" | "run_cancelled" | null}},
     "errors": [str, …]}

The figures are defined as in ``_ws_clients.py`` (``concurrent_runs.py``): a token's latency
is the time this process received the frame carrying it minus the wall-clock time the
``timed3`` fake model wrote it (same host, same clock); ``ended_at`` is when the run's end
frame arrived (seconds since the epoch), ``end`` its type.

A browser on its own machine spends a fraction of a millisecond on a frame; these clients share
the platform's cores, so they are made cheap: uvloop, and an SSE response read in whatever chunks
the socket gives rather than line by line (:func:`sse_data`; bench/README.md has what each
cost before).
"""

from __future__ import annotations

import asyncio
import codecs
import json
import sys
import time

import aiohttp
import uvloop
from websockets.asyncio.client import connect

END_TYPES = {"run_completed", "run_failed", "run_cancelled"}


class _Follower:
    """Shared bookkeeping of all streams: records, latencies by kind, errors, readiness."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.sessions: dict[str, dict] = {}
        self.latencies: dict[str, list[float]] = {"ws": [], "sse": []}
        self.written: dict[str, list[float]] = {"ws": [], "sse": []}
        self.errors: list[str] = []
        self.ready = asyncio.Event()
        self._opened = 0

    def opened(self) -> None:
        self._opened += 1
        if self._opened == self.total:
            self.ready.set()

    def record(self, session_id: int) -> dict:
        rec = self.sessions[str(session_id)] = {"seqs": [], "tokens": 0, "done": False, "ended_at": None, "end": None}
        return rec

    def frame(self, kind: str, rec: dict, frame: dict, now: float) -> bool:
        """Account one session frame received at ``now``; True when it ends the run."""
        if "seq" not in frame:
            return False
        rec["seqs"].append(frame["seq"])
        if frame["type"] == "content_token":
            for token in frame["data"]["text"].split():
                try:
                    written = float(token)
                except ValueError:
                    continue
                self.latencies[kind].append((now - written) * 1000.0)
                self.written[kind].append(written)
                rec["tokens"] += 1
        if frame["type"] in END_TYPES:
            rec["done"], rec["ended_at"], rec["end"] = True, now, frame["type"]
            return True
        return False

    def failed(self, session_id: int, exc: BaseException, was_open: bool) -> None:
        self.errors.append(f"session {session_id}: {type(exc).__name__}: {exc}")
        if not was_open:
            self.opened()  # one broken stream must not keep the rest from starting


def sse_data(buffered: str) -> tuple[list[str], str]:
    """The data of each complete Server-Sent Events message in ``buffered`` (its ``data:``
    lines joined by newlines; a message without data is skipped), and what is left of an
    incomplete one. A blank line ends a message; ``sessions/sse.py`` ends lines with ``\\n``."""
    *messages, rest = buffered.split("\n\n")
    payloads = []
    for message in messages:
        data = [line[5:].removeprefix(" ") for line in message.split("\n") if line.startswith("data:")]
        if data:
            payloads.append("\n".join(data))
    return payloads, rest


async def _follow_ws(f: _Follower, base: str, token: str, session_id: int) -> None:
    rec, was_open = f.record(session_id), False
    try:
        url = f"ws://{base}/ws/sessions/{session_id}/?after_seq=0&token={token}"
        async with connect(url, max_size=None, open_timeout=60, ping_interval=None) as ws:
            was_open = True
            f.opened()
            async for raw in ws:
                if f.frame("ws", rec, json.loads(raw), time.time()):
                    return
    except Exception as exc:  # reported, not raised
        f.failed(session_id, exc, was_open)


async def _follow_sse(f: _Follower, http: aiohttp.ClientSession, base: str, token: str, session_id: int) -> None:
    rec, was_open = f.record(session_id), False
    try:
        async with http.get(f"http://{base}/api/v1/sessions/{session_id}/events", params={"after_seq": "0"},
                            headers={"Authorization": f"Bearer {token}", "Accept": "text/event-stream"}) as resp:
            if resp.status != 200:
                raise RuntimeError(f"HTTP {resp.status}: {(await resp.text())[:200]}")
            was_open = True
            f.opened()
            buffered, decoder = "", codecs.getincrementaldecoder("utf-8")()
            async for chunk in resp.content.iter_any():  # whatever the socket had, not a line at a time
                now = time.time()
                payloads, buffered = sse_data(buffered + decoder.decode(chunk))
                for payload in payloads:
                    if f.frame("sse", rec, json.loads(payload), now):
                        return
    except Exception as exc:  # reported, not raised
        f.failed(session_id, exc, was_open)


async def main() -> None:
    job = json.loads(sys.stdin.readline())
    follow = job["follow"]
    f = _Follower(len(follow))
    timeout = aiohttp.ClientTimeout(total=None, connect=60, sock_read=None)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout) as http:
        tasks = [
            asyncio.create_task(_follow_ws(f, item["base"], item["token"], item["session"]) if item["kind"] == "ws"
                                else _follow_sse(f, http, item["base"], item["token"], item["session"]))
            for item in follow
        ]
        await f.ready.wait()
        print("ready", flush=True)
        _, pending = await asyncio.wait(tasks, timeout=job.get("timeout", 180))
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
    print(json.dumps({"latencies_ms": f.latencies, "written_at": f.written, "sessions": f.sessions,
                      "errors": f.errors}), flush=True)


if __name__ == "__main__":
    uvloop.run(main())
