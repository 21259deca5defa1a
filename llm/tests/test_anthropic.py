"""Anthropic Messages adapter against a real FakeAnthropicServer (no Django, no DB).

Covers streaming (text, thinking, tool_use reassembly, usage), the translation of a canonical
history made by an OpenAI-compatible model (exact request JSON), every error class, and the
router falling back from an OpenAI-compatible entry to an Anthropic one mid-conversation.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Iterator, Sequence
from contextlib import aclosing
from types import SimpleNamespace
from typing import Any

import anthropic
import httpx2
import pytest

from llm.config import RouteEntryConfig
from llm.errors import ModelCallError, StreamInterrupted
from llm.providers import anthropic as adapter
from llm.records import AttemptRecord
from llm.router import Router
from llm.testing import CutAfter, Fail, FakeLLMServer, Hang, Reply, Stall, ToolCalls
from llm.testing_anthropic import ErrorEvent, FakeAnthropicServer, error_body
from llm.tokens import estimate_completion_tokens, estimate_tokens
from llm.types import ChatMessage, Completion, ReasoningDelta, StreamEvent, TextDelta, ToolCallRequest, ToolSpec

pytestmark = [pytest.mark.timeout(60), pytest.mark.usefixtures("all_tenants_scope")]

USER = [ChatMessage(role="system", content="You are terse."), ChatMessage(role="user", content="What time is it?")]
TIME_TOOL = ToolSpec(
    name="get_current_time",
    description="Current time in an IANA timezone.",
    parameters={"type": "object", "properties": {"timezone": {"type": "string"}}, "required": ["timezone"]},
)

# A history produced by an OpenAI-compatible model: a native id, a text-mode id that Anthropic
# would reject, parallel tool results, and a second system message in the middle.
TEXT_MODE_ID = "functions.get_current_time:1"
HISTORY = [
    ChatMessage(role="system", content="You are terse."),
    ChatMessage(role="user", content="What time is it in Tokyo and Paris?"),
    ChatMessage(
        role="assistant",
        content="Let me check.",
        tool_calls=(
            ToolCallRequest(id="call_abc123", name="get_current_time", arguments='{"timezone": "Asia/Tokyo"}'),
            ToolCallRequest(id=TEXT_MODE_ID, name="get_current_time", arguments='{"timezone": "Europe/Paris"}'),
        ),
    ),
    ChatMessage(role="tool", content="10:00", tool_call_id="call_abc123", name="get_current_time"),
    ChatMessage(role="tool", content="03:00", tool_call_id=TEXT_MODE_ID, name="get_current_time"),
    ChatMessage(role="system", content="Answer in one line."),
    ChatMessage(role="user", content="And in Lima? Use the tool."),
    ChatMessage(
        role="assistant",
        tool_calls=(ToolCallRequest(id="call 7", name="get_current_time", arguments="{timezone: Lima"),),
    ),
    ChatMessage(role="tool", content="error: arguments are not JSON", tool_call_id="call 7", name="get_current_time"),
]


def rewritten(call_id: str) -> str:
    """The documented rewrite rule, spelled out independently of the adapter."""
    stem = "".join(c if c.isascii() and (c.isalnum() or c in "_-") else "_" for c in call_id)
    while "__" in stem:
        stem = stem.replace("__", "_")
    return f"{stem.strip('_')[:40]}_{hashlib.sha256(call_id.encode()).hexdigest()[:10]}"


EXPECTED_HISTORY_MESSAGES: list[dict[str, Any]] = [
    {"role": "user", "content": [{"type": "text", "text": "What time is it in Tokyo and Paris?"}]},
    {
        "role": "assistant",
        "content": [
            {"type": "text", "text": "Let me check."},
            {"type": "tool_use", "id": "call_abc123", "name": "get_current_time", "input": {"timezone": "Asia/Tokyo"}},
            {
                "type": "tool_use",
                "id": rewritten(TEXT_MODE_ID),
                "name": "get_current_time",
                "input": {"timezone": "Europe/Paris"},
            },
        ],
    },
    {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": "call_abc123", "content": "10:00"},
            {"type": "tool_result", "tool_use_id": rewritten(TEXT_MODE_ID), "content": "03:00"},
            {"type": "text", "text": "And in Lima? Use the tool."},
        ],
    },
    {
        "role": "assistant",
        "content": [
            {
                "type": "tool_use",
                "id": rewritten("call 7"),
                "name": "get_current_time",
                "input": {"_raw": "{timezone: Lima"},
            }
        ],
    },
    {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": rewritten("call 7"), "content": "error: arguments are not JSON"}
        ],
    },
]


# --- fixtures and helpers -------------------------------------------------------------------


@pytest.fixture
def claude() -> Iterator[FakeAnthropicServer]:
    with FakeAnthropicServer() as server:
        yield server


@pytest.fixture
def openai_server() -> Iterator[FakeLLMServer]:
    with FakeLLMServer() as server:
        yield server


@pytest.fixture
def closed_port_url(closed_port_root: str) -> str:
    """A base URL nobody listens on (connection refused)."""
    return closed_port_root + ""


def entry(index: int, base_url: str, **overrides: Any) -> RouteEntryConfig:
    values: dict[str, Any] = {
        "index": index,
        "provider_name": "anthropic",
        "base_url": base_url,
        "api_key": f"sk-ant-test-{index}",
        "model": "claude-test",
        "max_input_tokens": 200_000,
        "max_output_tokens": 1024,
        "connect_timeout_seconds": 2.0,
        "read_timeout_seconds": 5.0,
        "api": "anthropic",
    }
    values.update(overrides)
    return RouteEntryConfig(**values)


class FirstToken:
    """``on_first_token`` callback that notes how many events had been seen when it fired."""

    def __init__(self, events: list[StreamEvent]) -> None:
        self.events = events
        self.calls: list[int] = []

    def __call__(self) -> None:
        self.calls.append(len(self.events))


async def run(
    server_entry: RouteEntryConfig,
    messages: Sequence[ChatMessage] = USER,
    tools: Sequence[ToolSpec] = (),
    **kwargs: Any,
) -> tuple[list[StreamEvent], FirstToken]:
    events: list[StreamEvent] = []
    first = FirstToken(events)
    async with aclosing(adapter.stream_chat(server_entry, messages, tools, on_first_token=first, **kwargs)) as stream:
        async for event in stream:
            events.append(event)
    return events, first


async def failure(
    server_entry: RouteEntryConfig, messages: Sequence[ChatMessage] = USER
) -> tuple[ModelCallError, list[StreamEvent], FirstToken]:
    events: list[StreamEvent] = []
    first = FirstToken(events)
    with pytest.raises(ModelCallError) as info:
        async with aclosing(adapter.stream_chat(server_entry, messages, (), on_first_token=first)) as stream:
            async for event in stream:
                events.append(event)
    return info.value, events, first


def text_of(events: Sequence[StreamEvent]) -> str:
    return "".join(e.text for e in events if isinstance(e, TextDelta))


# --- streaming -----------------------------------------------------------------------------


async def test_text_streams_in_several_deltas(claude: FakeAnthropicServer) -> None:
    claude.script(Reply("It is ten past ten in Tokyo.", chunk_size=5, usage=(42, 9)))

    events, first = await run(entry(0, claude.base_url))

    deltas = [e for e in events if isinstance(e, TextDelta)]
    assert [d.text for d in deltas] == ["It is", " ten ", "past ", "ten i", "n Tok", "yo."]
    assert first.calls == [0]  # once, before the first delta was yielded
    completion = events[-1]
    assert isinstance(completion, Completion)
    assert completion.message == ChatMessage(role="assistant", content="It is ten past ten in Tokyo.")
    assert completion.finish_reason == "stop"
    assert completion.usage.prompt_tokens == 42
    assert completion.usage.completion_tokens == 9
    assert completion.usage.estimated is False
    assert (completion.entry_index, completion.model) == (0, "claude-test")
    assert claude.requests == [
        {
            "max_tokens": 1024,
            "messages": [{"role": "user", "content": [{"type": "text", "text": "What time is it?"}]}],
            "model": "claude-test",
            "stream": True,
            "system": "You are terse.",
        }
    ]


async def test_tool_use_blocks_are_reassembled(claude: FakeAnthropicServer) -> None:
    claude.script(
        ToolCalls(
            [("get_current_time", {"timezone": "Asia/Tokyo"}), ("get_current_time", {"timezone": "Europe/Paris"})],
            text="Checking.",
            chunk_size=3,
        )
    )

    events, first = await run(entry(0, claude.base_url), tools=[TIME_TOOL])

    assert first.calls == [0]
    assert text_of(events) == "Checking."
    completion = events[-1]
    assert isinstance(completion, Completion)
    assert completion.finish_reason == "tool_calls"
    calls = completion.message.tool_calls
    assert [c.name for c in calls] == ["get_current_time", "get_current_time"]
    assert [c.parsed_arguments() for c in calls] == [{"timezone": "Asia/Tokyo"}, {"timezone": "Europe/Paris"}]
    assert all(c.id.startswith("toolu_fake") for c in calls) and calls[0].id != calls[1].id
    assert claude.requests[0]["tools"] == [
        {
            "name": "get_current_time",
            "description": "Current time in an IANA timezone.",
            "input_schema": {
                "type": "object",
                "properties": {"timezone": {"type": "string"}},
                "required": ["timezone"],
            },
        }
    ]


async def test_tool_use_alone_counts_as_first_token(claude: FakeAnthropicServer) -> None:
    claude.script(ToolCalls([("get_current_time", {})]))

    events, first = await run(entry(0, claude.base_url), tools=[TIME_TOOL])

    assert first.calls == [0]
    assert [type(e) for e in events] == [Completion]
    completion = events[0]
    assert isinstance(completion, Completion)
    assert completion.message.tool_calls[0].arguments == "{}"


async def test_thinking_becomes_reasoning_deltas_not_answer_text(claude: FakeAnthropicServer) -> None:
    claude.script(Reply("Ten past ten.", reasoning="Tokyo is UTC+9, so...", chunk_size=6))

    events, first = await run(entry(0, claude.base_url))

    reasoning = [e for e in events if isinstance(e, ReasoningDelta)]
    assert "".join(r.text for r in reasoning) == "Tokyo is UTC+9, so..."
    assert len(reasoning) == 4
    assert events.index(reasoning[0]) == 0 and first.calls == [0]
    completion = events[-1]
    assert isinstance(completion, Completion)
    assert completion.message.content == "Ten past ten."
    assert text_of(events) == "Ten past ten."


async def test_usage_is_estimated_when_the_provider_reports_none(claude: FakeAnthropicServer) -> None:
    claude.script(Reply("Ten past ten.", reasoning="Hmm.", include_usage=False))

    events, _ = await run(entry(0, claude.base_url), tools=[TIME_TOOL])

    completion = events[-1]
    assert isinstance(completion, Completion)
    assert completion.usage.estimated is True
    assert completion.usage.prompt_tokens == estimate_tokens(USER, [TIME_TOOL])
    assert completion.usage.completion_tokens == estimate_completion_tokens(completion.message, reasoning="Hmm.")


@pytest.mark.parametrize(
    ("scripted", "expected"),
    [("stop", "stop"), ("length", "length"), ("refusal", "content_filter"), ("stop_sequence", "stop"),
     ("model_context_window_exceeded", "length"), ("pause_turn", "pause_turn")],
)
async def test_stop_reason_maps_to_finish_reason(claude: FakeAnthropicServer, scripted: str, expected: str) -> None:
    claude.script(Reply("Partial", finish_reason=scripted))

    events, _ = await run(entry(0, claude.base_url))

    completion = events[-1]
    assert isinstance(completion, Completion)
    assert completion.finish_reason == expected


@pytest.mark.parametrize(
    ("entry_cap", "caller_cap", "sent"),
    [(1024, None, 1024), (1024, 100, 100), (0, 300, 300), (0, None, adapter.DEFAULT_MAX_OUTPUT_TOKENS)],
)
async def test_max_tokens_is_always_sent(
    claude: FakeAnthropicServer, entry_cap: int, caller_cap: int | None, sent: int
) -> None:
    claude.script(Reply("ok"))

    await run(entry(0, claude.base_url, max_output_tokens=entry_cap), max_output_tokens=caller_cap)

    assert claude.requests[0]["max_tokens"] == sent


async def test_base_url_with_v1_suffix_still_reaches_v1_messages(claude: FakeAnthropicServer) -> None:
    claude.script(Reply("ok"))

    events, _ = await run(entry(0, claude.base_url + "/v1/"))

    assert text_of(events) == "ok"
    assert adapter.api_root_url("https://api.anthropic.com/v1/") == "https://api.anthropic.com"
    assert adapter.api_root_url("https://gateway.example/anthropic") == "https://gateway.example/anthropic"


async def test_closing_the_stream_early_closes_the_http_response(claude: FakeAnthropicServer) -> None:
    claude.script(Reply("x" * 400, chunk_size=1, chunk_interval_seconds=0.01))

    async with aclosing(adapter.stream_chat(entry(0, claude.base_url), USER, ())) as stream:
        first = await anext(stream)
        assert first == TextDelta("x")

    assert await claude.await_disconnects(1)


# --- translation of a cross-provider history ------------------------------------------------


async def test_openai_history_is_translated_exactly(claude: FakeAnthropicServer) -> None:
    claude.script(Reply("Tokyo 10:00, Paris 03:00."))

    await run(entry(0, claude.base_url), HISTORY, [TIME_TOOL])

    assert claude.requests == [
        {
            "max_tokens": 1024,
            "messages": EXPECTED_HISTORY_MESSAGES,
            "model": "claude-test",
            "stream": True,
            "system": "You are terse.\n\nAnswer in one line.",
            "tools": [
                {
                    "name": "get_current_time",
                    "description": "Current time in an IANA timezone.",
                    "input_schema": TIME_TOOL.parameters,
                }
            ],
        }
    ]


async def test_history_with_tool_calls_but_no_tools_declares_stubs(claude: FakeAnthropicServer) -> None:
    claude.script(Reply("Done."))

    await run(entry(0, claude.base_url), HISTORY, ())

    body = claude.requests[0]
    assert body["tools"] == [
        {
            "name": "get_current_time",
            "description": "Used earlier in this conversation; not available now.",
            "input_schema": {"type": "object"},
        }
    ]
    assert body["tool_choice"] == {"type": "none"}


def test_translation_merges_roles_and_drops_empty_text() -> None:
    system, messages = adapter.translate_messages(
        [
            ChatMessage(role="user", content="one"),
            ChatMessage(role="user", content=""),
            ChatMessage(role="user", content="two"),
            ChatMessage(role="assistant", content=""),
            ChatMessage(role="assistant", content="three"),
            ChatMessage(role="assistant", content="four"),
        ]
    )

    assert system == ""
    assert messages == [
        {"role": "user", "content": [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "three"}, {"type": "text", "text": "four"}]},
    ]


def test_tool_use_ids_are_kept_or_rewritten_deterministically() -> None:
    assert adapter.tool_use_id_for("call_abc123") == "call_abc123"
    assert adapter.tool_use_id_for("toolu_01A-b") == "toolu_01A-b"
    rewritten_id = adapter.tool_use_id_for(TEXT_MODE_ID)
    assert rewritten_id == f"functions_get_current_time_1_{hashlib.sha256(TEXT_MODE_ID.encode()).hexdigest()[:10]}"
    assert rewritten_id == adapter.tool_use_id_for(TEXT_MODE_ID)
    assert adapter.tool_use_id_for("a.b") != adapter.tool_use_id_for("a:b")
    assert adapter.tool_use_id_for("").startswith("call_")
    for odd in ("", "a b", "é", "x" * 200 + "!"):
        assert all(c.isascii() and (c.isalnum() or c in "_-") for c in adapter.tool_use_id_for(odd))


# --- errors ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("step", "error_class", "status", "retry_after"),
    [
        (Fail(429, headers={"retry-after": "7"}), "rate_limit", 429, 7.0),
        (Fail(529, body=error_body("overloaded_error", "Overloaded")), "overloaded", 529, None),
        (Fail(500), "server", 500, None),
        (Fail(503, body=error_body("api_error", "Internal server error")), "server", 503, None),
        (Fail(504), "timeout", 504, None),
        (Fail(401), "auth", 401, None),
        (Fail(403, body=error_body("permission_error", "Not allowed to use this model")), "auth", 403, None),
        (Fail(404, body=error_body("not_found_error", "model: claude-nope")), "not_found", 404, None),
        (
            Fail(400, body=error_body("invalid_request_error", "prompt is too long: 212034 tokens > 200000 maximum")),
            "context_window",
            400,
            None,
        ),
        (Fail(413), "context_window", 413, None),
        (
            Fail(400, body=error_body("invalid_request_error", "messages.0.content.0.text: field required")),
            "bad_request",
            400,
            None,
        ),
        (
            Fail(
                400,
                body=error_body(
                    "invalid_request_error",
                    "Your credit balance is too low to access the Anthropic API. Please go to Plans & Billing.",
                ),
            ),
            "quota_exhausted",
            400,
            None,
        ),
        (Fail(402), "quota_exhausted", 402, None),
        (
            Fail(
                429,
                body={
                    "type": "error",
                    "error": {
                        "type": "rate_limit_error",
                        "message": "Monthly spend cap reached.",
                        "details": {"error_code": "enforced_spend_limit_reached"},
                    },
                },
            ),
            "quota_exhausted",
            429,
            None,
        ),
        (
            Fail(400, body=error_body("invalid_request_error", "Output blocked by content filtering policy")),
            "content_policy",
            400,
            None,
        ),
    ],
)
async def test_http_errors_are_classified(
    claude: FakeAnthropicServer, step: Fail, error_class: str, status: int, retry_after: float | None
) -> None:
    claude.script(step)

    err, events, first = await failure(entry(0, claude.base_url))

    assert (err.error_class, err.status_code, err.retry_after_seconds) == (error_class, status, retry_after)
    assert events == [] and first.calls == []
    if step.body is not None:
        assert err.message == step.body["error"]["message"]
    assert "sk-ant-test" not in str(err)


@pytest.mark.parametrize(
    ("error_type", "error_class"),
    [
        ("overloaded_error", "overloaded"),
        ("api_error", "server"),
        ("rate_limit_error", "rate_limit"),
        ("invalid_request_error", "bad_request"),
    ],
)
async def test_error_event_before_the_first_token(
    claude: FakeAnthropicServer, error_type: str, error_class: str
) -> None:
    claude.script(ErrorEvent(error_type, "Something happened"))

    err, events, first = await failure(entry(0, claude.base_url))

    assert err.error_class == error_class
    assert err.status_code is None  # inside an HTTP 200 stream
    assert "Something happened" in err.message
    assert events == [] and first.calls == []


async def test_error_event_after_the_first_token(claude: FakeAnthropicServer) -> None:
    # content_block_start, then two text deltas, then {"type": "error", ...overloaded_error}.
    claude.script(ErrorEvent(after=Reply("Hello world", chunk_size=3), n_events=3))

    err, events, first = await failure(entry(0, claude.base_url))

    assert err.error_class == "overloaded"
    assert text_of(events) == "Hello "
    assert first.calls == [0]


async def test_no_response_within_the_read_timeout(claude: FakeAnthropicServer) -> None:
    claude.script(Hang())

    err, events, first = await failure(entry(0, claude.base_url, read_timeout_seconds=0.3))

    assert err.error_class == "timeout"
    assert events == [] and first.calls == []


async def test_stall_between_events_times_out(claude: FakeAnthropicServer) -> None:
    claude.script(Stall(Reply("Hello world", chunk_size=3), n_chunks=2))

    err, events, first = await failure(entry(0, claude.base_url, read_timeout_seconds=0.3))

    assert err.error_class == "timeout"
    assert text_of(events) == "Hel"
    assert first.calls == [0]


async def test_connection_refused_is_a_network_error(closed_port_url: str) -> None:
    err, events, _ = await failure(entry(0, closed_port_url))

    assert err.error_class == "network"
    assert events == []


async def test_connection_dropped_mid_stream_is_a_network_error(claude: FakeAnthropicServer) -> None:
    claude.script(CutAfter("Hello world", n_chunks=2, chunk_size=3))

    err, events, first = await failure(entry(0, claude.base_url))

    assert err.error_class == "network"
    assert text_of(events) == "Hello "
    assert first.calls == [0]


async def test_stream_ending_without_message_stop_is_a_network_error() -> None:
    """A proxy that closes the stream cleanly but early (no ``message_stop``)."""
    start = {"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant",
                                                   "model": "m", "content": [], "usage": {"input_tokens": 3}}}
    frames = [f"event: message_start\ndata: {json.dumps(start)}\n\n".encode()]

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length_line = next(line for line in head.split(b"\r\n") if line.lower().startswith(b"content-length"))
        length = int(length_line.split(b":")[1])
        await reader.readexactly(length)
        body = b"".join(frames)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                     + f"content-length: {len(body)}\r\nconnection: close\r\n\r\n".encode() + body)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        port = server.sockets[0].getsockname()[1]
        err, events, _ = await failure(entry(0, f"http://127.0.0.1:{port}"))
    finally:
        server.close()
        await server.wait_closed()

    assert err.error_class == "network"
    assert "message_stop" in err.message
    assert events == []


def test_usage_counts_cache_tokens_as_prompt_tokens() -> None:
    state = adapter._UsageState()
    state.update(SimpleNamespace(input_tokens=10, cache_creation_input_tokens=100, cache_read_input_tokens=1000,
                                 output_tokens=1))
    state.update(SimpleNamespace(output_tokens=25))  # message_delta: cumulative output only

    usage = state.result(USER, (), ChatMessage(role="assistant", content="x"), "")

    assert (usage.prompt_tokens, usage.completion_tokens, usage.estimated) == (1110, 25, False)


def test_classify_passes_through_and_covers_transport_errors() -> None:
    existing = ModelCallError("rate_limit", "slow down")
    request = httpx2.Request("POST", "http://127.0.0.1/v1/messages")

    assert adapter.classify_anthropic_error(existing) is existing
    assert adapter.classify_anthropic_error(TimeoutError()).error_class == "timeout"
    assert adapter.classify_anthropic_error(httpx2.ReadTimeout("slow", request=request)).error_class == "timeout"
    assert adapter.classify_anthropic_error(httpx2.RemoteProtocolError("peer closed")).error_class == "network"
    assert adapter.classify_anthropic_error(anthropic.APITimeoutError(request)).error_class == "timeout"
    assert adapter.classify_anthropic_error(anthropic.APIConnectionError(request=request)).error_class == "network"
    assert adapter.classify_anthropic_error(ValueError("bad json")).error_class == "other"


def status_error(status: int, body: object) -> anthropic.APIStatusError:
    request = httpx2.Request("POST", "http://127.0.0.1/v1/messages")
    text = body if isinstance(body, str) else json.dumps(body)
    response = httpx2.Response(status, request=request, text=text, headers={"retry-after": "3"})
    return anthropic.APIStatusError(f"Error code: {status}", response=response, body=body)


@pytest.mark.parametrize(
    ("status", "body", "error_class", "status_code", "retry_after"),
    [
        # A gateway's HTML page: its wording is not trusted, the status decides.
        (502, "<html>Bad gateway. Billing | Status | Docs</html>", "server", 502, 3.0),
        (404, "<html>Not found. Billing</html>", "not_found", 404, None),
        # An error event inside a 200 stream: body only, no status, no retry-after.
        (200, error_body("invalid_request_error", "prompt is too long: 250000 tokens"), "context_window", None, None),
        (200, error_body("overloaded_error", "Overloaded"), "overloaded", None, None),
        (200, {"unexpected": True}, "other", None, None),
        (529, error_body("overloaded_error", "Overloaded"), "overloaded", 529, 3.0),
        (429, error_body("rate_limit_error", "Number of request tokens has exceeded your per-minute rate limit"),
         "rate_limit", 429, 3.0),
    ],
)
def test_classify_status_errors(
    status: int, body: object, error_class: str, status_code: int | None, retry_after: float | None
) -> None:
    err = adapter.classify_anthropic_error(status_error(status, body))

    assert (err.error_class, err.status_code, err.retry_after_seconds) == (error_class, status_code, retry_after)


# --- FakeAnthropicServer --------------------------------------------------------------------


async def test_fake_server_answers_the_sdk_without_streaming(claude: FakeAnthropicServer) -> None:
    claude.script(
        Reply("Hi!", reasoning="Greet.", usage=(5, 3)), ToolCalls([("get_current_time", {"timezone": "UTC"})])
    )
    client = anthropic.AsyncAnthropic(api_key="k", base_url=claude.base_url, max_retries=0)
    try:
        reply = await client.messages.create(
            model="claude-test", max_tokens=10, messages=[{"role": "user", "content": "hi"}]
        )
        calls = await client.messages.create(
            model="claude-test", max_tokens=10, messages=[{"role": "user", "content": "time?"}]
        )
        models = await client.models.list()
    finally:
        await client.close()

    assert [b.type for b in reply.content] == ["thinking", "text"]
    assert reply.content[1].text == "Hi!"
    assert reply.stop_reason == "end_turn"
    assert (reply.usage.input_tokens, reply.usage.output_tokens) == (5, 3)
    assert calls.stop_reason == "tool_use"
    assert calls.content[0].input == {"timezone": "UTC"}
    assert [m.id for m in models.data] == ["fake-claude"]


async def test_fake_server_without_steps_fails_loudly(claude: FakeAnthropicServer) -> None:
    err, _, _ = await failure(entry(0, claude.base_url))

    assert (err.error_class, err.status_code) == ("server", 500)
    assert "no scripted step left" in err.message
    with pytest.raises(TypeError):
        claude.script("not a step")  # type: ignore[arg-type]


# --- router: fallback across providers mid-conversation ------------------------------------


async def test_router_falls_back_from_openai_to_anthropic_with_tool_history(
    openai_server: FakeLLMServer, claude: FakeAnthropicServer
) -> None:
    history = [
        ChatMessage(role="system", content="You are terse."),
        ChatMessage(role="user", content="What time is it in Tokyo?"),
        ChatMessage(
            role="assistant",
            tool_calls=(
                ToolCallRequest(id="call_abc123", name="get_current_time", arguments='{"timezone": "Asia/Tokyo"}'),
            ),
        ),
        ChatMessage(role="tool", content="10:00", tool_call_id="call_abc123", name="get_current_time"),
    ]
    openai_server.script(Fail(500))
    claude.script(Reply("It is 10:00 in Tokyo.", chunk_size=6, usage=(120, 8)))
    records: list[AttemptRecord] = []

    async def record(attempt: AttemptRecord) -> None:
        records.append(attempt)

    router = Router(
        [
            RouteEntryConfig(
                index=0,
                provider_name="openai",
                base_url=openai_server.base_url,
                api_key="sk-openai",
                model="gpt-test",
                max_input_tokens=128_000,
                max_output_tokens=1024,
                connect_timeout_seconds=2.0,
                read_timeout_seconds=5.0,
                max_retries=0,
            ),
            entry(1, claude.base_url),
        ],
        record=record,
    )

    events = [event async for event in router.stream(history, [TIME_TOOL])]

    assert text_of(events) == "It is 10:00 in Tokyo."
    completion = events[-1]
    assert isinstance(completion, Completion)
    assert (completion.entry_index, completion.model) == (1, "claude-test")
    assert completion.usage.prompt_tokens == 120
    assert [(r.entry_index, r.status, r.error_class) for r in records] == [
        (0, "failed", "server"),
        (1, "succeeded", None),
    ]
    assert len(openai_server.requests) == 1
    assert claude.requests == [
        {
            "max_tokens": 1024,
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "What time is it in Tokyo?"}]},
                {
                    "role": "assistant",
                    "content": [
                        {
                            "type": "tool_use",
                            "id": "call_abc123",
                            "name": "get_current_time",
                            "input": {"timezone": "Asia/Tokyo"},
                        }
                    ],
                },
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": "call_abc123", "content": "10:00"}],
                },
            ],
            "model": "claude-test",
            "stream": True,
            "system": "You are terse.",
            "tools": [
                {
                    "name": "get_current_time",
                    "description": "Current time in an IANA timezone.",
                    "input_schema": TIME_TOOL.parameters,
                }
            ],
        }
    ]


async def test_router_does_not_fall_back_after_an_anthropic_token(claude: FakeAnthropicServer) -> None:
    claude.script(ErrorEvent(after=Reply("Hello world", chunk_size=3), n_events=2))
    router = Router([entry(0, claude.base_url, max_retries=0), entry(1, claude.base_url, max_retries=0)])

    with pytest.raises(StreamInterrupted) as info:
        [event async for event in router.stream(USER, [])]

    assert info.value.error_class == "overloaded"
    assert len(claude.requests) == 1


def test_request_json_round_trips() -> None:
    """The request is plain JSON (what the SDK sends verbatim)."""
    params = adapter.build_request(entry(0, "http://127.0.0.1:1"), HISTORY, [TIME_TOOL])
    assert json.loads(json.dumps(params))["messages"] == EXPECTED_HISTORY_MESSAGES


# --- model call records (issue 40): the bodies a router with capture_bodies keeps -----------


async def test_a_capturing_router_keeps_the_request_as_sent_and_the_answer_assembled(claude: FakeAnthropicServer) -> None:
    claude.script(ToolCalls([("get_current_time", {"timezone": "Asia/Tokyo"})], text="Checking.", chunk_size=3))
    kept: list[AttemptRecord] = []

    async def record(attempt: AttemptRecord) -> None:
        kept.append(attempt)

    router = Router([entry(0, claude.base_url, api_key="sk-ant-SECRET-0123456789")], record=record, capture_bodies=True)
    async with aclosing(router.stream(USER, [TIME_TOOL])) as stream:
        events = [event async for event in stream]
    assert isinstance(events[-1], Completion)
    [attempt] = kept
    request, response = attempt.bodies.texts()
    assert json.loads(request) == claude.requests[0]  # what the provider received
    answer = json.loads(response)
    assert answer["type"] == "message" and answer["stop_reason"] == "tool_use"
    assert [b["type"] for b in answer["content"]] == ["text", "tool_use"]
    assert answer["content"][1]["input"] == {"timezone": "Asia/Tokyo"} and answer["usage"]["output_tokens"] > 0
    assert "sk-ant-SECRET" not in request + response
    # Without capture_bodies the record carries nothing.
    claude.script(Reply("Ten past ten."))
    kept.clear()
    plain = Router([entry(0, claude.base_url)], record=record)
    async with aclosing(plain.stream(USER, [])) as stream:
        _ = [event async for event in stream]
    assert kept[0].bodies is None
