"""Client-supplied tools and instructions on the OpenAI-compatible API, with the official `openai`
SDK as the client: the model sees the client's tools beside the agent's; a call of one pauses
the run durably (an Approval of kind client_tool, no worker holding it) and the answer ends with
`finish_reason: "tool_calls"`; the client's `tool` messages resume the same run; mismatched or
missing outputs are a 400 naming them; a pause nobody resumes expires like an approval; the
`system` / `developer` messages are added after the agent's own system prompt."""

from __future__ import annotations

import datetime

import openai
import pytest
from django.db import transaction
from django.utils import timezone

from agents.tests.factories import agent_with_route, bind_builtin
from llm.testing import Reply, ToolCalls
from sessions.models import Approval, Run, ToolCall
from sessions.runs import approvals_expire
from tenants.scoping import tenant_scope

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("all_tenants_scope")]

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city now.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}}
CLOCK = {"type": "function", "function": {"name": "get_time", "description": "The local time."}}


def sdk(live_server_url: str, token: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{live_server_url}/api/openai/v1", api_key=token, max_retries=0, timeout=30)


def offered(request: dict) -> list[str]:
    return [t["function"]["name"] for t in request.get("tools", [])]


def test_a_client_tool_call_pauses_the_run_and_the_tool_message_resumes_it(world, fake_llm, celery_worker,
                                                                             live_server_url):
    agent = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], name="Forecaster")
    bind_builtin(agent, "test_echo")
    fake_llm.script(ToolCalls([("get_weather", {"city": "Paris"})], text="Let me look.", usage=(10, 3)),
                    Reply("It is sunny in Paris.", usage=(20, 5)))
    client = sdk(live_server_url, world.member_token)
    messages = [{"role": "user", "content": "Weather in Paris?"}]

    first = client.chat.completions.create(model="forecaster", messages=messages, tools=[WEATHER])

    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == "Let me look."
    (call,) = choice.message.tool_calls
    stored = ToolCall.all_tenants.get(name="get_weather")
    assert call.id == f"call_{stored.pk}" and call.type == "function"
    assert (call.function.name, call.function.arguments) == ("get_weather", '{"city": "Paris"}')
    assert sorted(offered(fake_llm.requests[0])) == ["get_weather", "test_echo"]
    run = Run.all_tenants.get(pk=int(first.id.removeprefix("chatcmpl-")))
    # durable: paused like an approval, no worker holds it
    assert (run.status, run.heartbeat_at) == ("awaiting_approval", None)
    assert Approval.all_tenants.get(tool_call=stored).kind == "client_tool"
    assert run.request_options["client_tools"][0]["name"] == "get_weather"
    # the API client decides it, not a person: the chat app's approvals list leaves it out
    assert world.client().get("/api/v1/approvals/").json() == []

    second = client.chat.completions.create(model="forecaster", tools=[WEATHER], messages=[
        *messages, choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "sunny, 24 °C"},
    ])

    assert second.id == first.id  # the same run went on
    assert second.choices[0].finish_reason == "stop" and second.choices[0].message.content == "It is sunny in Paris."
    assert (second.usage.prompt_tokens, second.usage.completion_tokens) == (30, 8)
    run.refresh_from_db()
    stored.refresh_from_db()
    assert (run.status, run.reply) == ("completed", "It is sunny in Paris.")
    assert (stored.status, stored.result) == ("succeeded", "sunny, 24 °C")
    resumed = fake_llm.requests[1]["messages"]
    assert resumed[-1] == {"role": "tool", "tool_call_id": resumed[-2]["tool_calls"][0]["id"], "content": "sunny, 24 °C"}
    assert Run.all_tenants.count() == 1


