"""Tool choice (``ModelSettings.tool_choice``): each adapter's request body for auto, required,
none and a named tool; constrained decoding for text-mode routes (``response_format`` with the
call's JSON Schema) and the call parsed out of the constrained reply; a choice the offered
tools cannot meet is a ``bad_request``; the router passes the choice to the entry that answers.
"""

from __future__ import annotations

import json

import pytest

from llm.errors import ModelCallError
from llm.model import ModelSettings, tool_call_schema, tool_choice_resolve
from llm.providers import anthropic as anthropic_adapter
from llm.providers import openai_compat
from llm.providers.openai_compat import OpenAICompatModel
from llm.router import Router
from llm.testing import FakeLLMServer, Reply, ToolCalls
from llm.testing_anthropic import FakeAnthropicServer
from llm.tests.test_router import USER, entry, text_of
from llm.types import ChatMessage, Completion, ToolSpec

pytestmark = pytest.mark.usefixtures("all_tenants_scope")

SEARCH = ToolSpec(name="knowledge_search", description="Search the documents.", parameters={
    "type": "object", "properties": {"query": {"type": "string"}, "top_k": {"type": "integer"}},
    "required": ["query"],
})
TIME = ToolSpec(name="get_current_time", description="The time in a zone.", parameters={
    "type": "object", "properties": {"timezone": {"type": "string"}}, "required": ["timezone"],
})
TOOLS = [SEARCH, TIME]


# --- settings ---------------------------------------------------------------------------------


def test_a_tool_choice_is_a_mode_or_a_tool_name() -> None:
    for good in ("auto", "required", "none", "knowledge_search", "fetch__fetch"):
        assert ModelSettings(tool_choice=good).tool_choice == good
    for bad in ("", None, 3, "two words", "x" * 65, "a.b"):
        with pytest.raises(ValueError, match="tool_choice"):
            ModelSettings(tool_choice=bad)


def test_resolve_checks_the_choice_against_the_offered_tools() -> None:
    assert tool_choice_resolve("auto", TOOLS) == "auto"
    assert tool_choice_resolve("none", []) == "auto"  # nothing to refuse
    assert tool_choice_resolve("none", TOOLS) == "none"
    assert tool_choice_resolve("required", TOOLS) == "required"
    assert tool_choice_resolve("get_current_time", TOOLS) is TIME
    for choice, tools, reason in [("required", [], "no tool is offered"), ("knowledge_search", [], "no tool is offered"),
                                  ("web_fetch", TOOLS, "'web_fetch', which is not among the offered tools")]:
        with pytest.raises(ModelCallError, match=reason) as raised:
            tool_choice_resolve(choice, tools)
        assert raised.value.error_class == "bad_request"


def test_the_call_schema_is_name_and_the_tools_parameters() -> None:
    assert tool_call_schema(SEARCH) == {
        "type": "object",
        "properties": {"name": {"type": "string", "const": "knowledge_search"}, "arguments": SEARCH.parameters},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }
    bare = ToolSpec(name="ping", description="", parameters={})
    assert tool_call_schema(bare)["properties"]["arguments"] == {"type": "object", "properties": {}}
    # Required arguments only (for a small model's constrained call): the optional ones are left out.
    assert tool_call_schema(SEARCH, required_only=True)["properties"]["arguments"] == {
        "type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"],
        "additionalProperties": False,
    }
    assert SEARCH.parameters["properties"].keys() == {"query", "top_k"}  # not modified


# --- OpenAI-compatible, native tool calls -------------------------------------------------------


def test_native_requests_carry_tool_choice_in_the_openai_form() -> None:
    native = entry(0, "http://x/v1")

    def body(choice: str, tools=TOOLS) -> dict:
        return openai_compat.build_request(native, USER, tools, tool_choice=choice)[0]

    assert "tool_choice" not in body("auto")
    assert body("required")["tool_choice"] == "required"
    assert body("none")["tool_choice"] == "none"
    assert body("knowledge_search")["tool_choice"] == {"type": "function", "function": {"name": "knowledge_search"}}
    assert "tool_choice" not in body("none", tools=[]) and "tools" not in body("none", tools=[])
    assert "response_format" not in body("knowledge_search")  # native servers parse the call themselves
    with pytest.raises(ModelCallError, match="not among the offered tools"):
        body("web_fetch")


# --- OpenAI-compatible, text mode (llama.cpp: constrained decoding) ------------------------------


def test_text_mode_enforces_a_named_or_required_call_with_a_json_schema() -> None:
    text = entry(0, "http://x/v1", tool_calls="text")

    def build(choice: str, tools=TOOLS) -> tuple[dict, list[ChatMessage]]:
        return openai_compat.build_request(text, USER, tools, tool_choice=choice)

    params, sent = build("auto")
    assert "response_format" not in params and "tool_choice" not in params and "tools" not in params
    assert "<tools>" in sent[0].content

    assert "You must call" not in sent[0].content

    params, sent = build("knowledge_search")
    assert params["response_format"] == {"type": "json_object",
                                         "schema": tool_call_schema(SEARCH, required_only=True)}
    assert "tool_choice" not in params and "tools" not in params  # the server would not parse them
    assert "<tools>" in sent[0].content  # the model still reads what the tool does
    assert sent[0].content.endswith("</tool_call>\n\nYou must call knowledge_search now. "
                                    "Use the words of the user's last message as its arguments.")

    params, sent = build("required")
    assert params["response_format"] == {"type": "json_object", "schema": {"anyOf": [
        tool_call_schema(SEARCH, required_only=True), tool_call_schema(TIME, required_only=True)]}}
    assert "You must call one of the functions now." in sent[0].content

    params, sent = build("none")  # no call possible: the tools are not announced
    assert "response_format" not in params
    assert "<tools>" not in sent[0].content and sent[0].content == "You are terse."


