"""Versions end to end: the OpenAI-compatible API (official ``openai`` SDK) runs the published
version, ``slug@n`` pins one, on the fake model with a real worker."""

from __future__ import annotations

import openai
import pytest

from agents.models import AgentVersion
from agents.tests.factories import agent_with_route
from agents.versions import version_publish
from llm.testing import Reply
from sessions.models import Run

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("all_tenants_scope")]


def _system_prompt(request: dict) -> str:
    return request["messages"][0]["content"]


def test_the_api_runs_the_published_version_and_slug_at_n_pins_one(world, fake_llm, celery_worker, live_server_url):
    agent = agent_with_route(
        tenant=world.tenant, base_urls=[fake_llm.base_url], name="Helper", system_prompt="PROMPT-ONE"
    )
    version_publish(agent)
    agent.system_prompt = "PROMPT-TWO"
    agent.save()
    client = openai.OpenAI(
        base_url=f"{live_server_url}/api/openai/v1", api_key=world.member_token, max_retries=0, timeout=30
    )
    fake_llm.script(Reply("one"), Reply("two"))
    ask = [{"role": "user", "content": "hi"}]
    assert client.chat.completions.create(model="helper", messages=ask).choices[0].message.content == "one"
    assert client.chat.completions.create(model="helper@2", messages=ask).choices[0].message.content == "two"
    assert "PROMPT-ONE" in _system_prompt(fake_llm.requests[0]) and "PROMPT-TWO" not in _system_prompt(
        fake_llm.requests[0]
    )
    assert "PROMPT-TWO" in _system_prompt(fake_llm.requests[1])
    runs = Run.all_tenants.filter(session__agent=agent).order_by("id")
    assert [AgentVersion.all_tenants.get(pk=r.agent_version_id).number for r in runs] == [1, 2]
    with pytest.raises(openai.NotFoundError) as caught:
        client.chat.completions.create(model="helper@9", messages=ask)
    assert caught.value.code == "model_not_found"
    assert len(fake_llm.requests) == 2
    assert client.models.retrieve("helper@2").id == "helper@2"
    assert [m.id for m in client.models.list()] == ["helper", "helper@2", "helper@1"], "each agent, then its versions"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("helper@9")
