"""Router + OpenAI-compatible adapter against real FakeLLMServer instances (no Django, no DB).

Retries wait on a FakeClock (``clock.sleeps`` holds the exact waits); tests about a single
fallback set ``max_retries=0`` on the failing entry.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import types
from collections.abc import Sequence
from contextlib import aclosing
from typing import Any

import pytest

from llm.clock import FakeClock
from llm.config import DEFAULT_BACKOFF, BackoffPolicy, RouteEntryConfig
from llm.errors import AllEntriesFailed, ContextWindowExceeded, ModelCallError, StreamInterrupted
from llm.health import HealthStateUnavailable, MemoryEntryHealth
from llm.providers import openai_compat
from llm.providers.openai_compat import aclose_clients
from llm.records import AttemptRecord
from llm.router import Router, unsuitable_reason
from llm.testing import CutAfter, Delay, Fail, FakeLLMServer, Hang, Reply, Stall, ToolCalls
from llm.tokens import estimate_tokens
from llm.toolcall_parsing import TOOL_RESULTS_FOLLOW_UP
from llm.types import (
    ChatMessage,
    Completion,
    ReasoningDelta,
    StreamEvent,
    TextDelta,
    ToolCallRequest,
    ToolSpec,
    Usage,
)

pytestmark = [pytest.mark.timeout(60), pytest.mark.usefixtures("all_tenants_scope")]

USER = [ChatMessage(role="system", content="You are terse."), ChatMessage(role="user", content="What time is it?")]
TIME_TOOL = ToolSpec(
    name="get_current_time",
    description="Current time in an IANA timezone.",
    parameters={"type": "object", "properties": {"timezone": {"type": "string"}}, "required": ["timezone"]},
)


# --- fixtures and helpers -------------------------------------------------------------------


@pytest.fixture
def closed_port_url(closed_port_root: str) -> str:
    """A base URL nobody listens on (connection refused)."""
    return closed_port_root + "/v1"


def entry(index: int, base_url: str, **overrides: Any) -> RouteEntryConfig:
    values: dict[str, Any] = {
        "index": index,
        "provider_name": f"provider{index}",
        "base_url": base_url,
        "api_key": f"sk-test-{index}",
        "model": f"model-{index}",
        "max_input_tokens": 8192,
        "max_output_tokens": 1024,
        "connect_timeout_seconds": 2.0,
        "read_timeout_seconds": 5.0,
    }
    values.update(overrides)
    return RouteEntryConfig(**values)


class EventLog:
    """An ``on_event`` callback that keeps ``(name, data)`` pairs."""

    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []

    async def __call__(self, name: str, data: dict[str, Any]) -> None:
        self.events.append((name, data))

    def names(self) -> list[str]:
        return [name for name, _ in self.events]


class Recorder:
    def __init__(self) -> None:
        self.records: list[AttemptRecord] = []

    async def __call__(self, record: AttemptRecord) -> None:
        self.records.append(record)

    def summary(self) -> list[tuple[int, int, str, str | None]]:
        """(attempt, entry_index, status, error_class) per record."""
        return [(r.attempt, r.entry_index, r.status, r.error_class) for r in self.records]


async def collect(
    router: Router, messages: Sequence[ChatMessage] = USER, tools: Sequence[ToolSpec] = (), **kwargs: Any
) -> list[StreamEvent]:
    return [event async for event in router.stream(messages, tools, **kwargs)]


def text_of(events: Sequence[StreamEvent]) -> str:
    return "".join(e.text for e in events if isinstance(e, TextDelta))


# --- successful calls -----------------------------------------------------------------------


async def test_plain_answer_streams_in_several_deltas(server_a: FakeLLMServer) -> None:
    # 20 ms apart: separate reads, so separate deltas (events of one read make one delta).
    server_a.script(Reply("It is ten past ten in Tokyo.", chunk_size=5, chunk_interval_seconds=0.02))
    recorder = Recorder()

    events = await collect(Router([entry(0, server_a.base_url)], record=recorder))

    deltas = [e for e in events if isinstance(e, TextDelta)]
    assert len(deltas) >= 3
    assert text_of(events) == "It is ten past ten in Tokyo."
    completion = events[-1]
    assert isinstance(completion, Completion)
    assert completion.message == ChatMessage(role="assistant", content="It is ten past ten in Tokyo.")
    assert (completion.entry_index, completion.model, completion.finish_reason) == (0, "model-0", "stop")
    assert not completion.usage.estimated and completion.usage.completion_tokens > 0
    (record,) = recorder.records
    assert (record.status, record.attempt, record.entry_index, record.error_class, record.error) == (
        "succeeded", 1, 0, None, ""
    )
    assert (record.provider_name, record.model) == ("provider0", "model-0")
    assert record.prompt_tokens == completion.usage.prompt_tokens and not record.usage_estimated
    assert record.first_token_ms is not None and 0 <= record.first_token_ms <= record.latency_ms
    (request,) = server_a.requests
    assert request["model"] == "model-0" and request["stream"] is True
    assert request["stream_options"] == {"include_usage": True}
    assert request["max_tokens"] == 1024
    assert "tools" not in request
    assert request["messages"] == [m.to_openai() for m in USER]


async def test_reasoning_deltas_are_separate(server_a: FakeLLMServer) -> None:
    server_a.script(Reply("42", reasoning="Let me think.", chunk_size=4))

    events = await collect(Router([entry(0, server_a.base_url)]))

    assert "".join(e.text for e in events if isinstance(e, ReasoningDelta)) == "Let me think."
    assert events[-1].message.content == "42"  # type: ignore[union-attr]


async def test_native_tool_calls_are_reassembled(server_a: FakeLLMServer) -> None:
    server_a.script(
        ToolCalls([("get_current_time", {"timezone": "Asia/Tokyo"}), ("add", {"a": 1, "b": [2, 3]})], chunk_size=3)
    )
    recorder = Recorder()

    events = await collect(Router([entry(0, server_a.base_url)], record=recorder), tools=[TIME_TOOL])

    completion = events[-1]
    assert isinstance(completion, Completion) and len(events) == 1
    assert completion.finish_reason == "tool_calls"
    calls = completion.message.tool_calls
    assert [(c.name, c.parsed_arguments()) for c in calls] == [
        ("get_current_time", {"timezone": "Asia/Tokyo"}),
        ("add", {"a": 1, "b": [2, 3]}),
    ]
    assert all(c.id.startswith("call_") for c in calls) and calls[0].id != calls[1].id
    assert recorder.summary() == [(1, 0, "succeeded", None)]
    assert recorder.records[0].first_token_ms is not None
    assert server_a.requests[0]["tools"] == [TIME_TOOL.to_openai()]


async def test_tool_history_is_sent_in_openai_shape(server_a: FakeLLMServer) -> None:
    server_a.script(Reply("It is 10:00."))
    call = ToolCallRequest(id="call_abc", name="get_current_time", arguments='{"timezone": "UTC"}')
    history = [
        *USER,
        ChatMessage(role="assistant", tool_calls=(call,)),
        ChatMessage(role="tool", content="10:00", tool_call_id="call_abc", name="get_current_time"),
    ]

    await collect(Router([entry(0, server_a.base_url)]), history, [TIME_TOOL])

    sent = server_a.requests[0]["messages"]
    assert sent[2]["tool_calls"][0]["id"] == "call_abc" and sent[2]["content"] == ""
    assert sent[3] == {"role": "tool", "content": "10:00", "tool_call_id": "call_abc"}


async def test_text_mode_parses_the_tool_call_and_hides_its_json(server_a: FakeLLMServer) -> None:
    # The bare-JSON shape Qwen2.5-Coder-0.5B writes, streamed in small pieces.
    server_a.script(
        Reply('Let me check.\n{"name": "get_current_time", "arguments": {"timezone": "Asia/Tokyo"}}', chunk_size=3)
    )
    recorder = Recorder()
    router = Router([entry(0, server_a.base_url, tool_calls="text")], record=recorder)

    events = await collect(router, tools=[TIME_TOOL])

    assert text_of(events) == "Let me check."
    completion = events[-1]
    assert isinstance(completion, Completion)
    assert completion.message.content == "Let me check."
    assert [(c.name, c.parsed_arguments()) for c in completion.message.tool_calls] == [
        ("get_current_time", {"timezone": "Asia/Tokyo"})
    ]
    assert completion.finish_reason == "tool_calls"
    request = server_a.requests[0]
    assert "tools" not in request
    assert request["messages"][0]["role"] == "system"
    assert request["messages"][0]["content"].startswith("You are terse.\n\n# Tools")
    assert json.dumps(TIME_TOOL.to_openai()) in request["messages"][0]["content"]
    assert recorder.summary() == [(1, 0, "succeeded", None)]


async def test_text_mode_rewrites_tool_history(server_a: FakeLLMServer) -> None:
    server_a.script(Reply("<tool_call>\n{\"name\": \"get_current_time\", \"arguments\": {}}\n</tool_call>"))
    call = ToolCallRequest(id="call_abc", name="get_current_time", arguments='{"timezone": "UTC"}')
    history = [
        *USER,
        ChatMessage(role="assistant", content="", tool_calls=(call,)),
        ChatMessage(role="tool", content="10:00", tool_call_id="call_abc", name="get_current_time"),
    ]

    events = await collect(Router([entry(0, server_a.base_url, tool_calls="text")]), history, [TIME_TOOL])

    assert text_of(events) == ""
    assert events[-1].message.tool_calls[0].name == "get_current_time"  # type: ignore[union-attr]
    sent = server_a.requests[0]["messages"]
    assert [m["role"] for m in sent] == ["system", "user", "assistant", "user"]
    assert "tool_calls" not in sent[2] and sent[2]["content"].startswith("<tool_call>\n")
    assert sent[3]["content"] == "<tool_response>\n10:00\n</tool_response>\n" + TOOL_RESULTS_FOLLOW_UP


async def test_usage_is_estimated_when_the_provider_sends_none(server_a: FakeLLMServer) -> None:
    server_a.script(Reply("abcdefghij" * 4, include_usage=False))
    recorder = Recorder()

    events = await collect(Router([entry(0, server_a.base_url)], record=recorder))

    usage = events[-1].usage  # type: ignore[union-attr]
    assert usage.estimated
    assert usage.prompt_tokens == estimate_tokens(USER, [])
    assert usage.completion_tokens == 10  # 40 characters / 4
    assert recorder.records[0].usage_estimated
    assert (recorder.records[0].prompt_tokens, recorder.records[0].completion_tokens) == (usage.prompt_tokens, 10)


async def test_max_output_tokens_caps_the_entry_limit(server_a: FakeLLMServer) -> None:
    server_a.script(Reply("a"), Reply("b"))
    router = Router([entry(0, server_a.base_url, max_output_tokens=100)])

    await collect(router, max_output_tokens=10)
    await collect(router, max_output_tokens=500)

    assert [r["max_tokens"] for r in server_a.requests] == [10, 100]


async def test_complete_returns_the_completion(server_a: FakeLLMServer) -> None:
    server_a.script(Reply("done"))

    completion = await Router([entry(0, server_a.base_url)]).complete(USER, [])

    assert completion.message.content == "done"


# --- fallback before the first token ---------------------------------------------------------


@pytest.mark.parametrize(
    ("failure", "error_class"),
    [
        (Fail(500), "server"),
        (Fail(503, headers={"Retry-After": "1"}), "overloaded"),
        (Fail(429, headers={"Retry-After": "3"}), "rate_limit"),
        (Fail(401), "auth"),
        (Fail(404), "not_found"),
        (Fail(402, body={"error": {"message": "Insufficient Balance"}}), "quota_exhausted"),
    ],
    ids=["500", "503", "429", "401", "404", "402"],
)
async def test_falls_back_to_the_next_entry(
    server_a: FakeLLMServer, server_b: FakeLLMServer, failure: Fail, error_class: str
) -> None:
    server_a.script(failure)
    server_b.script(Reply("from b"))
    recorder = Recorder()
    events_seen = EventLog()
    router = Router(
        [entry(0, server_a.base_url, max_retries=0), entry(1, server_b.base_url)],
        record=recorder,
        on_event=events_seen,
    )

    events = await collect(router)

    assert text_of(events) == "from b"
    assert (events[-1].entry_index, events[-1].model) == (1, "model-1")  # type: ignore[union-attr]
    assert recorder.summary() == [(1, 0, "failed", error_class), (2, 1, "succeeded", None)]
    assert events_seen.events == [
        (
            "model_fallback",
            {"from_entry_index": 0, "from_model": "model-0", "to_entry_index": 1, "to_model": "model-1",
             "error_class": error_class},
        )
    ]
    failed = recorder.records[0]
    assert failed.error.startswith(f"HTTP {failure.status}: ")
    assert failed.first_token_ms is None
    assert (failed.prompt_tokens, failed.completion_tokens, failed.usage_estimated) == (0, 0, False)
    assert len(server_a.requests) == len(server_b.requests) == 1


async def test_falls_back_when_the_first_entry_hangs(server_a: FakeLLMServer, server_b: FakeLLMServer) -> None:
    server_a.script(Hang(30))
    server_b.script(Reply("from b"))
    recorder = Recorder()
    router = Router(
        [entry(0, server_a.base_url, read_timeout_seconds=0.5, max_retries=0), entry(1, server_b.base_url)],
        record=recorder,
    )

    events = await collect(router)

    assert text_of(events) == "from b"
    assert recorder.summary() == [(1, 0, "failed", "timeout"), (2, 1, "succeeded", None)]
    assert 400 <= recorder.records[0].latency_ms < 5000


async def test_falls_back_when_no_token_follows_the_headers(server_a: FakeLLMServer, server_b: FakeLLMServer) -> None:
    # Headers and an empty role chunk arrive, then nothing within the read timeout.
    server_a.script(Reply("late", chunk_interval_seconds=30))
    server_b.script(Reply("from b"))
    recorder = Recorder()
    router = Router(
        [entry(0, server_a.base_url, read_timeout_seconds=0.5, max_retries=0), entry(1, server_b.base_url)],
        record=recorder,
    )

    events = await collect(router)

    assert text_of(events) == "from b"
    assert recorder.summary() == [(1, 0, "failed", "timeout"), (2, 1, "succeeded", None)]


async def test_falls_back_on_connection_refused(closed_port_url: str, server_b: FakeLLMServer) -> None:
    server_b.script(Reply("from b"))
    recorder = Recorder()
    router = Router([entry(0, closed_port_url, max_retries=0), entry(1, server_b.base_url)], record=recorder)

    events = await collect(router)

    assert text_of(events) == "from b"
    assert recorder.summary() == [(1, 0, "failed", "network"), (2, 1, "succeeded", None)]


async def test_falls_back_after_a_delayed_failure(server_a: FakeLLMServer, server_b: FakeLLMServer) -> None:
    server_a.script(Delay(0.05, Fail(502)))
    server_b.script(Reply("from b"))
    recorder = Recorder()

    await collect(Router([entry(0, server_a.base_url, max_retries=0), entry(1, server_b.base_url)], record=recorder))

    assert recorder.summary() == [(1, 0, "failed", "server"), (2, 1, "succeeded", None)]
    assert recorder.records[0].latency_ms >= 50


async def test_all_entries_failed(
    server_a: FakeLLMServer, server_b: FakeLLMServer, closed_port_url: str
) -> None:
    server_a.script(Fail(500))
    server_b.script(Fail(429, headers={"Retry-After": "5"}))
    recorder = Recorder()
    router = Router(
        [
            entry(0, server_a.base_url, max_retries=0),
            entry(1, server_b.base_url, max_retries=0),
            entry(2, closed_port_url, max_retries=0),
        ],
        record=recorder,
    )

    with pytest.raises(AllEntriesFailed) as caught:
        await collect(router)

    assert recorder.summary() == [(1, 0, "failed", "server"), (2, 1, "failed", "rate_limit"), (3, 2, "failed", "network")]
    assert caught.value.attempts == recorder.records
    assert caught.value.last_error is not None and caught.value.last_error.error_class == "network"


# --- no fallback -------------------------------------------------------------------------------


async def test_bad_request_surfaces_without_fallback(server_a: FakeLLMServer, server_b: FakeLLMServer) -> None:
    server_a.script(Fail(400, body={"error": {"message": "messages: field required", "type": "invalid_request_error"}}))
    server_b.script(Reply("never"))
    recorder = Recorder()
    router = Router([entry(0, server_a.base_url), entry(1, server_b.base_url)], record=recorder)

    with pytest.raises(ModelCallError) as caught:
        await collect(router)

    assert (caught.value.error_class, caught.value.status_code) == ("bad_request", 400)
    assert "field required" in caught.value.message
    assert recorder.summary() == [(1, 0, "failed", "bad_request")]
    assert server_b.requests == []


async def test_no_fallback_after_the_first_token(server_a: FakeLLMServer, server_b: FakeLLMServer) -> None:
    server_a.script(CutAfter("Partial answer that never ends", n_chunks=3, chunk_size=4))
    server_b.script(Reply("never"))
    recorder = Recorder()
    router = Router([entry(0, server_a.base_url), entry(1, server_b.base_url)], record=recorder)
    events: list[StreamEvent] = []

    with pytest.raises(StreamInterrupted) as caught:
        async for event in router.stream(USER, []):
            events.append(event)

    assert text_of(events) == "Partial answ"
    assert (caught.value.error_class, caught.value.entry_index, caught.value.retryable) == ("network", 0, True)
    assert recorder.summary() == [(1, 0, "failed", "network")]
    record = recorder.records[0]
    assert record.first_token_ms is not None
    assert record.usage_estimated and record.completion_tokens == 3  # 12 characters / 4
    assert server_b.requests == []


async def test_no_fallback_after_a_tool_call_fragment(server_a: FakeLLMServer, server_b: FakeLLMServer) -> None:
    # Tool-call fragments are not yielded, but they commit the stream all the same.
    server_a.script(Stall(ToolCalls([("get_current_time", {"timezone": "Asia/Tokyo"})]), n_chunks=1))
    server_b.script(Reply("never"))
    recorder = Recorder()
    router = Router(
        [entry(0, server_a.base_url, read_timeout_seconds=0.5), entry(1, server_b.base_url)], record=recorder
    )

    with pytest.raises(StreamInterrupted) as caught:
        await collect(router, tools=[TIME_TOOL])

    assert caught.value.error_class == "timeout"
    assert recorder.summary() == [(1, 0, "failed", "timeout")]
    assert server_b.requests == []


async def test_stall_between_chunks_interrupts(server_a: FakeLLMServer, server_b: FakeLLMServer) -> None:
    server_a.script(Stall(Reply("slow tokens", chunk_size=2), n_chunks=2))
    server_b.script(Reply("never"))
    recorder = Recorder()
    router = Router(
        [entry(0, server_a.base_url, read_timeout_seconds=0.5), entry(1, server_b.base_url)], record=recorder
    )

    events: list[StreamEvent] = []

    with pytest.raises(StreamInterrupted) as caught:
        async for event in router.stream(USER, []):
            events.append(event)

    assert text_of(events) == "slow"
    assert caught.value.error_class == "timeout"
    assert recorder.summary() == [(1, 0, "failed", "timeout")]
    assert server_b.requests == []
    assert await server_a.await_disconnects(1)


# --- cancellation and early close -------------------------------------------------------------


async def test_cancellation_propagates_and_closes_the_stream(server_a: FakeLLMServer, server_b: FakeLLMServer) -> None:
    server_a.script(Hang(30))
    recorder = Recorder()
    router = Router([entry(0, server_a.base_url), entry(1, server_b.base_url)], record=recorder)
    task = asyncio.create_task(collect(router))

    assert await server_a.await_requests(1)
    task.cancel()

    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, timeout=2)
    assert await server_a.await_disconnects(1)
    assert recorder.summary() == [(1, 0, "failed", "cancelled")]
    assert server_b.requests == []


async def test_cancellation_mid_stream(server_a: FakeLLMServer) -> None:
    server_a.script(Reply("x" * 200, chunk_size=1, chunk_interval_seconds=0.02))
    recorder = Recorder()
    router = Router([entry(0, server_a.base_url)], record=recorder)
    first_delta = asyncio.Event()

    async def consume() -> None:
        async for event in router.stream(USER, []):
            if isinstance(event, TextDelta):
                first_delta.set()

    task = asyncio.create_task(consume())
    await asyncio.wait_for(first_delta.wait(), timeout=5)
    task.cancel()

    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, timeout=2)
    assert await server_a.await_disconnects(1)
    (record,) = recorder.records
    assert (record.status, record.error_class, record.usage_estimated) == ("failed", "cancelled", True)


async def test_closing_the_stream_early_records_and_disconnects(server_a: FakeLLMServer) -> None:
    server_a.script(Reply("y" * 200, chunk_size=1, chunk_interval_seconds=0.02))
    recorder = Recorder()
    router = Router([entry(0, server_a.base_url)], record=recorder)

    async with aclosing(router.stream(USER, [])) as stream:
        async for event in stream:
            assert isinstance(event, TextDelta)
            break

    assert recorder.summary() == [(1, 0, "failed", "cancelled")]
    assert await server_a.await_disconnects(1)


async def test_consumer_stopping_at_the_completion_records_once(server_a: FakeLLMServer) -> None:
    server_a.script(Reply("hi"))
    recorder = Recorder()
    router = Router([entry(0, server_a.base_url)], record=recorder)

    async with aclosing(router.stream(USER, [])) as stream:
        async for event in stream:
            if isinstance(event, Completion):
                break

    assert recorder.summary() == [(1, 0, "succeeded", None)]


# --- pooling, concurrency, configuration ----------------------------------------------------


async def test_many_concurrent_streams_share_one_server(server_a: FakeLLMServer) -> None:
    server_a.respond(lambda body: Reply(f"answer to {body['messages'][-1]['content']}", chunk_size=3))
    router = Router([entry(0, server_a.base_url)])

    async def one(i: int) -> str:
        events = await collect(router, [ChatMessage(role="user", content=f"q{i}")])
        return text_of(events)

    answers = await asyncio.gather(*(one(i) for i in range(100)))

    assert answers == [f"answer to q{i}" for i in range(100)]
    assert len(server_a.requests) == 100


async def test_no_scripted_step_left_is_a_loud_failure(server_a: FakeLLMServer) -> None:
    recorder = Recorder()

    with pytest.raises(AllEntriesFailed) as caught:
        await collect(Router([entry(0, server_a.base_url, max_retries=0)], record=recorder))

    assert caught.value.attempts[0].error_class == "server"
    assert "no scripted step left" in caught.value.attempts[0].error


def test_route_validation() -> None:
    with pytest.raises(ValueError):
        Router([])
    with pytest.raises(ValueError):
        Router([entry(1, "http://127.0.0.1:1/v1")])
    with pytest.raises(ValueError):
        entry(0, "http://127.0.0.1:1/v1", read_timeout_seconds=0)
    with pytest.raises(ValueError):
        entry(0, "http://127.0.0.1:1/v1", tool_calls="xml")


def test_entry_repr_hides_the_api_key() -> None:
    assert "sk-test-0" not in repr(entry(0, "http://127.0.0.1:1/v1"))


def test_clients_are_pooled_per_loop_and_closed_with_it(server_a: FakeLLMServer) -> None:
    server_a.respond(lambda body: Reply("ok"))
    route = [entry(0, server_a.base_url)]
    clients = []

    async def run_twice() -> None:
        await collect(Router(route))
        await collect(Router(route))
        clients.append(openai_compat._client_for(route[0]))

    asyncio.run(run_twice())
    asyncio.run(run_twice())

    assert len(server_a.requests) == 4
    assert server_a.connections_accepted == 2  # one pooled connection per event loop
    assert clients[0] is not clients[1]
    assert all(c.is_closed() for c in clients)  # closed when asyncio.run shut the loop down


# --- retries, cooldowns, capability-aware selection (FakeClock, MemoryEntryHealth) -----------

SEED = 7


class Harness:
    """A router wired to a FakeClock, a seeded RNG, a recorder and an event log."""

    def __init__(self, entries: Sequence[RouteEntryConfig], *, health: Any = None, clock: FakeClock | None = None) -> None:
        self.clock = clock or FakeClock()
        self.recorder = Recorder()
        self.events = EventLog()
        self.router = Router(
            entries,
            record=self.recorder,
            on_event=self.events,
            health=health,
            clock=self.clock,
            rng=random.Random(SEED),
        )


def expected_waits(count: int) -> list[float]:
    """The full-jitter waits a Router seeded with SEED draws for its first ``count`` retries."""
    rng = random.Random(SEED)
    return [DEFAULT_BACKOFF.delay(retry_number=n, rng=rng) for n in range(count)]


def test_backoff_is_full_jitter_capped_at_8_seconds() -> None:
    policy = BackoffPolicy()

    assert [policy.ceiling(n) for n in range(7)] == [0.5, 1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
    rng = random.Random(1)
    draws = [policy.delay(retry_number=3, rng=rng) for _ in range(500)]
    assert all(0.0 <= d <= 4.0 for d in draws)
    assert min(draws) < 0.5 and max(draws) > 3.5  # uniform over the whole [0, ceiling] range
    with pytest.raises(ValueError):
        BackoffPolicy(base_seconds=-1)


async def test_retries_the_same_entry_with_backoff_then_succeeds(server_a: FakeLLMServer, server_b: FakeLLMServer) -> None:
    server_a.script(Fail(500), Fail(502), Reply("third time lucky"))
    h = Harness([entry(0, server_a.base_url), entry(1, server_b.base_url)])

    events = await collect(h.router)

    assert text_of(events) == "third time lucky"
    assert h.recorder.summary() == [(1, 0, "failed", "server"), (2, 0, "failed", "server"), (3, 0, "succeeded", None)]
    waits = expected_waits(2)
    assert h.clock.sleeps == waits
    assert 0 <= waits[0] <= 0.5 and 0 <= waits[1] <= 1.0
    assert [r.retry_wait_ms for r in h.recorder.records] == [0, round(waits[0] * 1000), round(waits[1] * 1000)]
    assert h.events.events == [
        ("model_retry", {"entry_index": 0, "provider_name": "provider0", "model": "model-0", "error_class": "server",
                         "attempt": 2, "wait_seconds": waits[0]}),
        ("model_retry", {"entry_index": 0, "provider_name": "provider0", "model": "model-0", "error_class": "server",
                         "attempt": 3, "wait_seconds": waits[1]}),
    ]
    assert server_b.requests == []


async def test_retry_after_is_honoured(server_a: FakeLLMServer) -> None:
    server_a.script(
        Fail(429, headers={"Retry-After": "7"}),
        Fail(503, headers={"retry-after-ms": "1500"}),
        Reply("ok"),
    )
    h = Harness([entry(0, server_a.base_url)])

    await collect(h.router)

    assert h.clock.sleeps == [7.0, 1.5]
    assert [r.retry_wait_ms for r in h.recorder.records] == [0, 7000, 1500]
    assert [d["error_class"] for _, d in h.events.events] == ["rate_limit", "overloaded"]


async def test_a_stream_cut_after_its_first_token_counts_against_the_entry(
    server_a: FakeLLMServer, server_b: FakeLLMServer,
) -> None:
    clock = FakeClock()
    health = MemoryEntryHealth(clock=clock)
    server_a.script(CutAfter("Partial answer that never ends", n_chunks=3, chunk_size=4))
    a = entry(0, server_a.base_url)
    h = Harness([a, entry(1, server_b.base_url)], health=health, clock=clock)

    with pytest.raises(StreamInterrupted):
        await collect(h.router)

    snap = await health.snapshot(a.health_key)
    assert (snap.calls_last_minute, snap.failures_last_minute, snap.last_error_class) == (1, 1, "network")
    assert server_b.requests == []


async def test_a_stream_cut_after_its_first_token_records_estimated_usage(server_a: FakeLLMServer) -> None:
    # Tokens streamed before the cut are billed by providers: the failed attempt records the
    # estimated prompt and the characters that arrived (mutation testing found the prompt part
    # untested).
    server_a.script(CutAfter("Partial answer that never ends", n_chunks=3, chunk_size=4))
    recorder = Recorder()

    with pytest.raises(StreamInterrupted):
        await collect(Router([entry(0, server_a.base_url)], record=recorder))

    (record,) = recorder.records
    assert record.status == "failed" and record.usage_estimated
    assert (record.prompt_tokens, record.completion_tokens) == (estimate_tokens(USER, []), 3)  # 12 characters


async def test_a_long_retry_after_cools_the_entry_down_instead(server_a: FakeLLMServer, server_b: FakeLLMServer) -> None:
    clock = FakeClock()
    health = MemoryEntryHealth(clock=clock)
    server_a.script(Fail(429, headers={"Retry-After": "45"}))
    server_b.script(Reply("from b"), Reply("b again"))
    a, b = entry(0, server_a.base_url), entry(1, server_b.base_url)
    h = Harness([a, b], health=health, clock=clock)

    await collect(h.router)

    assert h.clock.sleeps == []  # 45 s > 30 s: not waited for
    assert h.recorder.summary() == [(1, 0, "failed", "rate_limit"), (2, 1, "succeeded", None)]
    snap = await health.snapshot(a.health_key)
    assert (snap.state, snap.cooldown_until) == ("open", clock.time() + 45)

    second = await collect(h.router)  # the next call skips the cooling entry

    assert text_of(second) == "b again"
    assert len(server_a.requests) == 1
    assert h.events.events[-1] == (
        "model_fallback",
        {"from_entry_index": 0, "from_model": "model-0", "to_entry_index": 1, "to_model": "model-1",
         "error_class": "cooldown"},
    )


async def test_a_failure_that_will_be_retried_only_counts_against_the_entry(server_a: FakeLLMServer) -> None:
    # The router retries after the Retry-After: the breaker must stay closed, counting the
    # failure, not open for the Retry-After (which the retry then finds over and probes,
    # clearing the count). Found untested by mutation testing.
    clock = FakeClock()
    health = MemoryEntryHealth(clock=clock)
    server_a.script(Fail(429, headers={"Retry-After": "3"}), Reply("ok"))
    a = entry(0, server_a.base_url, max_retries=1)
    h = Harness([a], health=health, clock=clock)

    assert text_of(await collect(h.router)) == "ok"

    assert h.clock.sleeps == [3.0]
    snap = await health.snapshot(a.health_key)
    assert (snap.state, snap.calls_last_minute, snap.failures_last_minute) == ("closed", 2, 1)


async def test_the_callers_output_cap_lowers_the_room_an_entry_must_have(
    server_a: FakeLLMServer, server_b: FakeLLMServer,
) -> None:
    # The entry's own cap (4096 output tokens) would not fit beside the prompt in its window;
    # the caller's 50 do, so the entry takes the call (found untested by mutation testing).
    from llm.tokens import estimate_tokens

    server_a.script(Reply("from a"))
    server_b.script(Reply("from b"))
    window = estimate_tokens(USER, []) + 100
    small = entry(0, server_a.base_url, max_input_tokens=window, max_output_tokens=4096)
    h = Harness([small, entry(1, server_b.base_url)])

    events = [event async for event in h.router.stream(USER, [], max_output_tokens=50)]

    assert text_of(events) == "from a" and server_b.requests == []
    assert text_of(await collect(h.router)) == "from b"  # without the caller's cap it does not fit


async def test_retries_exhausted_then_falls_back(server_a: FakeLLMServer, server_b: FakeLLMServer) -> None:
    server_a.respond(lambda body: Fail(500))
    server_b.script(Reply("from b"))
    h = Harness([entry(0, server_a.base_url), entry(1, server_b.base_url)])

    events = await collect(h.router)

    assert text_of(events) == "from b"
    assert h.recorder.summary() == [
        (1, 0, "failed", "server"), (2, 0, "failed", "server"), (3, 0, "failed", "server"), (4, 1, "succeeded", None)
    ]
    assert h.events.names() == ["model_retry", "model_retry", "model_fallback"]
    assert h.events.events[-1][1]["error_class"] == "server"
    assert len(h.recorder.records) <= h.router.max_attempts


async def test_attempts_never_exceed_one_per_entry_plus_their_retries(
    server_a: FakeLLMServer, server_b: FakeLLMServer, server_c: FakeLLMServer
) -> None:
    for server in (server_a, server_b, server_c):
        server.respond(lambda body: Fail(503))
    route = [
        entry(0, server_a.base_url, max_retries=2),
        entry(1, server_b.base_url, max_retries=0),
        entry(2, server_c.base_url, max_retries=1),
    ]
    h = Harness(route)

    with pytest.raises(AllEntriesFailed) as caught:
        await collect(h.router)

    assert h.router.max_attempts == 3 + (2 + 0 + 1)
    assert len(caught.value.attempts) == len(h.recorder.records) == h.router.max_attempts
    assert [len(s.requests) for s in (server_a, server_b, server_c)] == [3, 1, 2]


@pytest.mark.parametrize("seed", range(12))
async def test_attempt_bound_holds_for_random_failure_mixes(
    seed: int, server_a: FakeLLMServer, server_b: FakeLLMServer, server_c: FakeLLMServer
) -> None:
    rng = random.Random(seed)
    steps = [Fail(500), Fail(429, headers={"Retry-After": "0"}), Fail(401), Fail(503), Reply("ok")]
    for server in (server_a, server_b, server_c):
        server.respond(lambda body: rng.choice(steps))
    route = [entry(i, s.base_url, max_retries=rng.randint(0, 3)) for i, s in enumerate((server_a, server_b, server_c))]
    h = Harness(route)

    try:
        await collect(h.router)
    except AllEntriesFailed:
        pass

    assert 1 <= len(h.recorder.records) <= h.router.max_attempts
    assert sum(len(s.requests) for s in (server_a, server_b, server_c)) == len(h.recorder.records)


@pytest.mark.parametrize(
    ("failure", "error_class", "cooldown"),
    [
        (Fail(429, body={"error": {"message": "You exceeded your current quota", "type": "insufficient_quota",
                                   "code": "insufficient_quota"}}), "quota_exhausted", 3600.0),
        (Fail(401), "auth", 600.0),
        (Fail(404, body={"error": {"message": "The model `x` does not exist", "code": "model_not_found"}}),
         "not_found", 600.0),
    ],
    ids=["quota", "auth", "not_found"],
)
async def test_non_retryable_statuses_fall_back_at_once_with_a_long_cooldown(
    server_a: FakeLLMServer, server_b: FakeLLMServer, failure: Fail, error_class: str, cooldown: float
) -> None:
    clock = FakeClock()
    health = MemoryEntryHealth(clock=clock)
    server_a.script(failure)
    server_b.script(Reply("from b"))
    a = entry(0, server_a.base_url)
    h = Harness([a, entry(1, server_b.base_url)], health=health, clock=clock)

    await collect(h.router)

    assert h.recorder.summary() == [(1, 0, "failed", error_class), (2, 1, "succeeded", None)]
    assert h.clock.sleeps == [] and "model_retry" not in h.events.names()
    snap = await health.snapshot(a.health_key)
    assert (snap.state, snap.cooldown_until, snap.last_error_class) == ("open", clock.time() + cooldown, error_class)


async def test_content_policy_falls_back_without_retry_or_breaker(server_a: FakeLLMServer, server_b: FakeLLMServer) -> None:
    clock = FakeClock()
    health = MemoryEntryHealth(clock=clock)
    server_a.script(
        Fail(400, body={"error": {"code": "content_policy_violation", "type": "invalid_request_error",
                                  "message": "Your request was rejected as a result of our safety system."}})
    )
    server_b.script(Reply("from b"))
    a = entry(0, server_a.base_url)
    h = Harness([a, entry(1, server_b.base_url)], health=health, clock=clock)

    await collect(h.router)

    assert h.recorder.summary() == [(1, 0, "failed", "content_policy"), (2, 1, "succeeded", None)]
    snap = await health.snapshot(a.health_key)
    assert (snap.state, snap.failures_last_minute, snap.calls_last_minute) == ("closed", 0, 1)


async def test_a_content_filter_finish_before_any_token_falls_back(server_a: FakeLLMServer, server_b: FakeLLMServer) -> None:
    server_a.script(Reply("", finish_reason="content_filter"))
    server_b.script(Reply("from b"))
    h = Harness([entry(0, server_a.base_url), entry(1, server_b.base_url)])

    events = await collect(h.router)

    assert text_of(events) == "from b"
    assert h.recorder.summary() == [(1, 0, "failed", "content_policy"), (2, 1, "succeeded", None)]


async def test_a_content_filter_finish_after_tokens_interrupts(server_a: FakeLLMServer, server_b: FakeLLMServer) -> None:
    server_a.script(Reply("Here is how to", finish_reason="content_filter"))
    h = Harness([entry(0, server_a.base_url), entry(1, server_b.base_url)])

    with pytest.raises(StreamInterrupted) as caught:
        await collect(h.router)

    assert caught.value.error_class == "content_policy"
    assert server_b.requests == []


async def test_context_window_falls_back_only_to_a_larger_window(
    server_a: FakeLLMServer, server_b: FakeLLMServer, server_c: FakeLLMServer
) -> None:
    server_a.script(
        Fail(400, body={"error": {"message": "This model's maximum context length is 8192 tokens.",
                                  "code": "context_length_exceeded"}})
    )
    server_c.script(Reply("from the big one"))
    route = [
        entry(0, server_a.base_url, max_input_tokens=8192),
        entry(1, server_b.base_url, max_input_tokens=4096),
        entry(2, server_c.base_url, max_input_tokens=32768),
    ]
    h = Harness(route)

    events = await collect(h.router)

    assert text_of(events) == "from the big one"
    assert h.recorder.summary() == [(1, 0, "failed", "context_window"), (2, 2, "succeeded", None)]
    assert server_b.requests == []
    assert [(d["from_entry_index"], d["to_entry_index"], d["error_class"]) for _, d in h.events.events] == [
        (0, 1, "context_window"),
        (1, 2, "context_window"),
    ]


async def test_context_window_with_no_larger_entry_asks_for_compaction(
    server_a: FakeLLMServer, server_b: FakeLLMServer
) -> None:
    server_a.script(Fail(400, body={"error": {"message": "prompt is too long: 9000 tokens > 8192 maximum"}}))
    route = [entry(0, server_a.base_url, max_input_tokens=8192), entry(1, server_b.base_url, max_input_tokens=8192)]
    h = Harness(route)

    with pytest.raises(ContextWindowExceeded) as caught:
        await collect(h.router)

    assert isinstance(caught.value, AllEntriesFailed)
    assert caught.value.largest_window_tokens == 8192
    assert [a.error_class for a in caught.value.attempts] == ["context_window"]
    assert server_b.requests == []


TOO_LONG = {"error": {"message": "prompt is too long: 9000 tokens > 8192 maximum"}}


async def test_when_every_entry_was_too_small_the_call_asks_for_compaction(
    server_a: FakeLLMServer, server_b: FakeLLMServer
) -> None:
    # Both entries are tried (the larger one's window is not known to be too small) and both
    # answer "too long": the caller is told to compact, not that the route failed.
    server_a.script(Fail(400, body=TOO_LONG))
    server_b.script(Fail(400, body=TOO_LONG))
    route = [entry(0, server_a.base_url, max_input_tokens=8192), entry(1, server_b.base_url, max_input_tokens=16384)]
    h = Harness(route)

    with pytest.raises(ContextWindowExceeded) as caught:
        await collect(h.router)

    assert [a.error_class for a in caught.value.attempts] == ["context_window", "context_window"]
    assert caught.value.largest_window_tokens == 16384
    last = caught.value.last_error  # the caller shows it (found untested by mutation testing)
    assert (last.error_class, last.message) == ("context_window", "prompt is too long: 9000 tokens > 8192 maximum")


async def test_when_an_entry_failed_otherwise_the_route_failed_and_compaction_would_not_help(
    server_a: FakeLLMServer, server_b: FakeLLMServer
) -> None:
    server_a.script(Fail(400, body=TOO_LONG))
    server_b.script(*[Fail(401)] * 3)
    route = [entry(0, server_a.base_url, max_input_tokens=8192), entry(1, server_b.base_url, max_input_tokens=16384)]
    h = Harness(route)

    with pytest.raises(AllEntriesFailed) as caught:
        await collect(h.router)

    assert not isinstance(caught.value, ContextWindowExceeded)
    assert [a.error_class for a in caught.value.attempts][0] == "context_window"
    assert caught.value.attempts[-1].error_class == "auth"


def long_history(tokens: int) -> list[ChatMessage]:
    """A history whose estimate is exactly ``tokens``."""
    base = estimate_tokens([ChatMessage(role="user", content="")], [])
    return [ChatMessage(role="user", content="x" * (4 * (tokens - base)))]


def test_unsuitable_reason_counts_the_prompt_and_the_output_cap() -> None:
    e = entry(0, "http://127.0.0.1:1/v1", max_input_tokens=8192, max_output_tokens=1024)
    history = long_history(7500)

    assert estimate_tokens(history, []) == 7500
    assert unsuitable_reason(e, prompt_tokens=7500, tools=[]) == "context_window"  # 7500 + 1024 > 8192
    assert unsuitable_reason(e, prompt_tokens=7500, tools=[], max_output_tokens=500) is None  # 8000 <= 8192
    assert unsuitable_reason(entry(0, "http://x/v1", max_input_tokens=0), prompt_tokens=10**9, tools=[]) is None
    native = entry(0, "http://x/v1", supports_tools=False)
    text = entry(0, "http://x/v1", supports_tools=False, tool_calls="text")
    assert unsuitable_reason(native, prompt_tokens=10, tools=[TIME_TOOL]) == "no_tool_support"
    assert unsuitable_reason(native, prompt_tokens=10, tools=[]) is None
    assert unsuitable_reason(text, prompt_tokens=10, tools=[TIME_TOOL]) is None


async def test_entries_too_small_for_the_request_are_skipped(server_a: FakeLLMServer, server_b: FakeLLMServer) -> None:
    server_b.script(Reply("from the big one"))
    route = [entry(0, server_a.base_url, max_input_tokens=8192), entry(1, server_b.base_url, max_input_tokens=32768)]
    h = Harness(route)

    events = await collect(h.router, long_history(10_000))

    assert text_of(events) == "from the big one"
    assert server_a.requests == []
    assert h.recorder.summary() == [(1, 1, "succeeded", None)]
    assert h.events.events == [
        ("model_fallback", {"from_entry_index": 0, "from_model": "model-0", "to_entry_index": 1,
                            "to_model": "model-1", "error_class": "context_window"}),
    ]


async def test_a_request_too_large_for_every_entry_is_not_sent(server_a: FakeLLMServer, server_b: FakeLLMServer) -> None:
    route = [entry(0, server_a.base_url, max_input_tokens=8192), entry(1, server_b.base_url, max_input_tokens=16384)]
    h = Harness(route)

    with pytest.raises(ContextWindowExceeded) as caught:
        await collect(h.router, long_history(20_000))

    assert caught.value.attempts == [] and caught.value.estimated_prompt_tokens == 20_000
    assert caught.value.skipped == [(0, "context_window"), (1, "context_window")]
    assert server_a.requests == server_b.requests == []


async def test_entries_without_native_tools_are_skipped_when_tools_are_offered(
    server_a: FakeLLMServer, server_b: FakeLLMServer
) -> None:
    server_a.script(Reply("a, no tools needed"))
    server_b.script(Reply("b, with tools"))
    h = Harness([entry(0, server_a.base_url, supports_tools=False), entry(1, server_b.base_url)])

    with_tools = await collect(h.router, tools=[TIME_TOOL])
    without = await collect(h.router)

    assert text_of(with_tools) == "b, with tools"
    assert text_of(without) == "a, no tools needed"
    assert h.events.events[0][1]["error_class"] == "no_tool_support"


async def test_no_entry_taking_tools_is_a_bad_request(server_a: FakeLLMServer) -> None:
    h = Harness([entry(0, server_a.base_url, supports_tools=False)])

    with pytest.raises(ModelCallError) as caught:
        await collect(h.router, tools=[TIME_TOOL])

    assert caught.value.error_class == "bad_request"
    assert server_a.requests == []


async def test_an_open_entry_is_skipped_and_the_chain_of_events_says_why(
    server_a: FakeLLMServer, server_b: FakeLLMServer, server_c: FakeLLMServer
) -> None:
    clock = FakeClock()
    health = MemoryEntryHealth(clock=clock)
    a, b, c = entry(0, server_a.base_url), entry(1, server_b.base_url), entry(2, server_c.base_url)
    await health.record_failure(a.health_key, "auth")
    server_b.script(Fail(401))
    server_c.script(Reply("from c"))
    h = Harness([a, b, c], health=health, clock=clock)

    events = await collect(h.router)

    assert text_of(events) == "from c"
    assert server_a.requests == []
    assert [(d["from_entry_index"], d["to_entry_index"], d["error_class"]) for _, d in h.events.events] == [
        (0, 1, "cooldown"),
        (1, 2, "auth"),
    ]


async def test_when_every_entry_is_open_the_one_recovering_first_is_tried(
    server_a: FakeLLMServer, server_b: FakeLLMServer
) -> None:
    clock = FakeClock()
    health = MemoryEntryHealth(clock=clock)
    a, b = entry(0, server_a.base_url), entry(1, server_b.base_url)
    await health.record_failure(a.health_key, "auth")  # 600 s
    await health.record_failure(b.health_key, "rate_limit", retry_after_seconds=20)  # 20 s
    server_b.script(Reply("b, despite its cooldown"))
    h = Harness([a, b], health=health, clock=clock)

    events = await collect(h.router)

    assert text_of(events) == "b, despite its cooldown"
    assert server_a.requests == []
    assert h.recorder.summary() == [(1, 1, "succeeded", None)]


async def test_every_entry_open_and_failing_reports_the_skips(server_a: FakeLLMServer, server_b: FakeLLMServer) -> None:
    clock = FakeClock()
    health = MemoryEntryHealth(clock=clock)
    a, b = entry(0, server_a.base_url, max_retries=0), entry(1, server_b.base_url, max_retries=0)
    await health.record_failure(a.health_key, "auth")
    await health.record_failure(b.health_key, "auth")
    server_a.script(Fail(401))
    h = Harness([a, b], health=health, clock=clock)

    with pytest.raises(AllEntriesFailed) as caught:
        await collect(h.router)

    assert caught.value.skipped == [(0, "cooldown"), (1, "cooldown")]
    assert [r.entry_index for r in caught.value.attempts] == [0]  # ties: route order
    assert "skipped #0 (cooldown), #1 (cooldown)" in str(caught.value)


async def test_after_the_cooldown_one_probe_closes_the_breaker(server_a: FakeLLMServer) -> None:
    clock = FakeClock()
    health = MemoryEntryHealth(clock=clock)
    a = entry(0, server_a.base_url)
    await health.record_failure(a.health_key, "rate_limit", retry_after_seconds=10)
    clock.advance(11)
    server_a.script(Reply("probe answered"))
    h = Harness([a], health=health, clock=clock)

    events = await collect(h.router)

    assert text_of(events) == "probe answered"
    assert (await health.snapshot(a.health_key)).state == "closed"


class UnreachableHealth:
    """An EntryHealth whose store is down."""

    async def available(self, key: str) -> bool:
        raise HealthStateUnavailable("redis is down")

    async def record_success(self, key: str) -> None:
        raise HealthStateUnavailable("redis is down")

    async def record_failure(self, key: str, error_class: str, **kwargs: Any) -> None:
        raise HealthStateUnavailable("redis is down")

    async def snapshot(self, key: str) -> Any:
        raise HealthStateUnavailable("redis is down")


async def test_a_health_store_that_is_down_never_fails_a_call(server_a: FakeLLMServer) -> None:
    server_a.script(Fail(500), Reply("answered anyway"))
    h = Harness([entry(0, server_a.base_url)], health=UnreachableHealth())

    events = await collect(h.router)

    assert text_of(events) == "answered anyway"


async def test_cancellation_during_a_backoff_wait(server_a: FakeLLMServer) -> None:
    class BlockingClock(FakeClock):
        def __init__(self) -> None:
            super().__init__()
            self.waiting = asyncio.Event()

        async def sleep(self, seconds: float) -> None:
            self.waiting.set()
            await asyncio.Event().wait()

    clock = BlockingClock()
    server_a.script(Fail(500))
    recorder = Recorder()
    router = Router([entry(0, server_a.base_url)], record=recorder, clock=clock)
    task = asyncio.create_task(collect(router))
    await asyncio.wait_for(clock.waiting.wait(), timeout=5)

    task.cancel()

    with pytest.raises(asyncio.CancelledError):
        await task
    assert recorder.summary() == [(1, 0, "failed", "server")]  # no attempt was in flight


async def test_cost_is_recorded_in_micro_usd(server_a: FakeLLMServer) -> None:
    server_a.script(Reply("hi", usage=(1000, 500)))
    h = Harness([entry(0, server_a.base_url, input_price_per_mtok=2.5, output_price_per_mtok=10.0)])

    await collect(h.router)

    (record,) = h.recorder.records
    assert record.cost_usd_micros == 1000 * 2.5 + 500 * 10.0 == 7500  # $0.0075


def test_entry_config_validation_and_health_key() -> None:
    e = entry(0, "http://127.0.0.1:1/v1/", model="m")
    assert e.health_key == "http://127.0.0.1:1/v1|m"
    assert entry(0, "http://x/v1", entry_key="entry:42").health_key == "entry:42"
    assert e.effective_first_token_timeout_seconds == e.read_timeout_seconds
    assert entry(0, "http://x/v1", first_token_timeout_seconds=3).effective_first_token_timeout_seconds == 3
    for bad in (
        {"api": "gemini"},
        {"first_token_timeout_seconds": 0},
        {"stream_timeout_seconds": -1},
        {"max_retries": -1},
        {"max_retries": True},
        {"input_price_per_mtok": -0.1},
        {"output_price_per_mtok": float("nan")},
        {"supports_tools": "yes"},
    ):
        with pytest.raises(ValueError):
            entry(0, "http://x/v1", **bad)


async def test_anthropic_entries_use_the_anthropic_adapter(monkeypatch: pytest.MonkeyPatch) -> None:
    import llm.providers

    calls: list[str] = []

    async def fake_stream_chat(entry_: RouteEntryConfig, messages: Any, tools: Any, **kwargs: Any) -> Any:
        calls.append(entry_.model)
        kwargs["on_first_token"]()
        yield TextDelta("from claude")
        yield Completion(
            message=ChatMessage(role="assistant", content="from claude"), usage=Usage(10, 3), finish_reason="end_turn",
            entry_index=entry_.index, model=entry_.model,
        )

    class FakeAnthropicModel:  # the module's adapter model (llm.model.Model) over fake_stream_chat
        def __init__(self, entry_: RouteEntryConfig) -> None:
            self.entry = entry_

        def stream(self, messages: Any, tools: Any, settings: Any = None, **kwargs: Any) -> Any:
            return fake_stream_chat(self.entry, messages, tools, **kwargs)

    fake = types.ModuleType("llm.providers.anthropic")
    fake.AnthropicModel = FakeAnthropicModel  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "llm.providers.anthropic", fake)
    monkeypatch.setattr(llm.providers, "anthropic", fake, raising=False)

    events = await collect(Router([entry(0, "https://api.anthropic.com", api="anthropic", model="claude-x")]))

    assert text_of(events) == "from claude" and calls == ["claude-x"]


async def test_an_unexpected_error_in_the_model_layer_is_recorded_as_other_and_raised(
    monkeypatch: pytest.MonkeyPatch, server_a: FakeLLMServer, server_b: FakeLLMServer
) -> None:
    from llm.providers.openai_compat import OpenAICompatModel

    async def broken(self: Any, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a bug in an adapter")
        yield  # an async generator

    monkeypatch.setattr(OpenAICompatModel, "stream", broken)
    h = Harness([entry(0, server_a.base_url), entry(1, server_b.base_url)])

    with pytest.raises(RuntimeError, match="a bug in an adapter"):
        await collect(h.router)

    assert h.recorder.summary() == [(1, 0, "failed", "other")]  # no fallback past a bug
    assert h.recorder.records[0].error == "unexpected error in the model layer"


async def test_an_anthropic_entry_without_its_adapter_falls_back(
    monkeypatch: pytest.MonkeyPatch, server_b: FakeLLMServer
) -> None:
    import llm.providers

    monkeypatch.setitem(sys.modules, "llm.providers.anthropic", None)  # import fails
    monkeypatch.delattr(llm.providers, "anthropic", raising=False)
    server_b.script(Reply("from b"))
    h = Harness([entry(0, "https://api.anthropic.com", api="anthropic"), entry(1, server_b.base_url)])

    events = await collect(h.router)

    assert text_of(events) == "from b"
    assert h.recorder.summary() == [(1, 0, "failed", "other"), (2, 1, "succeeded", None)]
    assert "anthropic adapter" in h.recorder.records[0].error


async def test_the_entry_temperature_is_sent_only_when_set():
    with FakeLLMServer() as server:
        server.script(Reply("a"), Reply("b"))
        base = dict(index=0, provider_name="p", base_url=server.base_url, api_key="k", model="m",
                    max_input_tokens=4096, max_output_tokens=64, connect_timeout_seconds=2, read_timeout_seconds=2,
                    max_retries=0)
        await Router([RouteEntryConfig(**base, temperature=0.0)]).complete([ChatMessage(role="user", content="hi")], [])
        await Router([RouteEntryConfig(**base)]).complete([ChatMessage(role="user", content="hi")], [])
        assert server.requests[0]["temperature"] == 0.0
        assert "temperature" not in server.requests[1]
    await aclose_clients()


async def test_compact_first_raises_on_a_context_window_rejection_instead_of_falling_back(server_a, server_b):
    from llm.errors import ContextWindowExceeded

    base = dict(provider_name="p", api_key="k", model="m", max_output_tokens=64, connect_timeout_seconds=2,
                read_timeout_seconds=2, max_retries=0)
    entries = [
        RouteEntryConfig(index=0, base_url=server_a.base_url, max_input_tokens=4096, **base),
        RouteEntryConfig(index=1, base_url=server_b.base_url, max_input_tokens=32768, **base),
    ]
    too_long = Fail(400, body={"error": {"message": "This model's maximum context length is 4096 tokens",
                                         "code": "context_length_exceeded"}})
    server_a.script(too_long, too_long)
    server_b.script(Reply("from the larger entry"))
    with pytest.raises(ContextWindowExceeded):
        await _drain(
            Router(entries).stream([ChatMessage(role="user", content="hi")], [], compact_first=True))
    assert server_b.requests == []
    completion = await Router(entries).complete([ChatMessage(role="user", content="hi")], [])
    assert (completion.entry_index, completion.message.content) == (1, "from the larger entry")


async def _drain(stream):
    async for _ in stream:
        pass


async def test_the_events_of_one_read_become_one_list_and_one_delta(monkeypatch) -> None:
    """A busy loop reads several SSE events at once; they come up as one list, in order, an
    event split across reads included (the adapter then yields one delta per run of text)."""
    import httpx2

    from llm.providers.openai_compat import _sse_payloads
    from llm.tests.test_sse_decoder import _Stream as Stream

    def event(text: str) -> bytes:
        return b"data: " + json.dumps({"choices": [{"index": 0, "delta": {"content": text}}]}).encode() + b"\n\n"

    reads = [event("a") + event("b") + event("c")[:10], event("c")[10:] + event("d"), b"data: [DONE]\n\n"]
    response = httpx2.Response(200, stream=Stream(reads), request=httpx2.Request("POST", "http://x/v1"))
    lists = [[p["choices"][0]["delta"]["content"] for p in payloads] async for payloads in _sse_payloads(response)]
    assert lists == [["a", "b"], ["c", "d"]]

    async def open_stub(client, http, params):
        return httpx2.Response(200, stream=Stream(reads), request=httpx2.Request("POST", "http://x/v1"))

    monkeypatch.setattr(openai_compat, "_open_stream", open_stub)
    first_tokens: list[int] = []
    config = entry(0, "http://127.0.0.1:9/v1")
    events = [e async for e in openai_compat._stream(config, None, {}, [], [], False, lambda: first_tokens.append(1))]
    assert [e.text for e in events[:-1]] == ["ab", "cd"] and first_tokens == [1]
    assert isinstance(events[-1], Completion) and events[-1].message.content == "abcd"
