"""The OpenAI-compatible API (/api/openai/v1), with the official `openai` SDK as the client:
models, chat completions streamed and not, the usage chunk, server-side tool activity as
reasoning, continuing a chat, every error in OpenAI's shape, and the tenant boundary."""

from __future__ import annotations

import threading

import httpx
import openai
import pytest

from agents.tests.factories import AgentFactory, agent_with_route, bind_builtin
from llm.testing import Delay, Fail, Reply, ToolCalls
from sessions.models import ChatSession, Message, Run

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("all_tenants_scope")]


def sdk(live_server_url: str, token: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{live_server_url}/api/openai/v1", api_key=token, max_retries=0, timeout=30)


def test_models_are_the_tenants_active_agents(world, other_world, live_server_url):
    agent_with_route(tenant=world.tenant, base_urls=["http://127.0.0.1:9/v1"], name="Docs assistant")
    agent_with_route(tenant=world.tenant, base_urls=["http://127.0.0.1:9/v1"], name="Retired", is_active=False)
    theirs = AgentFactory(tenant=other_world.tenant, name="Globex helper")
    client = sdk(live_server_url, world.member_token)

    assert [m.id for m in client.models.list()] == ["docs-assistant", "docs-assistant@1"]  # and its version
    assert client.models.retrieve("docs-assistant").owned_by == "acme"
    for hidden in (theirs.slug, "retired", "nope"):
        with pytest.raises(openai.NotFoundError) as caught:
            client.models.retrieve(hidden)
        assert caught.value.code == "model_not_found"
    with pytest.raises(openai.AuthenticationError):
        sdk(live_server_url, "not-a-token").models.list()


def test_a_chat_completion_is_a_run_over_the_given_conversation(world, fake_llm, celery_worker, live_server_url):
    agent = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], name="Helper")
    fake_llm.script(Reply("Paris, still.", usage=(30, 4)))
    answer = sdk(live_server_url, world.member_token).chat.completions.create(
        model="helper",
        messages=[{"role": "user", "content": "Capital of France?"}, {"role": "assistant", "content": "Paris."},
                  {"role": "user", "content": [{"type": "text", "text": "And now?"}]}],
    )
    assert answer.choices[0].message.content == "Paris, still."
    assert answer.choices[0].finish_reason == "stop" and answer.object == "chat.completion"
    assert (answer.usage.prompt_tokens, answer.usage.completion_tokens, answer.usage.total_tokens) == (30, 4, 34)
    sent = fake_llm.requests[0]["messages"]
    assert [(m["role"], m["content"]) for m in sent[1:]] == [
        ("user", "Capital of France?"), ("assistant", "Paris."), ("user", "And now?"),
    ]
    run = Run.all_tenants.get(pk=int(answer.id.removeprefix("chatcmpl-")))
    assert (run.status, run.input, run.reply, run.user_id) == ("completed", "And now?", "Paris, still.", world.member.pk)
    assert run.purpose == "api"
    session = ChatSession.all_tenants.get(pk=run.session_id)
    assert (session.agent_id, session.title) == (agent.pk, "Capital of France?")
    assert list(Message.all_tenants.filter(session=session).values_list("position", "role")) == [
        (0, "user"), (1, "assistant"), (2, "user"), (3, "assistant"),
    ]


