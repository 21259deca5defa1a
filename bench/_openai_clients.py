"""Streaming chat-completions clients for ``openai_stream_fanout.py``, in their own process (as the
apps calling the API would be).

``python bench/_openai_clients.py`` reads one JSON line on stdin::

    {"base": "http://127.0.0.1:8000/api/openai/v1", "token": "ap_…", "model": "<slug>", "n": 200,
     "timeout": 180, "sdk": false}

and sends ``n`` ``POST /chat/completions`` with ``stream: true`` at once, each a new chat, reading
every stream to ``data: [DONE]``: with plain httpx and ``json.loads`` per line (a lean client, as
``_ws_clients.py`` is for the WebSocket), or with ``"sdk": true`` the official ``openai`` SDK's
``AsyncOpenAI`` (which builds a pydantic object per chunk). Then prints one JSON line::

    {"latencies_ms": [float, …],   # per answer token: receive time − the time the model wrote it
     "tokens": [int, …],           # answer tokens received, per client
     "done": int,                  # streams that ended with the finish chunk and [DONE]
     "unfinished": [{"run": int | null, "tokens": int, "finished": bool}, …],  # the others
     "errors": [str, …]}

Token latency needs the ``timed3`` fake model (``_fake_model.py``): each answer token is the
wall-clock time (seconds since the epoch) the model wrote it. Same host, same clock.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
import time

import httpx

TIME_MARK = re.compile(r"\d{10}\.\d{6}")


class _Stream:
    """What one client saw."""

    def __init__(self) -> None:
        self.tokens = 0
        self.run: int | None = None
        self.finished = False
        self.done = False

    def content(self, text: str, now: float, latencies: list[float]) -> None:
        for mark in TIME_MARK.findall(text):
            latencies.append((now - float(mark)) * 1000.0)
            self.tokens += 1


async def _raw(http: httpx.AsyncClient, job: dict, stream: _Stream, latencies: list[float]) -> None:
    body = {"model": job["model"], "messages": [{"role": "user", "content": "go"}], "stream": True}
    async with http.stream("POST", "/chat/completions", json=body) as response:
        if response.status_code != 200:
            raise RuntimeError(f"HTTP {response.status_code}: {(await response.aread())[:200]!r}")
        async for line in response.aiter_lines():
            now = time.time()
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                stream.done = True
                return
            chunk = json.loads(line[6:])
            run = str(chunk.get("id", "")).removeprefix("chatcmpl-")
            stream.run = int(run) if run.isdigit() else stream.run
            if "error" in chunk:
                raise RuntimeError(f"error chunk: {chunk['error']}")
            for choice in chunk["choices"]:
                if choice["delta"].get("content"):
                    stream.content(choice["delta"]["content"], now, latencies)
                if choice.get("finish_reason"):
                    stream.finished = True


async def _sdk(client, job: dict, stream: _Stream, latencies: list[float]) -> None:
    async for chunk in await client.chat.completions.create(
            model=job["model"], messages=[{"role": "user", "content": "go"}], stream=True):
        now = time.time()
        stream.run = int(chunk.id.removeprefix("chatcmpl-")) if chunk.id.removeprefix("chatcmpl-").isdigit() else None
        for choice in chunk.choices:
            if choice.delta.content:
                stream.content(choice.delta.content, now, latencies)
            if choice.finish_reason:
                stream.finished = True
    stream.done = True  # the SDK's iterator ends at [DONE]


async def main() -> None:
    job = json.loads(sys.stdin.readline())
    latencies: list[float] = []
    errors: list[str] = []
    streams = [_Stream() for _ in range(job["n"])]
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    http = httpx.AsyncClient(base_url=job["base"], headers={"Authorization": f"Bearer {job['token']}"},
                             timeout=httpx.Timeout(job.get("timeout", 180)), limits=limits)
    if job.get("sdk"):
        import openai

        client = openai.AsyncOpenAI(base_url=job["base"], api_key=job["token"], max_retries=0, http_client=http)

        def one(stream: _Stream):
            return _sdk(client, job, stream, latencies)
    else:
        def one(stream: _Stream):
            return _raw(http, job, stream, latencies)

    async def guarded(i: int, stream: _Stream) -> None:
        try:
            await one(stream)
        except Exception as exc:  # reported, not raised: one broken stream must not hide the rest
            errors.append(f"client {i}: {type(exc).__name__}: {exc}"[:300])

    async with http:
        tasks = [asyncio.create_task(guarded(i, s)) for i, s in enumerate(streams)]
        _, pending = await asyncio.wait(tasks, timeout=job.get("timeout", 180) + 10)
        for task in pending:
            task.cancel()
        if pending:
            errors.append(f"{len(pending)} streams still open at the timeout")
    print(json.dumps({"latencies_ms": latencies, "tokens": [s.tokens for s in streams],
                      "done": sum(s.done and s.finished for s in streams),
                      "unfinished": [{"run": s.run, "tokens": s.tokens, "finished": s.finished}
                                     for s in streams if not (s.done and s.finished)],
                      "errors": errors}), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
