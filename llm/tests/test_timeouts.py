"""Per-entry timeouts against real sockets: connect (httpx), first token and total stream (router
timers), idle between chunks (adapter timer).

Each test waits on observable state (the router's outcome, the server's disconnects); the
only waiting is the timeouts under test, kept at a few hundred milliseconds.
"""

from __future__ import annotations

import random
import socket
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from llm.clock import FakeClock
from llm.config import RouteEntryConfig
from llm.errors import StreamInterrupted
from llm.records import AttemptRecord
from llm.router import Router
from llm.testing import FakeLLMServer, Hang, Reply, Stall, ToolCalls
from llm.types import ChatMessage, Completion, StreamEvent, TextDelta, ToolSpec

pytestmark = [pytest.mark.timeout(60), pytest.mark.usefixtures("all_tenants_scope")]

USER = [ChatMessage(role="user", content="What time is it?")]
TOOL = ToolSpec(name="get_current_time", description="Current time.", parameters={"type": "object", "properties": {}})
SLOW = 5.0
"""A timeout that must not fire in the test, seconds."""


@pytest.fixture
def unanswered_port_url() -> Iterator[str]:
    """A base URL whose TCP connect never completes: a listening socket with a backlog of 0,
    already filled by one connection, so the kernel drops further SYNs."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    filler = socket.create_connection(("127.0.0.1", port), timeout=2)
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        filler.close()
        listener.close()


def entry(index: int, base_url: str, **overrides: Any) -> RouteEntryConfig:
    values: dict[str, Any] = {
        "index": index,
        "provider_name": f"provider{index}",
        "base_url": base_url,
        "api_key": "sk-test",
        "model": f"model-{index}",
        "max_input_tokens": 8192,
        "max_output_tokens": 256,
        "connect_timeout_seconds": SLOW,
        "read_timeout_seconds": SLOW,
        "max_retries": 0,
    }
    values.update(overrides)
    return RouteEntryConfig(**values)


class Recorder:
    def __init__(self) -> None:
        self.records: list[AttemptRecord] = []

    async def __call__(self, record: AttemptRecord) -> None:
        self.records.append(record)

    def summary(self) -> list[tuple[int, str, str | None]]:
        return [(r.entry_index, r.status, r.error_class) for r in self.records]


def make_router(entries: Sequence[RouteEntryConfig]) -> tuple[Router, Recorder, FakeClock]:
    recorder, clock = Recorder(), FakeClock()
    return Router(entries, record=recorder, clock=clock, rng=random.Random(3)), recorder, clock


async def collect(router: Router, tools: Sequence[ToolSpec] = ()) -> list[StreamEvent]:
    return [event async for event in router.stream(USER, tools)]


def text_of(events: Sequence[StreamEvent]) -> str:
    return "".join(e.text for e in events if isinstance(e, TextDelta))


# --- connect ------------------------------------------------------------------------------------


async def test_connect_timeout_falls_back(unanswered_port_url: str, server_b: FakeLLMServer) -> None:
    server_b.script(Reply("from b"))
    router, recorder, _ = make_router(
        [entry(0, unanswered_port_url, connect_timeout_seconds=0.3), entry(1, server_b.base_url)]
    )

    events = await collect(router)

    assert text_of(events) == "from b"
    assert recorder.summary() == [(0, "failed", "timeout"), (1, "succeeded", None)]
    assert 250 <= recorder.records[0].latency_ms < 3000


# --- first token ----------------------------------------------------------------------------------


async def test_first_token_timeout_on_a_silent_server(server_a: FakeLLMServer, server_b: FakeLLMServer) -> None:
    server_a.script(Hang(30))
    server_b.script(Reply("from b"))
    router, recorder, _ = make_router(
        [entry(0, server_a.base_url, first_token_timeout_seconds=0.3), entry(1, server_b.base_url)]
    )

    events = await collect(router)

    assert text_of(events) == "from b"
    assert recorder.summary() == [(0, "failed", "timeout"), (1, "succeeded", None)]
    assert recorder.records[0].error == "no first token within 0.3 s"
    assert 250 <= recorder.records[0].latency_ms < 3000
    assert await server_a.await_disconnects(1)


async def test_first_token_timeout_when_only_the_role_chunk_arrives(
    server_a: FakeLLMServer, server_b: FakeLLMServer
) -> None:
    # Headers and the empty role chunk come at once; the first content chunk 3 s later. The
    # idle timeout (5 s) would not fire; the first-token one (0.3 s) does.
    server_a.script(Reply("late", chunk_interval_seconds=3))
    server_b.script(Reply("from b"))
    router, recorder, _ = make_router(
        [entry(0, server_a.base_url, first_token_timeout_seconds=0.3), entry(1, server_b.base_url)]
    )

    events = await collect(router)

    assert text_of(events) == "from b"
    assert recorder.records[0].error == "no first token within 0.3 s"


async def test_the_first_token_timer_stops_at_the_first_token(server_a: FakeLLMServer) -> None:
    # 9 chunks 0.1 s apart: the stream lasts ~0.9 s, longer than the 0.3 s first-token timeout.
    server_a.script(Reply("abcdefgh", chunk_size=1, chunk_interval_seconds=0.1))
    router, recorder, _ = make_router([entry(0, server_a.base_url, first_token_timeout_seconds=0.3)])

    events = await collect(router)

    assert text_of(events) == "abcdefgh"
    (record,) = recorder.records
    assert record.status == "succeeded" and record.latency_ms > 300


async def test_a_tool_call_fragment_also_stops_the_first_token_timer(server_a: FakeLLMServer) -> None:
    # Tool-call fragments are never yielded: the timer must be rescheduled from inside the wait.
    server_a.script(ToolCalls([("get_current_time", {"timezone": "Asia/Tokyo"})], chunk_size=2, chunk_interval_seconds=0.05))
    router, recorder, _ = make_router([entry(0, server_a.base_url, first_token_timeout_seconds=0.3)])

    events = await collect(router, [TOOL])

    completion = events[-1]
    assert isinstance(completion, Completion) and completion.message.tool_calls[0].name == "get_current_time"
    assert recorder.records[0].latency_ms > 300


async def test_timeouts_before_the_first_token_are_retried_then_fall_back(
    server_a: FakeLLMServer, server_b: FakeLLMServer
) -> None:
    server_a.respond(lambda body: Hang(30))
    server_b.script(Reply("from b"))
    router, recorder, clock = make_router(
        [entry(0, server_a.base_url, first_token_timeout_seconds=0.2, max_retries=2), entry(1, server_b.base_url)]
    )

    events = await collect(router)

    assert text_of(events) == "from b"
    assert recorder.summary() == [(0, "failed", "timeout")] * 3 + [(1, "succeeded", None)]
    assert len(clock.sleeps) == 2
    assert len(server_a.requests) == 3


# --- idle between chunks ----------------------------------------------------------------------------


async def test_idle_timeout_before_the_first_token_falls_back(server_a: FakeLLMServer, server_b: FakeLLMServer) -> None:
    server_a.script(Reply("late", chunk_interval_seconds=3))
    server_b.script(Reply("from b"))
    router, recorder, _ = make_router(
        [entry(0, server_a.base_url, read_timeout_seconds=0.3, first_token_timeout_seconds=SLOW), entry(1, server_b.base_url)]
    )

    events = await collect(router)

    assert text_of(events) == "from b"
    assert recorder.summary() == [(0, "failed", "timeout"), (1, "succeeded", None)]
    assert recorder.records[0].error == "no chunk from the provider within 0.3 s (idle timeout)"


async def test_idle_timeout_after_the_first_token_interrupts(server_a: FakeLLMServer, server_b: FakeLLMServer) -> None:
    server_a.script(Stall(Reply("slow tokens", chunk_size=2), n_chunks=2))
    router, recorder, _ = make_router(
        [entry(0, server_a.base_url, read_timeout_seconds=0.3, first_token_timeout_seconds=SLOW), entry(1, server_b.base_url)]
    )
    events: list[StreamEvent] = []

    with pytest.raises(StreamInterrupted) as caught:
        async for event in router.stream(USER, []):
            events.append(event)

    assert text_of(events) == "slow"
    assert caught.value.error_class == "timeout" and "idle" in caught.value.cause.message
    assert server_b.requests == []
    assert await server_a.await_disconnects(1)


# --- whole stream -----------------------------------------------------------------------------------


async def test_total_timeout_after_the_first_token_interrupts(server_a: FakeLLMServer, server_b: FakeLLMServer) -> None:
    # 60 one-character chunks 0.05 s apart (~3 s) against a 0.5 s cap on the whole stream.
    server_a.script(Reply("x" * 60, chunk_size=1, chunk_interval_seconds=0.05))
    router, recorder, _ = make_router([entry(0, server_a.base_url, stream_timeout_seconds=0.5), entry(1, server_b.base_url)])
    events: list[StreamEvent] = []

    with pytest.raises(StreamInterrupted) as caught:
        async for event in router.stream(USER, []):
            events.append(event)

    assert 0 < len(text_of(events)) < 60
    assert caught.value.error_class == "timeout"
    assert caught.value.cause.message == "the stream exceeded its total time limit of 0.5 s"
    (record,) = recorder.records
    assert record.first_token_ms is not None and 450 <= record.latency_ms < 3000
    assert server_b.requests == []
    assert await server_a.await_disconnects(1)


async def test_the_total_timer_still_runs_while_tool_call_fragments_arrive(server_a: FakeLLMServer, server_b: FakeLLMServer) -> None:
    """Fragments are never yielded, so the wait that saw the first one goes on under the timer
    rescheduled from inside it: to the total deadline, not to none (mutation testing found this
    untested: ``reschedule(None)`` let the call run past its total limit)."""
    server_a.script(ToolCalls([("get_current_time", {"timezone": "Asia/Tokyo"})], chunk_size=2,
                              chunk_interval_seconds=0.1))  # ~3 s of fragments
    router, recorder, _ = make_router([entry(0, server_a.base_url, stream_timeout_seconds=0.6,
                                             first_token_timeout_seconds=0.3), entry(1, server_b.base_url)])

    with pytest.raises(StreamInterrupted) as caught:
        await collect(router, [TOOL])

    assert caught.value.cause.message == "the stream exceeded its total time limit of 0.6 s"
    (record,) = recorder.records
    assert record.first_token_ms is not None and 550 <= record.latency_ms < 2500
    assert server_b.requests == []


async def test_total_timeout_before_the_first_token_falls_back(server_a: FakeLLMServer, server_b: FakeLLMServer) -> None:
    server_a.script(Hang(30))
    server_b.script(Reply("from b"))
    router, recorder, _ = make_router(
        [entry(0, server_a.base_url, stream_timeout_seconds=0.3, first_token_timeout_seconds=SLOW), entry(1, server_b.base_url)]
    )

    events = await collect(router)

    assert text_of(events) == "from b"
    assert recorder.records[0].error == "the stream exceeded its total time limit of 0.3 s"


async def test_a_transport_read_timeout_between_chunks_is_the_idle_timeout() -> None:
    """The transport's read timeout and the idle timer have the same length; whichever fires
    first, a stalled stream fails with the idle timeout's error."""
    import httpx2
    import openai

    from llm.errors import ModelCallError
    from llm.providers.openai_compat import _next_payloads

    async def stalled():
        yield [{"choices": []}]
        raise openai.APITimeoutError(request=httpx2.Request("POST", "http://model.invalid/v1/chat/completions"))

    payloads = stalled()
    assert await _next_payloads(payloads, 5.0) == [{"choices": []}]
    with pytest.raises(ModelCallError) as caught:
        await _next_payloads(payloads, 5.0)
    assert caught.value.error_class == "timeout"
    assert caught.value.message == "no chunk from the provider within 5 s (idle timeout)"