def test_streamed_with_tool_activity_as_reasoning_and_usage_last(world, fake_llm, celery_worker, live_server_url):
    agent = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], name="Echoer")
    bind_builtin(agent, "test_echo")
    fake_llm.script(ToolCalls([("test_echo", {"text": "hello"})], usage=(10, 2)), Reply("It said hello.", usage=(20, 5)))
    stream = sdk(live_server_url, world.member_token).chat.completions.create(
        model="echoer", messages=[{"role": "user", "content": "say hello"}], stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    reasoning = "".join(getattr(c.choices[0].delta, "reasoning_content", None) or "" for c in chunks if c.choices)
    assert content == "It said hello."
    assert "Calling `test_echo`" in reasoning and "`test_echo` answered" in reasoning
    finishes = [i for i, c in enumerate(chunks) if c.choices and c.choices[0].finish_reason]
    assert finishes == [len(chunks) - 2] and chunks[finishes[0]].choices[0].finish_reason == "stop"
    last = chunks[-1]
    assert last.choices == [] and (last.usage.prompt_tokens, last.usage.completion_tokens) == (30, 7)
    assert all(c.id == chunks[0].id for c in chunks)


def test_metadata_chat_id_continues_a_chat_and_a_busy_chat_is_a_conflict(world, other_world, fake_llm, celery_worker,
                                                                          live_server_url):
    agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], name="Helper")
    client = sdk(live_server_url, world.member_token)
    fake_llm.script(Reply("first answer"), Delay(1.5, Reply("second answer")), Reply("third answer"))
    first = client.chat.completions.create(model="helper", messages=[{"role": "user", "content": "one"}])
    chat_id = first.model_extra["chat_id"]

    chunks: list = []
    slow = threading.Thread(target=lambda: chunks.extend(client.chat.completions.create(
        model="helper", messages=[{"role": "user", "content": "two"}], metadata={"chat_id": str(chat_id)},
        stream=True)))
    slow.start()
    assert fake_llm.wait_for_requests(2, timeout_seconds=10)
    with pytest.raises(openai.ConflictError) as caught:
        client.chat.completions.create(model="helper", messages=[{"role": "user", "content": "three"}],
                                       extra_headers={"X-Chat-Id": str(chat_id)})
    assert caught.value.code == "chat_busy"
    slow.join(timeout=20)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "second answer"

    third = client.chat.completions.create(model="helper", messages=[{"role": "user", "content": "three"}],
                                           metadata={"chat_id": str(chat_id)})
    assert third.choices[0].message.content == "third answer"
    assert [(m["role"], m["content"]) for m in fake_llm.requests[2]["messages"][1:]] == [
        ("user", "one"), ("assistant", "first answer"), ("user", "two"), ("assistant", "second answer"),
        ("user", "three"),
    ]
    foreign = sdk(live_server_url, other_world.member_token)
    AgentFactory(tenant=other_world.tenant, name="Helper")  # the same slug in the other tenant
    with pytest.raises(openai.NotFoundError) as caught:
        foreign.chat.completions.create(model="helper", messages=[{"role": "user", "content": "peek"}],
                                        metadata={"chat_id": str(chat_id)})
    assert caught.value.code == "chat_not_found"


@pytest.mark.parametrize(("fields", "param"), [
    ({"temperature": 0.2}, "temperature"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}], "tool_choice": "required"},
     "tool_choice"),
    ({"tools": [{"type": "function", "function": {"name": "f", "strict": True}}], "parallel_tool_calls": False},
     "parallel_tool_calls"),
    ({"n": 2}, "n"),
    ({"logprobs": True}, "logprobs"),
    ({"response_format": {"type": "grammar", "grammar": "x"}}, "response_format.type"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": 5}}}},
     "response_format.json_schema.schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "object"}}}},
     "response_format.json_schema.name"),
    ({"messages": [{"role": "critic", "content": "be brief"}, {"role": "user", "content": "hi"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": "hi"}, {"role": "system", "content": "be brief"}]}, "messages[1].role"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://x/y.png"}}]}]},
     "messages[0].content[0].image_url.url"),
    ({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}, "messages[1].role"),
    ({"messages": []}, "messages"),
    ({"stream_options": {"include_usage": True}}, "stream_options"),
    ({"metadata": {"chat_id": "abc"}}, "metadata.chat_id"),
])
def test_unsupported_or_bad_input_is_a_400_naming_the_field(world, live_server_url, fields, param):
    agent_with_route(tenant=world.tenant, base_urls=["http://127.0.0.1:9/v1"], name="Helper")
    request = {"model": "helper", "messages": [{"role": "user", "content": "hi"}], **fields}
    with pytest.raises(openai.BadRequestError) as caught:
        sdk(live_server_url, world.member_token).chat.completions.create(**request)
    assert caught.value.param == param, caught.value.body
    assert not Run.all_tenants.exists()


def test_errors_keep_openais_shape(world, other_world, live_server_url):
    agent_with_route(tenant=world.tenant, base_urls=["http://127.0.0.1:9/v1"], name="Helper")
    url = f"{live_server_url}/api/openai/v1/chat/completions"
    for headers, body, status in [
        ({}, {"model": "helper", "messages": [{"role": "user", "content": "hi"}]}, 401),
        ({"Authorization": f"Bearer {world.member_token}"}, None, 400),
        ({"Authorization": f"Bearer {other_world.member_token}"},
         {"model": "helper", "messages": [{"role": "user", "content": "hi"}]}, 404),
    ]:
        response = httpx.post(url, headers=headers, content=b"{not json" if body is None else None, json=body,
                              timeout=10)
        assert response.status_code == status
        assert set(response.json()["error"]) == {"message", "type", "code", "param"}
    wrong_method = httpx.get(url, headers={"Authorization": f"Bearer {world.member_token}"}, timeout=10)
    assert wrong_method.status_code == 405 and wrong_method.headers["Allow"] == "POST"


