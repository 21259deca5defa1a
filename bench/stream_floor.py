"""The floor under concurrent_runs.py: only the model adapter, no database, no events.

N answers are streamed at once from the ``timed3`` fake model (its own process; 1 s before
the answer, then 50 tokens one every 10 ms, each token the wall-clock time it was written)
into ``llm.providers.openai_compat.stream_chat`` on one event loop of the run host's kind.
Per token: the time the adapter yielded it minus the time the model wrote it. Whatever the
runner, the event fan-out and the WebSocket add comes on top of this, on the same cores.

``--client aiohttp`` reads the same streams with aiohttp (C HTTP parser) and a minimal SSE
parse instead of the adapter, to see what a faster HTTP client would change. aiohttp is not a
dependency of the project: put it on ``PYTHONPATH`` for that experiment.

Run: ``.venv/bin/python bench/stream_floor.py [--n 50 100 200] [--loop uvloop|asyncio] [--client adapter|aiohttp]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import threading
import time
import uuid

from _harness import cpu_seconds, fake_model, percentile

from llm.config import RouteEntryConfig
from llm.providers import openai_compat
from llm.types import ChatMessage, TextDelta

MESSAGES = [ChatMessage(role="user", content="go"), ChatMessage(role="assistant", content="a"),
            ChatMessage(role="assistant", content="b")]  # two assistant turns: timed3 answers with text


def _thread_cpu() -> float:
    return cpu_seconds(os.getpid(), threading.get_native_id())


async def one(entry: RouteEntryConfig, latencies: list[float]) -> None:
    async for event in openai_compat.stream_chat(entry, MESSAGES, []):
        if isinstance(event, TextDelta):
            now = time.time()
            for token in event.text.split():
                latencies.append((now - float(token)) * 1000.0)


async def one_aiohttp(session, url: str, latencies: list[float]) -> None:
    body = {"model": "fake-model", "stream": True, "messages": [{"role": m.role, "content": m.content} for m in MESSAGES]}
    async with session.post(url, json=body, headers={"Authorization": "Bearer sk-bench"}) as response:
        response.raise_for_status()
        async for line in response.content:
            if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                continue
            payload = json.loads(line[6:])
            choices = payload.get("choices") or []
            text = (choices[0].get("delta") or {}).get("content") if choices else None
            if text:
                now = time.time()
                for token in text.split():
                    latencies.append((now - float(token)) * 1000.0)


async def round_aiohttp(base_url: str, n: int) -> None:
    import aiohttp

    url = f"{base_url.rstrip('/')}/chat/completions"
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        await one_aiohttp(session, url, [])
        latencies: list[float] = []
        cpu, started = _thread_cpu(), time.perf_counter()
        await asyncio.gather(*(one_aiohttp(session, url, latencies) for _ in range(n)))
        wall, cpu = time.perf_counter() - started, _thread_cpu() - cpu
    _report("aiohttp", n, wall, cpu, latencies)


def _report(client: str, n: int, wall: float, cpu: float, latencies: list[float]) -> None:
    print(f"N={n:4d} ({client}): wall {wall:4.2f} s (ideal ~1.5 s); token latency at the client p50 "
          f"{percentile(latencies, 0.5):.1f} ms p95 {percentile(latencies, 0.95):.1f} ms max {max(latencies):.1f} ms "
          f"({len(latencies)} tokens); loop CPU {cpu / n * 1000:.2f} ms per answer "
          f"({cpu / max(len(latencies), 1) * 1e6:.0f} µs per token)", flush=True)


async def round_(base_url: str, n: int) -> None:
    entry = RouteEntryConfig(
        index=0, provider_name="fake", base_url=base_url, api_key="sk-bench", model="fake-model",
        max_input_tokens=8192, max_output_tokens=256, connect_timeout_seconds=10, read_timeout_seconds=60,
        entry_key=f"bench:{uuid.uuid4().hex}",
    )
    await one(entry, [])  # warm-up: the pool's first connection
    latencies: list[float] = []
    cpu, started = _thread_cpu(), time.perf_counter()
    await asyncio.gather(*(one(entry, latencies) for _ in range(n)))
    wall, cpu = time.perf_counter() - started, _thread_cpu() - cpu
    _report("adapter", n, wall, cpu, latencies)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, nargs="+", default=[50, 100, 200])
    parser.add_argument("--loop", choices=["uvloop", "asyncio"], default="uvloop")
    parser.add_argument("--client", choices=["adapter", "aiohttp"], default="adapter")
    args = parser.parse_args()

    def factory() -> asyncio.AbstractEventLoop:
        if args.loop == "uvloop":
            import uvloop

            return uvloop.new_event_loop()
        return asyncio.new_event_loop()

    with fake_model("timed3") as base_url:
        for n in args.n:
            with asyncio.Runner(loop_factory=factory) as runner:
                runner.run((round_aiohttp if args.client == "aiohttp" else round_)(base_url, n))


if __name__ == "__main__":
    main()
