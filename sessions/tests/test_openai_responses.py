"""The Responses API at /api/openai/v1/responses with the official `openai` SDK as the client;
every response object and streaming event validated against the Open Responses specification's
models (the `openresponses-types` package). Ported from the Open Responses compliance cases:
basic, streaming, multi-turn (input items), previous_response_id, and tool calling (the agent's
own tools run on the server: function_call / function_call_output items; the client's own tools
and the system prompt (instructions) are in test_openai_client_tools.py, the image-input case in
test_openai_images.py; an image by http(s) URL is refused by name here)."""

from __future__ import annotations

import httpx
import openai
import openresponses_types as ort
import pytest
from pydantic import TypeAdapter

from agents.tests.factories import agent_with_route, bind_builtin
from llm.testing import Fail, Reply, ToolCalls
from sessions.models import Run

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("all_tenants_scope")]

STREAM_EVENTS = {
    "response.created": ort.ResponseCreatedStreamingEvent,
    "response.in_progress": ort.ResponseInProgressStreamingEvent,
    "response.completed": ort.ResponseCompletedStreamingEvent,
    "response.failed": ort.ResponseFailedStreamingEvent,
    "response.incomplete": ort.ResponseIncompleteStreamingEvent,
    "response.output_item.added": ort.ResponseOutputItemAddedStreamingEvent,
    "response.output_item.done": ort.ResponseOutputItemDoneStreamingEvent,
    "response.content_part.added": ort.ResponseContentPartAddedStreamingEvent,
    "response.content_part.done": ort.ResponseContentPartDoneStreamingEvent,
    "response.output_text.delta": ort.ResponseOutputTextDeltaStreamingEvent,
    "response.output_text.done": ort.ResponseOutputTextDoneStreamingEvent,
    "response.function_call_arguments.delta": ort.ResponseFunctionCallArgumentsDeltaStreamingEvent,
    "response.function_call_arguments.done": ort.ResponseFunctionCallArgumentsDoneStreamingEvent,
}


def sdk(live_server_url: str, token: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{live_server_url}/api/openai/v1", api_key=token, max_retries=0, timeout=30)


def valid_response(body: dict) -> ort.ResponseResource:
    return ort.ResponseResource.model_validate(body)


def test_basic_text_response(world, fake_llm, celery_worker, live_server_url):
    agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], name="Helper")
    fake_llm.script(Reply("Hello, world.", usage=(12, 3)))
    response = sdk(live_server_url, world.member_token).responses.create(model="helper", input="Say hello.")
    assert response.status == "completed" and response.output_text == "Hello, world."
    assert (response.usage.input_tokens, response.usage.output_tokens, response.usage.total_tokens) == (12, 3, 15)
    valid_response(response.model_dump())
    stored = sdk(live_server_url, world.member_token).responses.retrieve(response.id)
    assert stored.output_text == "Hello, world." and stored.id == response.id


def test_streaming_events_are_valid_and_in_order(world, fake_llm, celery_worker, live_server_url):
    agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], name="Helper")
    fake_llm.script(Reply("Streaming works fine."))
    url = f"{live_server_url}/api/openai/v1/responses"
    events = []
    with httpx.stream("POST", url, json={"model": "helper", "input": "Stream please.", "stream": True},
                      headers={"Authorization": f"Bearer {world.member_token}"}, timeout=30) as answer:
        assert answer.headers["content-type"].startswith("text/event-stream")
        kind = None
        for line in answer.iter_lines():
            if line.startswith("event: "):
                kind = line[7:]
            elif line.startswith("data: "):
                events.append((kind, httpx.Response(200, content=line[6:]).json()))
    for kind, event in events:
        assert event["type"] == kind
        STREAM_EVENTS[kind].model_validate(event)
    kinds = [k for k, _ in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    created = events[0][1]["response"]  # as it starts: the items come as events, none in the opening
    assert created["status"] in ("queued", "in_progress") and created["output"] == [] and created["usage"] is None
    assert [e["sequence_number"] for _, e in events] == list(range(1, len(events) + 1))
    assert "".join(e["delta"] for k, e in events if k == "response.output_text.delta") == "Streaming works fine."
    assert events[-1][1]["response"]["output"][0]["content"][0]["text"] == "Streaming works fine."

    fake_llm.script(Reply("Once more."))
    streamed = list(sdk(live_server_url, world.member_token).responses.create(  # the SDK reads it too
        model="helper", input="Again.", stream=True))
    assert streamed[-1].type == "response.completed" and streamed[-1].response.output_text == "Once more."


def test_multi_turn_input_items_and_previous_response_id(world, other_world, fake_llm, celery_worker, live_server_url):
    agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], name="Helper")
    client = sdk(live_server_url, world.member_token)
    fake_llm.script(Reply("Your name is Ada."), Reply("Ada has 3 letters."))
    first = client.responses.create(model="helper", input=[
        {"role": "user", "content": "My name is Ada."},
        {"role": "assistant", "content": [{"type": "output_text", "text": "Nice to meet you, Ada."}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "What is my name?"}]},
    ])
    assert first.output_text == "Your name is Ada."
    second = client.responses.create(model="helper", input="How many letters?", previous_response_id=first.id)
    assert second.output_text == "Ada has 3 letters." and second.previous_response_id == first.id
    valid_response(second.model_dump())
    assert [(m["role"], m["content"]) for m in fake_llm.requests[1]["messages"][1:]] == [
        ("user", "My name is Ada."), ("assistant", "Nice to meet you, Ada."), ("user", "What is my name?"),
        ("assistant", "Your name is Ada."), ("user", "How many letters?"),
    ]
    runs = Run.all_tenants.filter(pk__in=[int(r.id.removeprefix("resp_")) for r in (first, second)])
    assert len({r.session_id for r in runs}) == 1
    foreign = sdk(live_server_url, other_world.member_token)
    with pytest.raises(openai.NotFoundError):
        foreign.responses.retrieve(first.id)
    with pytest.raises(openai.NotFoundError):
        foreign.responses.create(model="helper", input="hi", previous_response_id=first.id)