def test_streamed_tool_calls_and_a_streamed_resume(world, fake_llm, celery_worker, live_server_url):
    agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], name="Forecaster")
    fake_llm.script(ToolCalls([("get_weather", {"city": "Oslo"}), ("get_time", {})]), Reply("Cold, and late."))
    client = sdk(live_server_url, world.member_token)
    messages = [{"role": "user", "content": "Oslo?"}]

    chunks = list(client.chat.completions.create(model="forecaster", messages=messages, tools=[WEATHER, CLOCK],
                                                 stream=True, stream_options={"include_usage": True}))

    with_calls = [c for c in chunks if c.choices and c.choices[0].delta.tool_calls]
    assert len(with_calls) == 1
    calls = with_calls[0].choices[0].delta.tool_calls
    assert [(c.index, c.function.name, c.function.arguments) for c in calls] == [
        (0, "get_weather", '{"city": "Oslo"}'), (1, "get_time", "{}")]
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["tool_calls"] and chunks[-1].choices == [] and chunks[-1].usage is not None

    assistant = {"role": "assistant", "content": None, "tool_calls": [
        {"id": c.id, "type": "function", "function": {"name": c.function.name, "arguments": c.function.arguments}}
        for c in calls]}
    resumed = list(client.chat.completions.create(model="forecaster", stream=True, messages=[
        *messages, assistant, {"role": "tool", "tool_call_id": calls[1].id, "content": "23:10"},
        {"role": "tool", "tool_call_id": calls[0].id, "content": "-4 °C"},
    ]))

    assert "".join(c.choices[0].delta.content or "" for c in resumed if c.choices) == "Cold, and late."
    assert [c.choices[0].finish_reason for c in resumed if c.choices and c.choices[0].finish_reason] == ["stop"]
    assert all(c.id == chunks[0].id for c in resumed)
    results = dict(ToolCall.all_tenants.values_list("name", "result"))
    assert results == {"get_weather": "-4 °C", "get_time": "23:10"}


@pytest.mark.parametrize("name", ["test_echo", "web_fetch", "time__now"])
def test_a_client_tool_named_like_the_agents_tools_is_a_400(world, live_server_url, name):
    agent = agent_with_route(tenant=world.tenant, base_urls=["http://127.0.0.1:9/v1"], name="Forecaster")
    bind_builtin(agent, "test_echo")
    tool = {"type": "function", "function": {"name": name}}
    with pytest.raises(openai.BadRequestError) as caught:
        sdk(live_server_url, world.member_token).chat.completions.create(
            model="forecaster", messages=[{"role": "user", "content": "hi"}], tools=[WEATHER, tool])
    assert (caught.value.code, caught.value.param) == ("tool_name_conflict", "tools[1].function.name")
    assert name in caught.value.message
    assert not Run.all_tenants.exists()


@pytest.mark.parametrize(("tools", "param"), [
    ([WEATHER, WEATHER], "tools[1].function.name"),
    ([{"type": "function", "function": {"name": "bad name"}}], "tools[0].function.name"),
    ([{"type": "custom", "custom": {"name": "x"}}], "tools[0].type"),
    ([{"type": "function", "function": {"name": "f", "parameters": {"type": 12}}}], "tools[0].function.parameters"),
])
def test_malformed_client_tools_are_a_400_naming_the_field(world, live_server_url, tools, param):
    agent_with_route(tenant=world.tenant, base_urls=["http://127.0.0.1:9/v1"], name="Forecaster")
    with pytest.raises(openai.BadRequestError) as caught:
        sdk(live_server_url, world.member_token).chat.completions.create(
            model="forecaster", messages=[{"role": "user", "content": "hi"}], tools=tools)
    assert caught.value.param == param, caught.value.body


def _paused(client: openai.OpenAI, fake_llm, *calls: tuple[str, dict]) -> tuple[list[dict], list]:
    fake_llm.script(ToolCalls(list(calls)), Reply("done"))
    messages = [{"role": "user", "content": "go"}]
    first = client.chat.completions.create(model="forecaster", messages=messages, tools=[WEATHER, CLOCK])
    assert first.choices[0].finish_reason == "tool_calls"
    return [*messages, first.choices[0].message.model_dump(exclude_none=True)], first.choices[0].message.tool_calls


