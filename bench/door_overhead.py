"""Server CPU per answer of each entry point ("door") against the native API (issue 36).

The same agent (one ``test_echo`` tool call, then a 20-word answer streamed in 20 chunks 5 ms
apart: the fake model's ``door`` responder, its own process) is asked through every entry
point, one new chat per answer, with the protocols' official clients where there is one:

- ``native``: the chat app's REST calls: ``POST /api/v1/sessions/`` (a chat), ``POST
  …/messages/`` (the run), ``GET …/events?after_seq=0`` (Server-Sent Events) until the run ends;
- ``native-post``: the same in a chat made beforehand (outside the measured window): message and
  stream only;
- ``openai-chat`` / ``openai-chat-stream``: ``POST /api/openai/v1/chat/completions`` (``openai``
  SDK), whole and streamed;
- ``openai-resp`` / ``openai-resp-stream``: ``POST /api/openai/v1/responses``, whole and streamed;
- ``mcp-2025`` / ``mcp-2026``: ``tools/call`` at ``/mcp/agents/`` (``mcp`` SDK client; the
  2025-11-25 session's ``initialize`` is made once, before measuring; 2026-07-28 is stateless);
- ``a2a`` / ``a2a-stream``: ``SendMessage`` / ``SendStreamingMessage`` at ``/a2a/<slug>/``
  (``a2a-sdk`` client, JSON-RPC binding; the card is fetched once, before measuring).

Every answer is checked (the reply's text); a failed one is counted and printed. The server runs
as in production (``bench/_doors.py``): the web process (uvicorn, the project's ASGI app) and a
Celery worker (threads pool) in processes of their own. For each door and round, the CPU time
(utime + stime, ``/proc``) the web process and the worker used while the door's answers were
made, minus what each uses idle over the same time, divided by the answers: the worker does the
same run whatever the door, so the web process's figure minus the native one is the door's own
cost (the issue's goal: ≤ +2 ms). The clients run in this process: their CPU is not counted.

Rounds alternate the doors' order (forward, then backward: ABBA), so a machine getting busier or
quieter hits every door alike; the table gives each figure's median and range over the rounds,
and the difference to ``native`` is taken within each round.

Run: ``.venv/bin/python bench/door_overhead.py [--answers 40] [--concurrency 4] [--rounds 4]
[--doors native openai-chat …] [--profile-web stacks.txt]``
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import _doors  # first of the project's modules: the environment the three processes share
import httpx
import httpx2
import openai
from _fake_model import DOOR_REPLY
from _harness import machine_busy_seconds, percentile
from _stats import machine
from a2a.client import ClientConfig, create_client
from a2a.types.a2a_pb2 import Message, Part, Role, SendMessageRequest
from mcp.client import Client
from mcp.client.streamable_http import streamable_http_client

RUN_END_TYPES = ("run_completed", "run_failed", "run_cancelled")
NATIVE, NATIVE_POST = "native", "native-post"
GOAL_MS = 2.0
"""Issue 36: an entry point's server CPU per request at most this much over the native API's."""


@dataclass
class Door:
    """One entry point: ``call()`` asks for one answer and returns its text; ``prepare(n)`` (if
    any) makes what ``n`` calls need, outside the measured window."""

    name: str
    call: Callable[[], Awaitable[str]]
    prepare: Callable[[int], Awaitable[None]] | None = None
    rounds: list[tuple[float, float]] = field(default_factory=list)
    """Per round: (web, worker) CPU ms per answer."""
    latencies: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)


def _a2a_message() -> SendMessageRequest:
    return SendMessageRequest(message=Message(message_id=str(uuid.uuid4()), role=Role.ROLE_USER,
                                              parts=[Part(text="go")]))


async def _native_stream(http: httpx.AsyncClient, chat_id: int) -> str:
    """Post the message to chat ``chat_id`` and read its SSE events until the run ends; its reply."""
    posted = await http.post(f"/api/v1/sessions/{chat_id}/messages/", json={"content": "go"})
    posted.raise_for_status()
    run_id = posted.json()["run"]["id"]
    async with http.stream("GET", f"/api/v1/sessions/{chat_id}/events", params={"after_seq": 0}) as response:
        response.raise_for_status()
        event = ""
        async for line in response.aiter_lines():
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: ") and event in RUN_END_TYPES:
                frame = json.loads(line[6:])
                if frame.get("run_id") == run_id:
                    return frame["data"].get("reply", event)
    return "stream ended"


async def _open_doors(stack: contextlib.AsyncExitStack, platform: _doors.Platform) -> dict[str, Door]:
    """Every door's client, opened on ``stack`` (handshakes and cards before any measurement)."""
    base, slug, auth = platform.base, platform.agent.slug, {"Authorization": f"Bearer {platform.token}"}
    http = await stack.enter_async_context(httpx.AsyncClient(base_url=base, headers=auth, timeout=60))

    async def new_chat() -> int:
        made = await http.post("/api/v1/sessions/", json={"agent": platform.agent.pk})
        made.raise_for_status()
        return made.json()["id"]

    async def native() -> str:
        return await _native_stream(http, await new_chat())

    chats: list[int] = []

    async def native_prepare(n: int) -> None:
        chats.extend([await new_chat() for _ in range(n)])

    async def native_post() -> str:
        return await _native_stream(http, chats.pop())

    sdk = openai.AsyncOpenAI(base_url=f"{base}/api/openai/v1", api_key=platform.token, max_retries=0, timeout=60)
    stack.push_async_callback(sdk.close)
    messages = [{"role": "user", "content": "go"}]

    async def openai_chat() -> str:
        return (await sdk.chat.completions.create(model=slug, messages=messages)).choices[0].message.content

    async def openai_chat_stream() -> str:
        parts = []
        async for chunk in await sdk.chat.completions.create(model=slug, messages=messages, stream=True):
            if chunk.choices and chunk.choices[0].delta.content:
                parts.append(chunk.choices[0].delta.content)
        return "".join(parts)

    async def openai_resp() -> str:
        return (await sdk.responses.create(model=slug, input="go")).output_text

    async def openai_resp_stream() -> str:
        parts = []
        async for event in await sdk.responses.create(model=slug, input="go", stream=True):
            if event.type == "response.output_text.delta":
                parts.append(event.delta)
        return "".join(parts)

    async def mcp_door(mode: str) -> Callable[[], Awaitable[str]]:
        transport = await stack.enter_async_context(httpx2.AsyncClient(headers=auth, timeout=httpx2.Timeout(60)))
        client = await stack.enter_async_context(  # in this task: the SDK's cancel scopes must close in it
            Client(streamable_http_client(f"{base}/mcp/agents/", http_client=transport), mode=mode))

        async def call() -> str:
            result = await client.call_tool(slug, {"message": "go"})
            return result.structured_content["reply"] if not result.is_error else str(result.content)

        return call

    async def a2a_client(streaming: bool):
        config = ClientConfig(httpx_client=await stack.enter_async_context(httpx.AsyncClient(headers=auth, timeout=60)),
                              supported_protocol_bindings=["JSONRPC"], streaming=streaming)
        client = await create_client(f"{base}/a2a/{slug}/", client_config=config)
        stack.push_async_callback(client.close)
        return client

    a2a_blocking, a2a_streaming = await a2a_client(False), await a2a_client(True)

    async def a2a() -> str:
        [event] = [e async for e in a2a_blocking.send_message(_a2a_message())]
        return "".join(p.text for a in event.task.artifacts if a.artifact_id == "reply" for p in a.parts)

    async def a2a_stream() -> str:
        events = [e async for e in a2a_streaming.send_message(_a2a_message())]
        return "".join(p.text for e in events if e.HasField("artifact_update") for p in e.artifact_update.artifact.parts)

    doors = [Door(NATIVE, native), Door(NATIVE_POST, native_post, native_prepare),
             Door("openai-chat", openai_chat), Door("openai-chat-stream", openai_chat_stream),
             Door("openai-resp", openai_resp), Door("openai-resp-stream", openai_resp_stream),
             Door("mcp-2025", await mcp_door("legacy")), Door("mcp-2026", await mcp_door("2026-07-28")),
             Door("a2a", a2a), Door("a2a-stream", a2a_stream)]
    return {d.name: d for d in doors}