def test_server_side_tool_calls_are_function_call_items(world, fake_llm, celery_worker, live_server_url):
    agent = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], name="Echoer")
    bind_builtin(agent, "test_echo")
    fake_llm.script(ToolCalls([("test_echo", {"text": "ping"})]), Reply("The echo said ping."))
    client = sdk(live_server_url, world.member_token)
    streamed = list(client.responses.create(model="echoer", input="Echo ping.", stream=True))
    kinds = [e.type for e in streamed]
    assert "response.function_call_arguments.done" in kinds
    done = streamed[-1].response
    assert [item.type for item in done.output] == ["function_call", "function_call_output", "message"]
    call, result, message = done.output
    assert call.name == "test_echo" and '"ping"' in call.arguments and result.call_id == call.call_id
    assert "ping" in result.output and message.content[0].text == "The echo said ping."
    valid_response(done.model_dump())
    assert client.responses.retrieve(done.id).model_dump()["output"] == done.model_dump()["output"]
    added = [e.item.id for e in streamed if e.type == "response.output_item.added"]
    assert added == [item.id for item in done.output]


def test_a_failed_run_is_a_failed_response(world, fake_llm, celery_worker, live_server_url):
    agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], name="Helper")
    fake_llm.script(Fail(400))
    response = sdk(live_server_url, world.member_token).responses.create(model="helper", input="hi")
    assert response.status == "failed" and response.error.code == "model_error"
    valid_response(response.model_dump())


@pytest.mark.parametrize(("fields", "param"), [
    ({"instructions": 5}, "instructions"),
    ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"tools": [{"type": "function", "name": "f"}], "tool_choice": "required"}, "tool_choice"),
    ({"temperature": 0.1}, "temperature"),
    ({"store": False}, "store"),
    ({"input": [{"role": "critic", "content": "x"}, {"role": "user", "content": "hi"}]}, "input[0].role"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "https://x/y.png"}]}]},
     "input[0].content[0].image_url"),
    ({"input": [{"type": "function_call_output", "call_id": "c", "output": "x"}]}, "input[0].call_id"),
    ({"input": [{"type": "reasoning", "summary": []}, {"role": "user", "content": "hi"}]}, "input[0]"),
    ({"input": ""}, "input"),
])
def test_unsupported_input_is_a_400_naming_the_field(world, live_server_url, fields, param):
    agent_with_route(tenant=world.tenant, base_urls=["http://127.0.0.1:9/v1"], name="Helper")
    with pytest.raises(openai.BadRequestError) as caught:
        sdk(live_server_url, world.member_token).responses.create(**{"model": "helper", "input": "hi", **fields})
    assert caught.value.param == param, caught.value.body
    assert not Run.all_tenants.exists()


def test_cancel_and_unknown_responses(world, fake_llm, celery_worker, live_server_url):
    agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], name="Helper")
    client = sdk(live_server_url, world.member_token)
    fake_llm.script(Reply("done"))
    finished = client.responses.create(model="helper", input="hi")
    with pytest.raises(openai.ConflictError):
        client.responses.cancel(finished.id)
    for missing in ("resp_999999999", "resp_x", "chatcmpl-1", f"{finished.id}_1", f"{finished.id}_0"):
        with pytest.raises(openai.NotFoundError):
            client.responses.retrieve(missing)
    TypeAdapter(ort.ResponseResource).validate_python(client.responses.retrieve(finished.id).model_dump())


def test_a_run_waiting_for_a_person_is_incomplete_and_cancel_cancels_it(world, other_world, fake_llm, celery_worker,
                                                                       live_server_url):
    """A response whose run pauses for a person's decision ends ``incomplete``
    (``approval_required``), streamed or not; the caller's cancel cancels that run, another
    tenant's is a 404 that changes nothing."""
    agent = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], name="Careful")
    bind_builtin(agent, "test_echo", approval_policy=[{"pattern": "*", "action": "ask"}])
    fake_llm.script(ToolCalls([("test_echo", {"text": "one"})]), ToolCalls([("test_echo", {"text": "two"})]))
    client = sdk(live_server_url, world.member_token)

    response = client.responses.create(model="careful", input="echo one")
    assert (response.status, response.incomplete_details.reason) == ("incomplete", "approval_required")
    valid_response(response.model_dump())
    run = Run.all_tenants.get(pk=int(response.id.removeprefix("resp_")))
    assert (run.status, run.purpose) == ("awaiting_approval", "api")
    streamed = list(client.responses.create(model="careful", input="echo two", stream=True))
    assert streamed[-1].type == "response.incomplete"
    assert streamed[-1].response.incomplete_details.reason == "approval_required"

    with pytest.raises(openai.NotFoundError):
        sdk(live_server_url, other_world.member_token).responses.cancel(response.id)
    run.refresh_from_db()
    assert run.status == "awaiting_approval"
    cancelled = client.responses.cancel(response.id)
    assert cancelled.status == "cancelled"
    valid_response(cancelled.model_dump())
    run.refresh_from_db()
    assert run.status == "cancelled"
    assert client.responses.retrieve(response.id).status == "cancelled"
