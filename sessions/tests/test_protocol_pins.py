"""Version pins on the three doors (issue 36): ``GET /api/openai/v1/models`` lists ``slug@<n>``
for an agent's newest versions and its published one (the official ``openai`` SDK as the
client); ``/a2a/<slug>@<n>/`` runs version ``n`` (a2a-sdk client); the MCP agents' tool takes a
``version`` argument; and the console agent page's A2A curl snippet, run as copied (bash, curl)
against the live server, gets a completed task."""

from __future__ import annotations

import asyncio
import html
import json
import re
import subprocess
import uuid
from urllib.parse import urlsplit

import httpx
import pytest
from a2a.client import ClientConfig, create_client
from a2a.types.a2a_pb2 import Message, Part, Role, SendMessageRequest, TaskState
from openai import NotFoundError, OpenAI

from agents.models import AgentInstance
from agents.tests.factories import agent_with_route
from agents.versions import version_publish
from llm.testing import Reply
from sessions.models import Run

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("all_tenants_scope")]


def _agent_with_versions(world, base_url: str) -> AgentInstance:
    """Agent ``helper`` with versions 1–5 (each a new system prompt), version 1 published."""
    agent = agent_with_route(tenant=world.tenant, base_urls=[base_url], name="Helper", system_prompt="prompt 1")
    for n in range(2, 6):
        agent.system_prompt = f"prompt {n}"
        agent.save()
    assert sorted(agent.versions.values_list("number", flat=True)) == [1, 2, 3, 4, 5]
    version_publish(agent, number=1)
    return agent


def test_models_list_the_newest_versions_and_the_published_one(world, live_server_url):
    _agent_with_versions(world, "http://127.0.0.1:9/v1")
    client = OpenAI(base_url=f"{live_server_url}/api/openai/v1", api_key=world.member_token)
    models = client.models.list().data
    assert [m.id for m in models] == ["helper", "helper@5", "helper@4", "helper@3", "helper@1"]
    assert [m.model_extra.get("published") for m in models[1:]] == [False, False, False, True]
    assert client.models.retrieve("helper@2").id == "helper@2"  # not listed, still named
    with pytest.raises(NotFoundError) as missing:
        client.models.retrieve("helper@9")
    assert missing.value.code == "model_not_found"


def test_a2a_at_slug_at_n_runs_that_version(world, fake_llm, celery_worker, live_server_url):
    _agent_with_versions(world, fake_llm.base_url)
    fake_llm.script(Reply("from two"), Reply("from the published one"))

    async def scenario():
        answers = {}
        for slug in ("helper@2", "helper"):
            http = httpx.AsyncClient(headers={"Authorization": f"Bearer {world.member_token}"}, timeout=30)
            client = await create_client(f"{live_server_url}/a2a/{slug}/", client_config=ClientConfig(
                httpx_client=http, supported_protocol_bindings=["JSONRPC"], streaming=False))
            try:
                request = SendMessageRequest(message=Message(message_id=str(uuid.uuid4()), role=Role.ROLE_USER,
                                                             parts=[Part(text="hi")]))
                [sent] = [e async for e in client.send_message(request)]
                answers[slug] = sent.task
            finally:
                await client.close()
        async with httpx.AsyncClient(headers={"Authorization": f"Bearer {world.member_token}"}) as http:
            missing = await http.get(f"{live_server_url}/a2a/helper@9/.well-known/agent-card.json")
            pinned_card = (await http.get(f"{live_server_url}/a2a/helper@2/.well-known/agent-card.json")).json()
        return answers, missing, pinned_card

    answers, missing, pinned_card = asyncio.run(scenario())
    pinned, published = answers["helper@2"], answers["helper"]
    assert pinned.status.state == published.status.state == TaskState.TASK_STATE_COMPLETED
    assert Run.all_tenants.get(pk=int(pinned.id)).agent_version.number == 2
    assert Run.all_tenants.get(pk=int(published.id)).agent_version.number == 1
    assert fake_llm.requests[0]["messages"][0]["content"].startswith("prompt 2")
    assert missing.status_code == 404
    assert {i["url"] for i in pinned_card["supportedInterfaces"]} == {
        f"{live_server_url}/a2a/helper@2/", f"{live_server_url}/a2a/helper@2/rest"}


@pytest.mark.django_db  # not transactional: the runs it starts are never handed to a worker
def test_the_mcp_tool_takes_a_version(world):
    from sessions.api.agent_runs import RunRefused
    from sessions.api.mcp_agents import CallAsk, call_arguments, call_start
    from tenants.resolution import caller_resolve

    _agent_with_versions(world, "http://127.0.0.1:9/v1")
    assert call_arguments({"message": "hi", "version": 3}) == CallAsk(message="hi", chat_id=None, version=3)
    assert call_arguments({"message": "hi", "version": "3"}).version == 3
    for bad in (0, -1, True, "x", 1.5):
        assert call_arguments({"message": "hi", "version": bad}).startswith("version must be")
    caller = caller_resolve(raw_token=world.member_token)
    _chat, run_id = call_start(caller, "helper", CallAsk(message="hi", chat_id=None, version=4))
    _chat, published_run = call_start(caller, "helper", CallAsk(message="hi", chat_id=None))
    assert Run.all_tenants.get(pk=run_id).agent_version.number == 4
    assert Run.all_tenants.get(pk=published_run).agent_version.number == 1
    with pytest.raises(RunRefused, match="no version 9"):
        call_start(caller, "helper", CallAsk(message="hi", chat_id=None, version=9))


def test_the_console_a2a_curl_snippet_runs_as_copied(client, world, fake_llm, celery_worker, live_server_url):
    agent = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], name="Helper")
    fake_llm.script(Reply("Hello from the agent."))
    client.force_login(world.admin)
    host = urlsplit(live_server_url).netloc
    page = client.get(f"/admin/agents/agentinstance/{agent.pk}/change/", HTTP_HOST=host).content.decode()
    [snippet] = re.findall(r'<pre class="call-snippet" id="call-snippet-a2a"[^>]*>(.*?)</pre>', page, re.S)
    command = html.unescape(snippet).replace("<API token>", world.member_token)
    assert f"{live_server_url}/a2a/helper/" in command
    done = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    task = answer["result"]["task"]
    assert task["status"]["state"] == "TASK_STATE_COMPLETED", answer
    assert task["artifacts"][0]["parts"][0]["text"] == "Hello from the agent."