async def _answers(door: Door, n: int, concurrency: int) -> None:
    """``n`` answers through ``door``, ``concurrency`` at a time; latencies and failures kept."""
    todo = iter(range(n))

    async def lane() -> None:
        for _ in todo:
            start = time.perf_counter()
            try:
                reply = await door.call()
            except Exception as exc:  # noqa: BLE001 - counted and shown, the round goes on
                door.failures.append(f"{type(exc).__name__}: {exc}"[:300])
                continue
            door.latencies.append((time.perf_counter() - start) * 1000)
            if reply != DOOR_REPLY:
                door.failures.append(f"unexpected reply {reply[:120]!r}")

    await asyncio.gather(*(lane() for _ in range(concurrency)))


SETTLE_SECONDS = 0.3
"""Wait after a door's last answer before reading CPU: the worker finishes the run's end, the web
process closes its streams."""


async def _idle_rates(platform: _doors.Platform, seconds: float = 3.0) -> tuple[float, float]:
    """CPU seconds per second (web, worker) while nothing is asked."""
    before, start = platform.cpu(), time.perf_counter()
    await asyncio.sleep(seconds)
    after, wall = platform.cpu(), time.perf_counter() - start
    return (after[0] - before[0]) / wall, (after[1] - before[1]) / wall


async def _round(platform: _doors.Platform, doors: list[Door], idle: tuple[float, float], n: int, concurrency: int,
                 *, report: bool) -> None:
    busy0 = machine_busy_seconds()
    for door in doors:
        if door.prepare is not None:
            await door.prepare(n)
        failed = len(door.failures)
        (web0, worker0), start = platform.cpu(), time.perf_counter()
        await _answers(door, n, concurrency)
        await asyncio.sleep(SETTLE_SECONDS)
        (web1, worker1), wall = platform.cpu(), time.perf_counter() - start
        web = (web1 - web0 - idle[0] * wall) / n * 1000
        worker = (worker1 - worker0 - idle[1] * wall) / n * 1000
        if report:
            door.rounds.append((web, worker))
            print(f"  {door.name:19s} web {web:6.2f} ms  worker {worker:6.2f} ms per answer  ({wall:4.1f} s"
                  + (f"; {len(door.failures) - failed} failed: {door.failures[-1]}" if len(door.failures) > failed
                     else "") + ")", flush=True)
    busy1 = machine_busy_seconds()
    if report:
        print(f"  machine busy {(busy1[0] - busy0[0]) / (busy1[1] - busy0[1]) * 100:.0f} %, "
              f"load average {os.getloadavg()[0]:.2f}", flush=True)