def test_unknown_or_missing_tool_outputs_are_a_400_naming_them(world, other_world, fake_llm, celery_worker,
                                                                live_server_url):
    agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], name="Forecaster")
    client = sdk(live_server_url, world.member_token)
    messages, calls = _paused(client, fake_llm, ("get_weather", {"city": "Rome"}), ("get_time", {}))

    with pytest.raises(openai.BadRequestError) as caught:  # a call id that is not ours
        client.chat.completions.create(model="forecaster", messages=[
            *messages, {"role": "tool", "tool_call_id": "call_999999", "content": "x"}])
    assert (caught.value.code, caught.value.param) == ("tool_call_not_found", "messages[2].tool_call_id")
    assert "call_999999" in caught.value.message
    with pytest.raises(openai.BadRequestError) as caught:  # only one of the two outputs
        client.chat.completions.create(model="forecaster", messages=[
            *messages, {"role": "tool", "tool_call_id": calls[0].id, "content": "warm"}])
    assert caught.value.code == "tool_output_missing" and calls[1].id in caught.value.message
    agent_with_route(tenant=other_world.tenant, base_urls=[fake_llm.base_url], name="Forecaster")
    with pytest.raises(openai.BadRequestError) as caught:  # another tenant's caller, same slug
        sdk(live_server_url, other_world.member_token).chat.completions.create(model="forecaster", messages=[
            *messages, {"role": "tool", "tool_call_id": calls[0].id, "content": "warm"},
            {"role": "tool", "tool_call_id": calls[1].id, "content": "noon"}])
    assert caught.value.code == "tool_call_not_found"
    run = Run.all_tenants.get()
    assert run.status == "awaiting_approval"  # none of these touched it

    done = client.chat.completions.create(model="forecaster", messages=[
        *messages, {"role": "tool", "tool_call_id": calls[0].id, "content": "warm"},
        {"role": "tool", "tool_call_id": calls[1].id, "content": "noon"}])
    assert done.choices[0].message.content == "done"
    with pytest.raises(openai.ConflictError) as caught:  # answered already: the run waits for nothing
        client.chat.completions.create(model="forecaster", messages=[
            *messages, {"role": "tool", "tool_call_id": calls[0].id, "content": "warm"},
            {"role": "tool", "tool_call_id": calls[1].id, "content": "noon"}])
    assert caught.value.code == "run_not_waiting"


def test_a_pause_nobody_resumes_expires_and_the_chat_goes_on(world, fake_llm, celery_worker, live_server_url):
    agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], name="Forecaster")
    client = sdk(live_server_url, world.member_token)
    messages, calls = _paused(client, fake_llm, ("get_weather", {"city": "Lima"}))
    run = Run.all_tenants.get()
    approval = Approval.all_tenants.get(run=run)
    assert approval.expires_at > timezone.now() + datetime.timedelta(minutes=30)

    with tenant_scope(world.tenant.pk), transaction.atomic():  # what the sweeper does once the time is up
        assert approvals_expire(now=approval.expires_at + datetime.timedelta(seconds=1)) == 1
    run.refresh_from_db()
    assert (run.status, run.reason) == ("failed", "approval_expired")
    with pytest.raises(openai.ConflictError) as caught:
        client.chat.completions.create(model="forecaster", messages=[
            *messages, {"role": "tool", "tool_call_id": calls[0].id, "content": "mild"}])
    assert caught.value.code == "run_not_waiting"

    later = client.chat.completions.create(model="forecaster", messages=[{"role": "user", "content": "hello?"}],
                                           metadata={"chat_id": str(run.session_id)})
    assert later.choices[0].message.content == "done"  # _paused's scripted answer, now to the next message


def test_the_chat_apps_approval_endpoint_cannot_answer_a_client_tool(world, fake_llm, celery_worker, live_server_url):
    agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], name="Forecaster")
    _paused(sdk(live_server_url, world.member_token), fake_llm, ("get_weather", {"city": "Kyiv"}))
    approval = Approval.all_tenants.get()
    answer = world.client().post(f"/api/v1/approvals/{approval.pk}/", {"decision": "approve"}, format="json")
    assert answer.status_code == 409, answer.content
    approval.refresh_from_db()
    assert approval.status == "pending"


def test_system_and_developer_messages_follow_the_agents_own_prompt(world, fake_llm, celery_worker, live_server_url):
    agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], name="Helper",
                     system_prompt="You are the ACME helper.")
    fake_llm.script(Reply("ok"))
    answer = sdk(live_server_url, world.member_token).chat.completions.create(model="helper", messages=[
        {"role": "system", "content": "Answer in French."}, {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "salut"},
        {"role": "developer", "content": [{"type": "text", "text": "Be brief."}]}, {"role": "user", "content": "ça va?"},
    ])
    system = fake_llm.requests[0]["messages"][0]
    assert system["role"] == "system" and system["content"].startswith("You are the ACME helper.")
    assert system["content"].index("Answer in French.") < system["content"].index("Be brief.")
    assert [m["role"] for m in fake_llm.requests[0]["messages"][1:]] == ["user", "assistant", "user"]
    run = Run.all_tenants.get(pk=int(answer.id.removeprefix("chatcmpl-")))
    # nobody watches an API run: an MCP server asking for input gets the unattended answer (decline)
    assert run.request_options == {"instructions": "Answer in French.\n\nBe brief.", "unattended": "decline"}


# --- the Responses API -------------------------------------------------------------------------