async def test_a_forced_text_mode_call_streams_as_a_tool_call(server_a: FakeLLMServer) -> None:
    server_a.script(Reply('{"name": "knowledge_search", "arguments": {"query": "how to start"}}', chunk_size=5))
    model = OpenAICompatModel(entry(0, server_a.base_url, tool_calls="text"))

    events = [e async for e in model.stream(USER, TOOLS, ModelSettings(tool_choice="knowledge_search"))]

    assert text_of(events) == ""  # the call's JSON never reaches the answer text
    completion = events[-1]
    assert isinstance(completion, Completion) and completion.finish_reason == "tool_calls"
    [call] = completion.message.tool_calls
    assert (call.name, json.loads(call.arguments)) == ("knowledge_search", {"query": "how to start"})
    sent = server_a.requests[0]
    assert sent["response_format"]["schema"]["properties"]["name"]["const"] == "knowledge_search"


async def test_with_tool_choice_none_a_text_mode_call_is_dropped(server_a: FakeLLMServer) -> None:
    server_a.script(Reply('Here it is.\n{"name": "get_current_time", "arguments": {"timezone": "UTC"}}'))
    model = OpenAICompatModel(entry(0, server_a.base_url, tool_calls="text"))

    events = [e async for e in model.stream(USER, TOOLS, ModelSettings(tool_choice="none"))]

    assert events[-1].message.tool_calls == () and text_of(events) == "Here it is."


async def test_a_choice_the_tools_cannot_meet_fails_before_any_request(server_a: FakeLLMServer) -> None:
    model = OpenAICompatModel(entry(0, server_a.base_url))
    with pytest.raises(ModelCallError) as raised:
        [e async for e in model.stream(USER, [], ModelSettings(tool_choice="required"))]
    assert raised.value.error_class == "bad_request" and server_a.requests == []


# --- Anthropic -----------------------------------------------------------------------------------


def test_anthropic_requests_carry_tool_choice_in_the_messages_api_form() -> None:
    claude = entry(0, "https://api.anthropic.com", api="anthropic")

    def body(choice: str, tools=TOOLS) -> dict:
        return anthropic_adapter.build_request(claude, USER, tools, tool_choice=choice)

    assert "tool_choice" not in body("auto")
    assert body("required")["tool_choice"] == {"type": "any"}
    assert body("none")["tool_choice"] == {"type": "none"}
    assert body("knowledge_search")["tool_choice"] == {"type": "tool", "name": "knowledge_search"}
    assert "tools" not in body("none", tools=[])
    with pytest.raises(ModelCallError, match="not among the offered tools"):
        body("web_fetch")


async def test_the_anthropic_adapter_sends_the_call_settings_choice() -> None:
    with FakeAnthropicServer() as server:
        server.script(ToolCalls([("get_current_time", {"timezone": "Asia/Tokyo"})]))
        model = anthropic_adapter.AnthropicModel(entry(0, server.base_url, api="anthropic"))
        events = [e async for e in model.stream(USER, TOOLS, ModelSettings(tool_choice="get_current_time"))]
        assert server.requests[0]["tool_choice"] == {"type": "tool", "name": "get_current_time"}
    assert [c.name for c in events[-1].message.tool_calls] == ["get_current_time"]


# --- the router ----------------------------------------------------------------------------------


async def test_the_router_passes_the_choice_to_each_entry_in_its_form(server_a, server_b) -> None:
    from llm.testing import Fail

    server_a.script(Fail(500))
    server_b.script(Reply('{"name": "knowledge_search", "arguments": {"query": "q"}}'))
    router = Router([entry(0, server_a.base_url, max_retries=0), entry(1, server_b.base_url, tool_calls="text")])

    events = [e async for e in router.stream(USER, TOOLS, tool_choice="knowledge_search")]

    assert server_a.requests[0]["tool_choice"] == {"type": "function", "function": {"name": "knowledge_search"}}
    assert server_b.requests[0]["response_format"]["schema"] == tool_call_schema(SEARCH, required_only=True)
    assert [c.name for c in events[-1].message.tool_calls] == ["knowledge_search"]


async def test_the_router_refuses_a_choice_beside_settings_and_a_bad_choice(server_a) -> None:
    router = Router([entry(0, server_a.base_url)])
    with pytest.raises(TypeError):
        await anext(router.stream(USER, TOOLS, ModelSettings(), tool_choice="required"))
    with pytest.raises(ValueError, match="tool_choice"):
        await anext(router.stream(USER, TOOLS, tool_choice="not a name"))
    with pytest.raises(ModelCallError) as raised:  # no fallback: no entry could do better
        await router.complete(USER, TOOLS, ModelSettings(tool_choice="web_fetch"))
    assert raised.value.error_class == "bad_request" and server_a.requests == []