def _median_range(values: list[float]) -> str:
    return f"{statistics.median(values):6.2f} ({min(values):.2f}–{max(values):.2f})"


def _web_diffs(door: Door, base: Door | None) -> list[float]:
    """``door``'s web CPU per answer minus ``base``'s, round by round ([] without both)."""
    if base is None or door is base or not base.rounds:
        return []
    return [w - b for (w, _), (b, _) in zip(door.rounds, base.rounds, strict=False)]


def _summary(doors: list[Door]) -> None:
    bases = [d for d in doors if d.name in (NATIVE, NATIVE_POST)]
    print("\nCPU ms per answer, median (range) over the rounds; vs native / native-post: the web process's difference "
          "to theirs in the same round")
    print(f"{'door':19s} {'web':>22s} {'worker':>22s} " + "".join(f"{'web vs ' + b.name:>25s}" for b in bases)
          + "  latency p50 / p95   failed")
    for door in doors:
        if not door.rounds:
            continue
        web, worker = [w for w, _ in door.rounds], [k for _, k in door.rounds]
        diffs = "".join(f"{_median_range(d) if (d := _web_diffs(door, b)) else '':>25s}" for b in bases)
        print(f"{door.name:19s} {_median_range(web):>22s} {_median_range(worker):>22s} {diffs}  "
              f"{percentile(door.latencies, 0.5):6.0f} / {percentile(door.latencies, 0.95):4.0f} ms   "
              f"{len(door.failures)}")
    for base in bases:
        over = [d.name for d in doors if d not in bases and d.rounds and statistics.median(_web_diffs(d, base)) > GOAL_MS]
        print(f"goal: web CPU ≤ {base.name} + {GOAL_MS:g} ms per request; over it (median): {', '.join(over) or 'none'}")