async def test_keep_alive_comments_without_events_still_hit_the_idle_timeout() -> None:
    """A server that keeps the connection busy with SSE comments but sends no event: the
    transport's read timeout never fires (bytes keep coming), the adapter's idle check does."""
    import asyncio
    import json

    first = {"id": "c1", "object": "chat.completion.chunk", "created": 0, "model": "m",
             "choices": [{"index": 0, "delta": {"role": "assistant", "content": "hello"}, "finish_reason": None}]}

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n"
                     b"connection: close\r\n\r\n" + b"data: " + json.dumps(first).encode() + b"\n\n")
        try:
            while True:  # a comment every 50 ms, well inside the 0.3 s read timeout
                await writer.drain()
                await asyncio.sleep(0.05)
                writer.write(b": keep-alive\n\n")
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        router, recorder, _ = make_router(
            [entry(0, f"http://127.0.0.1:{port}/v1", read_timeout_seconds=0.3, first_token_timeout_seconds=SLOW)]
        )
        events: list[StreamEvent] = []
        with pytest.raises(StreamInterrupted) as caught:
            async for event in router.stream(USER, []):
                events.append(event)
    finally:
        server.close()

    assert text_of(events) == "hello"
    assert caught.value.error_class == "timeout"
    assert caught.value.cause.message == "no chunk from the provider within 0.3 s (idle timeout)"
    assert 300 <= recorder.records[0].latency_ms < 3000
