"""Router overhead per model call, excluding provider time.

Two measurements, both single streamed calls of a 5-chunk answer:

1. **Over HTTP**: a FakeLLMServer in a child process (so it does not share our GIL) answers
   instantly with ``Reply(..., chunk_size=8)`` (role chunk, 5 content chunks, finish chunk,
   usage chunk). Each iteration makes, in interleaved order, one direct
   ``openai_compat.stream_chat`` call and one ``Router.stream`` call on the same entry
   (without health, with ``MemoryEntryHealth``, with the real ``RedisEntryHealth``). The
   overhead is the router's latency minus the direct call's: reported as the difference of
   the p50/p95 latencies and as the p50/p95 of the paired per-iteration differences.
2. **In memory**: the adapter replaced by a generator yielding the same events with no I/O,
   so what is left is the router's own CPU time per call (timers, records, events).

Run: ``.venv/bin/python bench/router_overhead.py [--iterations 1000]`` (Django's settings through
``bench/_harness.py``, which allows loopback for the fake server; no database; Redis at
127.0.0.1:6379 for the RedisEntryHealth row).
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import argparse  # noqa: E402
import asyncio  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402
import uuid  # noqa: E402
from collections.abc import AsyncIterator, Callable  # noqa: E402
from contextlib import contextmanager  # noqa: E402
from typing import Any  # noqa: E402

import _harness  # noqa: E402,F401  (Django's settings: the adapter reads them; loopback allowed)
from _stats import machine, percentile  # noqa: E402

import llm.router as router_module  # noqa: E402
from llm.config import RouteEntryConfig  # noqa: E402
from llm.health import MemoryEntryHealth, RedisEntryHealth  # noqa: E402
from llm.providers import openai_compat  # noqa: E402
from llm.router import Router  # noqa: E402
from llm.testing import FakeLLMServer, Reply  # noqa: E402
from llm.types import ChatMessage, Completion, TextDelta, Usage  # noqa: E402

ANSWER = "Hello there, this is a short answer."  # 36 characters: 5 chunks of 8
MESSAGES = [ChatMessage(role="system", content="You are terse."), ChatMessage(role="user", content="Say hello.")]


def serve() -> None:
    """Child process: a FakeLLMServer answering every request with ANSWER; prints its URL."""
    with FakeLLMServer() as server:
        server.respond(lambda body: Reply(ANSWER, chunk_size=8))
        print(server.base_url, flush=True)
        sys.stdin.read()


@contextmanager
def fake_server_process() -> Any:
    proc = subprocess.Popen(
        [sys.executable, __file__, "--serve"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        yield proc.stdout.readline().strip()  # type: ignore[union-attr]
    finally:
        proc.stdin.close()  # type: ignore[union-attr]
        proc.wait(timeout=10)




def machine_and_loop() -> str:
    try:
        import uvloop  # noqa: F401

        loop = "asyncio (uvloop installed, not used)"
    except ImportError:
        loop = "asyncio"
    return f"{machine()}, {loop}"


def entry_for(base_url: str) -> RouteEntryConfig:
    return RouteEntryConfig(
        index=0,
        provider_name="fake",
        base_url=base_url,
        api_key="sk-bench",
        model="fake-model",
        max_input_tokens=8192,
        max_output_tokens=256,
        connect_timeout_seconds=5,
        read_timeout_seconds=5,
        entry_key=f"bench:{uuid.uuid4().hex}",
    )


async def _drain(stream: AsyncIterator[Any]) -> None:
    async for _ in stream:
        pass


async def _timed(make: Callable[[], AsyncIterator[Any]]) -> float:
    started = time.perf_counter()
    await _drain(make())
    return (time.perf_counter() - started) * 1000


async def over_http(base_url: str, iterations: int) -> dict[str, list[float]]:
    import redis.asyncio

    entry = entry_for(base_url)
    redis_client = redis.asyncio.Redis(host="127.0.0.1", port=6379)
    prefix = f"bench:router-overhead:{uuid.uuid4().hex}"
    routers = {
        "router (no health)": Router([entry]),
        "router + MemoryEntryHealth": Router([entry], health=MemoryEntryHealth()),
        "router + RedisEntryHealth": Router([entry], health=RedisEntryHealth(redis_client, prefix=prefix)),
    }

    def direct() -> AsyncIterator[Any]:
        return openai_compat.stream_chat(entry, MESSAGES, [], on_first_token=lambda: None)

    makers: dict[str, Callable[[], AsyncIterator[Any]]] = {"direct stream_chat": direct}
    for name, router in routers.items():
        makers[name] = lambda router=router: router.stream(MESSAGES, [])
    samples: dict[str, list[float]] = {name: [] for name in makers}
    try:
        for _ in range(50):  # warm up: pooled connection, SDK caches, script load
            for make in makers.values():
                await _drain(make())
        for i in range(iterations):
            names = list(makers)
            if i % 2:
                names.reverse()  # alternate the order so neither side always goes first
            for name in names:
                samples[name].append(await _timed(makers[name]))
    finally:
        keys = [k async for k in redis_client.scan_iter(match=f"{prefix}:*")]
        if keys:
            await redis_client.delete(*keys)
        await redis_client.aclose()
        await openai_compat.aclose_clients()
    return samples


async def in_memory(iterations: int) -> dict[str, list[float]]:
    """The adapter replaced by a no-I/O generator: the router's own cost per call."""
    chunks = [ANSWER[i : i + 8] for i in range(0, len(ANSWER), 8)]
    completion = Completion(
        message=ChatMessage(role="assistant", content=ANSWER), usage=Usage(20, 9), finish_reason="stop",
        entry_index=0, model="fake-model",
    )

    async def fake_stream_chat(entry: Any, messages: Any, tools: Any, **kwargs: Any) -> AsyncIterator[Any]:
        on_first_token = kwargs.get("on_first_token")
        for n, text in enumerate(chunks):
            if n == 0 and on_first_token is not None:
                on_first_token()
            yield TextDelta(text)
        yield completion

    class FakeModel:  # the adapter model of an entry (llm.model.Model), over the fake stream
        __slots__ = ("entry",)

        def __init__(self, entry: Any) -> None:
            self.entry = entry

        def stream(self, messages: Any, tools: Any, settings: Any = None, **kwargs: Any) -> AsyncIterator[Any]:
            return fake_stream_chat(self.entry, messages, tools, **kwargs)

    original = router_module._adapter_for
    router_module._adapter_for = FakeModel  # type: ignore[assignment]
    entry = entry_for("http://unused.invalid/v1")
    router = Router([entry])
    health_router = Router([entry], health=MemoryEntryHealth())
    makers = {
        "bare generator": lambda: fake_stream_chat(entry, MESSAGES, [], on_first_token=lambda: None),
        "router (no health)": lambda: router.stream(MESSAGES, []),
        "router + MemoryEntryHealth": lambda: health_router.stream(MESSAGES, []),
    }
    samples: dict[str, list[float]] = {name: [] for name in makers}
    try:
        for _ in range(200):
            for make in makers.values():
                await _drain(make())
        for _ in range(iterations):
            for name, make in makers.items():
                samples[name].append(await _timed(make))
    finally:
        router_module._adapter_for = original  # type: ignore[assignment]
    return samples