async def _main(args: argparse.Namespace, platform: _doors.Platform) -> None:
    print(f"{machine()}; load average {os.getloadavg()[0]:.2f}; agent {platform.agent.slug!r}; "
          f"{args.answers} answers per door and round, {args.concurrency} at a time", flush=True)
    async with contextlib.AsyncExitStack() as stack:
        by_name = await _open_doors(stack, platform)
        doors = [by_name[name] for name in args.doors]
        print("warm-up round (not reported)", flush=True)
        await _round(platform, doors, (0.0, 0.0), max(2, args.concurrency), args.concurrency, report=False)
        for door in doors:
            door.failures.clear()
            door.latencies.clear()
        idle = await _idle_rates(platform)
        print(f"idle: web {idle[0] * 1000:.2f} ms/s, worker {idle[1] * 1000:.2f} ms/s (subtracted)", flush=True)
        spy = _py_spy(platform, args.profile_web) if args.profile_web else None
        for i in range(args.rounds):
            order = doors if i % 2 == 0 else doors[::-1]
            print(f"round {i + 1} ({'forward' if i % 2 == 0 else 'backward'}):", flush=True)
            await _round(platform, order, idle, args.answers, args.concurrency, report=True)
        if spy is not None:
            spy.send_signal(signal.SIGINT)  # py-spy writes its file and exits
            spy.wait(timeout=120)
        _summary(doors)


def _py_spy(platform: _doors.Platform, path: str) -> subprocess.Popen:
    """``--profile-web``: ``py-spy record`` of the web process (all threads, idle frames left out)
    into ``path`` as collapsed stacks, until the rounds end; ``--gil``: only the thread holding the GIL
    (Python on a core, not threads waiting for PostgreSQL or Redis). Its samples cost the web process
    (py-spy pauses it to read its stacks unless ``--nonblocking``: this uses the default, exact
    stacks), so the CPU figures of a profiled invocation are not comparable."""
    spy = shutil.which("py-spy")
    if spy is None:
        raise SystemExit("--profile-web needs py-spy on PATH (pip install py-spy)")
    return subprocess.Popen([spy, "record", "--pid", str(platform.web.proc.pid), "--output", path, "--format", "raw",
                             "--rate", "250", "--gil"], stdout=subprocess.DEVNULL)


def main() -> None:
    names = ["native", "native-post", "openai-chat", "openai-chat-stream", "openai-resp", "openai-resp-stream",
             "mcp-2025", "mcp-2026", "a2a", "a2a-stream"]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--answers", type=int, default=40, help="answers per door and round")
    parser.add_argument("--concurrency", type=int, default=4, help="answers asked at once")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--doors", nargs="+", choices=names, default=names)
    parser.add_argument("--profile-web", metavar="FILE",
                        help="record the web process with py-spy over the rounds (collapsed stacks into FILE)")
    args = parser.parse_args()
    with _doors.Platform("door", name="Door bench") as platform:  # set up outside the loop (ORM)
        platform.agent.refresh_from_db()
        asyncio.run(_main(args, platform))


if __name__ == "__main__":
    main()
