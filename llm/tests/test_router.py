"""Router + OpenAI-compatible adapter against real FakeLLMServer instances (no Django, no DB)."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import aclosing
from typing import Any

import pytest

from llm.errors import AllEntriesFailed, ModelCallError, StreamInterrupted
from llm.providers import openai_compat
from llm.providers.openai_compat import aclose_clients
from llm.router import AttemptRecord, RouteEntryConfig, Router
from llm.testing import CutAfter, Delay, Fail, FakeLLMServer, Hang, Reply, Stall, ToolCalls
from llm.tokens import estimate_tokens
from llm.types import ChatMessage, Completion, ReasoningDelta, StreamEvent, TextDelta, ToolCallRequest, ToolSpec

pytestmark = pytest.mark.timeout(60)

USER = [ChatMessage(role="system", content="You are terse."), ChatMessage(role="user", content="What time is it?")]
TIME_TOOL = ToolSpec(
    name="get_current_time",
    description="Current time in an IANA timezone.",
    parameters={"type": "object", "properties": {"timezone": {"type": "string"}}, "required": ["timezone"]},
)


# --- fixtures and helpers -------------------------------------------------------------------


@pytest.fixture
def server_a() -> Iterator[FakeLLMServer]:
    with FakeLLMServer() as server:
        yield server


@pytest.fixture
def server_b() -> Iterator[FakeLLMServer]:
    with FakeLLMServer() as server:
        yield server


@pytest.fixture
def server_c() -> Iterator[FakeLLMServer]:
    with FakeLLMServer() as server:
        yield server


@pytest.fixture(autouse=True)
async def _close_pooled_clients() -> AsyncIterator[None]:
    yield
    await aclose_clients()


@pytest.fixture
def closed_port_url() -> str:
    """A base URL nobody listens on (connection refused)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


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
    server_a.script(Reply("It is ten past ten in Tokyo.", chunk_size=5))
    recorder = Recorder()

    events = await collect(Router([entry(0, server_a.base_url)], record=recorder))

    deltas = [e for e in events if isinstance(e, TextDelta)]
    assert len(deltas) == 6
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
    assert sent[2]["tool_calls"][0]["id"] == "call_abc" and sent[2]["content"] is None
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
    assert sent[3]["content"] == "<tool_response>\n10:00\n</tool_response>"


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
        (Fail(503, headers={"Retry-After": "1"}), "server"),
        (Fail(429, headers={"Retry-After": "3"}), "rate_limit"),
        (Fail(401), "auth"),
        (Fail(404), "not_found"),
    ],
    ids=["500", "503", "429", "401", "404"],
)
async def test_falls_back_to_the_next_entry(
    server_a: FakeLLMServer, server_b: FakeLLMServer, failure: Fail, error_class: str
) -> None:
    server_a.script(failure)
    server_b.script(Reply("from b"))
    recorder = Recorder()
    router = Router([entry(0, server_a.base_url), entry(1, server_b.base_url)], record=recorder)

    events = await collect(router)

    assert text_of(events) == "from b"
    assert (events[-1].entry_index, events[-1].model) == (1, "model-1")  # type: ignore[union-attr]
    assert recorder.summary() == [(1, 0, "failed", error_class), (2, 1, "succeeded", None)]
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
        [entry(0, server_a.base_url, read_timeout_seconds=0.5), entry(1, server_b.base_url)], record=recorder
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
        [entry(0, server_a.base_url, read_timeout_seconds=0.5), entry(1, server_b.base_url)], record=recorder
    )

    events = await collect(router)

    assert text_of(events) == "from b"
    assert recorder.summary() == [(1, 0, "failed", "timeout"), (2, 1, "succeeded", None)]


async def test_falls_back_on_connection_refused(closed_port_url: str, server_b: FakeLLMServer) -> None:
    server_b.script(Reply("from b"))
    recorder = Recorder()
    router = Router([entry(0, closed_port_url), entry(1, server_b.base_url)], record=recorder)

    events = await collect(router)

    assert text_of(events) == "from b"
    assert recorder.summary() == [(1, 0, "failed", "network"), (2, 1, "succeeded", None)]


async def test_falls_back_after_a_delayed_failure(server_a: FakeLLMServer, server_b: FakeLLMServer) -> None:
    server_a.script(Delay(0.05, Fail(502)))
    server_b.script(Reply("from b"))
    recorder = Recorder()

    await collect(Router([entry(0, server_a.base_url), entry(1, server_b.base_url)], record=recorder))

    assert recorder.summary() == [(1, 0, "failed", "server"), (2, 1, "succeeded", None)]
    assert recorder.records[0].latency_ms >= 50


async def test_all_entries_failed(
    server_a: FakeLLMServer, server_b: FakeLLMServer, closed_port_url: str
) -> None:
    server_a.script(Fail(500))
    server_b.script(Fail(429, headers={"Retry-After": "5"}))
    recorder = Recorder()
    router = Router(
        [entry(0, server_a.base_url), entry(1, server_b.base_url), entry(2, closed_port_url)], record=recorder
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
        await collect(Router([entry(0, server_a.base_url)], record=recorder))

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
