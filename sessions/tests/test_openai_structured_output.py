"""`response_format` (chat completions) and `text.format` (responses) on the OpenAI-compatible API,
with the official `openai` SDK as the client and the fake model scripted: the model is told the
format, an answer that does not parse or validate gets up to two repair turns (the problem fed
back to the model), then the run fails and the client gets an error with code
`json_schema_validation_failed` (never a 200 with an invalid answer)."""

from __future__ import annotations

import json

import openai
import openresponses_types as ort
import pytest

from agents.tests.factories import agent_with_route
from llm.testing import Reply
from sessions.models import Run

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("all_tenants_scope")]

CITY = {"type": "object", "properties": {"city": {"type": "string"}, "temp": {"type": "integer"}},
        "required": ["city", "temp"], "additionalProperties": False}
FORMAT = {"type": "json_schema", "json_schema": {"name": "weather", "schema": CITY, "strict": True}}


def sdk(live_server_url: str, token: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{live_server_url}/api/openai/v1", api_key=token, max_retries=0, timeout=30)


def last_user_note(request: dict) -> str:
    return request["messages"][-1]["content"] if request["messages"][-1]["role"] == "user" else ""


def test_a_valid_answer_is_the_content_and_the_model_is_told_the_schema(world, fake_llm, celery_worker,
                                                                        live_server_url):
    agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], name="Forecaster")
    fake_llm.script(Reply('{"city": "Paris", "temp": 21}'))
    answer = sdk(live_server_url, world.member_token).chat.completions.create(
        model="forecaster", messages=[{"role": "user", "content": "Paris?"}], response_format=FORMAT)
    assert json.loads(answer.choices[0].message.content) == {"city": "Paris", "temp": 21}
    system = fake_llm.requests[0]["messages"][0]["content"]
    assert "'weather'" in system and '"required":["city","temp"]' in system
    assert Run.all_tenants.get().request_options["response_format"]["name"] == "weather"


def test_an_invalid_answer_is_repaired_with_the_validation_error(world, fake_llm, celery_worker, live_server_url):
    agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], name="Forecaster")
    fake_llm.script(Reply("Sure! It is warm."), Reply('```json\n{"city": "Paris"}\n```'),
                    Reply('```json\n{"city": "Paris", "temp": 21}\n```'))
    chunks = list(sdk(live_server_url, world.member_token).chat.completions.create(
        model="forecaster", messages=[{"role": "user", "content": "Paris?"}], response_format=FORMAT, stream=True))

    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert content == '{"city": "Paris", "temp": 21}'  # only the checked answer, without its fence
    assert "not valid JSON" in last_user_note(fake_llm.requests[1])
    assert "'temp' is a required property" in last_user_note(fake_llm.requests[2])
    assert fake_llm.requests[2]["messages"][-2] == {"role": "assistant", "content": '```json\n{"city": "Paris"}\n```'}
    run = Run.all_tenants.get()
    assert (run.status, run.reply, run.loop_count) == ("completed", '{"city": "Paris", "temp": 21}', 3)


def test_after_two_repairs_the_answer_is_an_error_not_a_200(world, fake_llm, celery_worker, live_server_url):
    agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], name="Forecaster")
    client = sdk(live_server_url, world.member_token)
    fake_llm.script(Reply("no"), Reply("[1]"), Reply('{"city": 5, "temp": 1}'))
    with pytest.raises(openai.APIStatusError) as caught:
        client.chat.completions.create(model="forecaster", messages=[{"role": "user", "content": "?"}],
                                       response_format=FORMAT)
    assert caught.value.status_code == 502 and caught.value.code == "json_schema_validation_failed"
    assert "/city" in caught.value.message and "5 is not of type 'string'" in caught.value.message
    assert len(fake_llm.requests) == 3
    run = Run.all_tenants.get()
    assert (run.status, run.reason) == ("failed", "output_invalid")

    fake_llm.script(Reply("a"), Reply("b"), Reply("c"))
    with pytest.raises(openai.APIError) as streamed:
        list(client.chat.completions.create(model="forecaster", messages=[{"role": "user", "content": "?"}],
                                            response_format={"type": "json_object"}, stream=True))
    assert "requested format" in str(streamed.value)


def test_json_object_needs_an_object(world, fake_llm, celery_worker, live_server_url):
    agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], name="Forecaster")
    fake_llm.script(Reply("[1, 2]"), Reply('{"numbers": [1, 2]}'))
    answer = sdk(live_server_url, world.member_token).chat.completions.create(
        model="forecaster", messages=[{"role": "user", "content": "two numbers"}],
        response_format={"type": "json_object"})
    assert json.loads(answer.choices[0].message.content) == {"numbers": [1, 2]}
    assert "must be a JSON object" in last_user_note(fake_llm.requests[1])


def test_responses_text_format_streamed_and_stored(world, fake_llm, celery_worker, live_server_url):
    agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], name="Forecaster")
    fake_llm.script(Reply('{"city": "Oslo"}'), Reply('{"city": "Oslo", "temp": -3}'))
    client = sdk(live_server_url, world.member_token)
    text = {"format": {"type": "json_schema", "name": "weather", "schema": CITY, "strict": True}}
    events = list(client.responses.create(model="forecaster", input="Oslo?", text=text, stream=True))
    done = events[-1].response
    assert events[-1].type == "response.completed" and json.loads(done.output_text) == {"city": "Oslo", "temp": -3}
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == done.output_text
    assert [i.type for i in done.output] == ["message"] and done.text.format.type == "json_schema"
    added = [e.item.id for e in events if e.type == "response.output_item.added"]
    assert added == [done.output[0].id]
    dumped = done.model_dump(by_alias=True)  # the SDK's `schema_` is `schema`
    assert dumped["text"]["format"]["schema"] == CITY  # echoed, as OpenAI does
    # openresponses-types 2.4.0 types JsonSchemaResponseFormat.schema as None (its generator's
    # reading of an untyped field): the rest of the response is validated
    ort.ResponseResource.model_validate({**dumped, "text": {"format": {**dumped["text"]["format"], "schema": None}}})
    assert client.responses.retrieve(done.id).output_text == done.output_text

    fake_llm.script(Reply("x"), Reply("y"), Reply("z"))
    failed = client.responses.create(model="forecaster", input="Oslo?", text={"format": {"type": "json_object"}})
    assert failed.status == "failed" and failed.error.code == "json_schema_validation_failed"
    ort.ResponseResource.model_validate(failed.model_dump())