def report(title: str, samples: dict[str, list[float]], baseline: str) -> None:
    print(f"\n{title}")
    print(f"  {'':30} {'p50 ms':>9} {'p95 ms':>9} {'mean ms':>9}   overhead vs {baseline}")
    base = samples[baseline]
    for name, values in samples.items():
        line = f"  {name:30} {percentile(values, 0.5):9.3f} {percentile(values, 0.95):9.3f} {statistics.fmean(values):9.3f}"
        if name != baseline:
            paired = [v - b for v, b in zip(values, base, strict=True)]
            line += (
                f"   Δp50 {percentile(values, 0.5) - percentile(base, 0.5):+.3f} ms, "
                f"Δp95 {percentile(values, 0.95) - percentile(base, 0.95):+.3f} ms; "
                f"paired diff p50 {percentile(paired, 0.5):+.3f} / p95 {percentile(paired, 0.95):+.3f} ms"
            )
        print(line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=1000, help="calls per variant over HTTP (default 1000)")
    parser.add_argument("--memory-iterations", type=int, default=5000, help="calls per variant in memory")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve()
        return
    print(f"machine: {machine_and_loop()}")
    print(f"call: 2 messages, no tools; answer {len(ANSWER)} chars in 5 content chunks (+ role, finish, usage chunks)")
    with fake_server_process() as base_url:
        http = asyncio.run(over_http(base_url, args.iterations))
    report(f"over HTTP (FakeLLMServer in a child process), {args.iterations} calls each", http, "direct stream_chat")
    memory = asyncio.run(in_memory(args.memory_iterations))
    report(f"in memory (no I/O), {args.memory_iterations} calls each", memory, "bare generator")
    overhead = percentile(http["router (no health)"], 0.5) - percentile(http["direct stream_chat"], 0.5)
    print(f"\nrouter overhead p50 over HTTP: {overhead:.3f} ms (target <= 2 ms): {'OK' if overhead <= 2 else 'OVER'}")


if __name__ == "__main__":
    main()