RESPONSES_WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city now.",
                     "parameters": WEATHER["function"]["parameters"]}


def test_responses_function_call_items_and_function_call_output_resume_the_run(world, fake_llm, celery_worker,
                                                                               live_server_url):
    import openresponses_types as ort

    agent = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], name="Forecaster")
    bind_builtin(agent, "test_echo")
    fake_llm.script(ToolCalls([("test_echo", {"text": "hi"})]), ToolCalls([("get_weather", {"city": "Bern"})]),
                    Reply("Bern: fog."))
    client = sdk(live_server_url, world.member_token)

    first = client.responses.create(model="forecaster", input="Weather in Bern?", tools=[RESPONSES_WEATHER],
                                    instructions="Answer in one line.")

    assert first.status == "completed" and first.id.startswith("resp_")
    assert [i.type for i in first.output] == ["function_call", "function_call_output", "function_call"]
    call = first.output[-1]
    stored = ToolCall.all_tenants.get(name="get_weather")
    assert (call.call_id, call.name, call.arguments) == (f"call_{stored.pk}", "get_weather", '{"city": "Bern"}')
    assert first.instructions == "Answer in one line." and [t.name for t in first.tools] == ["get_weather"]
    ort.ResponseResource.model_validate(first.model_dump())
    assert "Answer in one line." in fake_llm.requests[0]["messages"][0]["content"]

    second = client.responses.create(model="forecaster", previous_response_id=first.id, tools=[RESPONSES_WEATHER],
                                     input=[{"type": "function_call_output", "call_id": call.call_id,
                                             "output": "fog, 3 °C"}])

    assert second.id == f"{first.id}_1" and second.status == "completed" and second.output_text == "Bern: fog."
    assert [i.type for i in second.output] == ["message"]
    ort.ResponseResource.model_validate(second.model_dump())
    # read back: each segment keeps its own output
    assert client.responses.retrieve(first.id).model_dump()["output"] == first.model_dump()["output"]
    assert client.responses.retrieve(second.id).output_text == "Bern: fog."
    stored.refresh_from_db()
    assert stored.result == "fog, 3 °C" and Run.all_tenants.get().status == "completed"


def test_responses_streamed_function_call_then_a_streamed_resume(world, fake_llm, celery_worker, live_server_url):
    import openresponses_types as ort

    agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], name="Forecaster")
    fake_llm.script(ToolCalls([("get_weather", {"city": "Riga"})], text="Checking."), Reply("Riga: rain."))
    client = sdk(live_server_url, world.member_token)

    events = list(client.responses.create(model="forecaster", input="Riga?", tools=[RESPONSES_WEATHER], stream=True))

    assert events[-1].type == "response.completed"
    done = events[-1].response
    assert [i.type for i in done.output] == ["message", "function_call"]
    added = [e.item.id for e in events if e.type == "response.output_item.added"]
    assert added == [i.id for i in done.output]
    arguments = [e.arguments for e in events if e.type == "response.function_call_arguments.done"]
    assert arguments == ['{"city": "Riga"}']
    ort.ResponseResource.model_validate(done.model_dump())

    resumed = list(client.responses.create(model="forecaster", previous_response_id=done.id, stream=True, input=[
        {"type": "function_call_output", "call_id": done.output[-1].call_id, "output": "rain"}]))

    assert resumed[0].type == "response.created" and resumed[0].response.id == f"{done.id}_1"
    assert resumed[-1].type == "response.completed" and resumed[-1].response.output_text == "Riga: rain."
    assert "".join(e.delta for e in resumed if e.type == "response.output_text.delta") == "Riga: rain."
    assert [e.sequence_number for e in resumed] == list(range(1, len(resumed) + 1))


def test_responses_outputs_for_another_response_are_a_400(world, fake_llm, celery_worker, live_server_url):
    agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], name="Forecaster")
    fake_llm.script(ToolCalls([("get_weather", {"city": "Baku"})]), Reply("A finished answer."))
    client = sdk(live_server_url, world.member_token)
    paused = client.responses.create(model="forecaster", input="Baku?", tools=[RESPONSES_WEATHER])
    finished = client.responses.create(model="forecaster", input="Anything.")
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model="forecaster", previous_response_id=finished.id, input=[
            {"type": "function_call_output", "call_id": paused.output[-1].call_id, "output": "sun"}])
    assert (caught.value.code, caught.value.param) == ("tool_call_not_found", "input[0].call_id")