def test_a_failed_run_is_an_error_streamed_or_not(world, fake_llm, celery_worker, live_server_url):
    agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], name="Helper")
    client = sdk(live_server_url, world.member_token)
    fake_llm.script(Fail(400), Fail(400))
    with pytest.raises(openai.APIStatusError) as caught:
        client.chat.completions.create(model="helper", messages=[{"role": "user", "content": "hi"}])
    assert caught.value.status_code == 502 and caught.value.code == "model_error"
    with pytest.raises(openai.APIError) as streamed:
        list(client.chat.completions.create(model="helper", messages=[{"role": "user", "content": "hi"}], stream=True))
    assert "model" in str(streamed.value).lower()


def test_a_run_waiting_for_a_persons_decision_answers_at_once_unstreamed_and_streams_on(
    world, fake_llm, celery_worker, live_server_url,
):
    """A non-streamed completion does not hold its request until someone decides: it answers
    at once with where to decide (the run stays paused and goes on in its chat once decided). A
    stream stays open through the pause (keep-alives) and carries the answer after the decision."""
    from sessions.models import Approval

    agent = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], name="Careful")
    bind_builtin(agent, "test_echo", approval_policy=[{"pattern": "*", "action": "ask"}])
    fake_llm.script(ToolCalls([("test_echo", {"text": "hello"})]), Reply("It said hello."),
                    ToolCalls([("test_echo", {"text": "again"})]), Reply("It said again."))
    client = sdk(live_server_url, world.member_token)

    raw = client.chat.completions.with_raw_response.create(model="careful", messages=[{"role": "user", "content": "echo"}])
    body, answer = raw.http_response.json(), raw.parse()
    chat_id = int(raw.headers["X-Chat-Id"])
    url = f"{live_server_url}/#/sessions/{chat_id}"
    assert (body["status"], body["approval_url"], body["chat_id"]) == ("awaiting_approval", url, chat_id)
    assert answer.choices[0].finish_reason == "stop"
    assert url in answer.choices[0].message.content and "test_echo" in answer.choices[0].message.content
    run = Run.all_tenants.get(pk=int(answer.id.removeprefix("chatcmpl-")))
    assert run.status == "awaiting_approval"
    approval = Approval.all_tenants.get(run=run)
    decided = world.client().post(f"/api/v1/approvals/{approval.pk}/", {"decision": "approve"}, format="json")
    assert decided.status_code == 200, decided.content
    for _ in range(100):
        run.refresh_from_db()
        if run.status == "completed":
            break
        threading.Event().wait(0.1)
    assert (run.status, run.reply) == ("completed", "It said hello.")

    chunks: list = []
    streamer = threading.Thread(target=lambda: chunks.extend(client.chat.completions.create(
        model="careful", stream=True, messages=[{"role": "user", "content": "echo again"}])))
    streamer.start()
    try:
        for _ in range(100):
            pending = Approval.all_tenants.filter(status="pending").first()
            if pending is not None:
                break
            threading.Event().wait(0.1)
        assert pending is not None and pending.pk != approval.pk
        assert not any(c.choices and c.choices[0].finish_reason for c in chunks)  # still open, waiting
        decided = world.client().post(f"/api/v1/approvals/{pending.pk}/", {"decision": "approve"}, format="json")
        assert decided.status_code == 200, decided.content
    finally:
        streamer.join(20)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "It said again."
    assert chunks[-1].choices[0].finish_reason == "stop"


@pytest.mark.parametrize("limit", ["throttle", "stream_slots"])
def test_over_a_limit_both_endpoints_answer_429_with_retry_after_and_start_no_run(world, live_server_url, monkeypatch,
                                                                                  limit):
    """The message and run throttles (those of posting in the app) and the caller's open-stream
    slots hold at this door too: OpenAI's 429 ``rate_limit_error`` with ``Retry-After``, no run."""
    agent_with_route(tenant=world.tenant, base_urls=["http://127.0.0.1:9/v1"], name="Helper")
    if limit == "throttle":
        monkeypatch.setattr("sessions.api.agent_runs.throttle_wait", lambda **kwargs: 3.2)
    else:
        async def no_slot(*, user_id):
            return None

        monkeypatch.setattr("sessions.stream_guard.stream_slot_acquire", no_slot)
    client = sdk(live_server_url, world.member_token)
    for create in (lambda: client.chat.completions.create(model="helper", messages=[{"role": "user", "content": "hi"}]),
                   lambda: client.chat.completions.create(model="helper", stream=True,
                                                          messages=[{"role": "user", "content": "hi"}]),
                   lambda: client.responses.create(model="helper", input="hi")):
        with pytest.raises(openai.RateLimitError) as caught:
            create()
        retry_after = int(caught.value.response.headers["Retry-After"])
        assert retry_after == 4 if limit == "throttle" else retry_after > 0
        assert caught.value.body["type"] == "rate_limit_error"
    assert not Run.all_tenants.exists()
