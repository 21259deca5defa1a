"""MCP resources attached to a chat message (issue 37): the post checks them (400 naming the
item), the run reads them when it starts through its own pooled session (text as a framed
start-context block, an image attached to the user's message and sent as an image part, an
unknown URI a note the model reads; regenerating reads them again), and ``GET /api/v1/agents/<id>/resources/?q=`` lists what a
member may attach, on a worker (another tenant's agent: 404).

The in-test MCP server over Streamable HTTP, the fake model, a real Celery worker thread for the
listing.
"""

from __future__ import annotations

import pytest
from asgiref.sync import sync_to_async

from agents.models import CapabilityBinding, CapabilityKind
from agents.tests.factories import agent_with_route
from capabilities.mcp.pool import mcp_pool
from capabilities.services import mcp_server_save
from capabilities.tests.mcp_test_server import PNG_IMAGE, README_TEXT, serve_mcp_http
from llm.models import ModelRouteEntry
from llm.testing import Reply
from sessions.models import Artifact, Run
from sessions.runner.loop import execute_run
from sessions.services import chat_session_create
from tenants.scoping import tenant_scope

pytestmark = [pytest.mark.usefixtures("all_tenants_scope")]


@pytest.fixture(autouse=True)
async def close_the_mcp_pool():
    yield
    await mcp_pool().aclose()


def _agent_with_docs(world, llm_url: str, mcp_url: str):
    agent = agent_with_route(tenant=world.tenant, base_urls=[llm_url])
    ModelRouteEntry.all_tenants.filter(route=agent.route).update(supports_images=True)
    server = mcp_server_save(tenant=world.tenant, env=None, name="docs", alias="docs", transport="streamable_http",
                             url=mcp_url)
    binding = CapabilityBinding.all_tenants.create(tenant=world.tenant, agent=agent, kind=CapabilityKind.MCP_SERVER,
                                                   mcp_server=server)
    with tenant_scope(world.tenant.pk):
        session = chat_session_create(user=world.member, agent=agent)
    return agent, binding, session


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("no_enqueue")
async def test_attached_resources_reach_the_model_when_the_run_starts(world, fake_llm):
    with serve_mcp_http() as mcp:
        agent, binding, session = await sync_to_async(_agent_with_docs)(world, fake_llm.base_url, mcp.url)
        client = world.client()
        url = f"/api/v1/sessions/{session.pk}/messages/"

        def post(resources):
            return client.post(url, {"content": "Summarise these.", "resources": resources}, format="json")

        bad = [
            ([{"server": "nope", "uri": "doc://notes/readme"}], "server 'nope' is not an MCP server of this chat's agent"),
            ([{"binding": binding.pk, "uri": "notes/readme"}], "is not an absolute URI"),
            ([{"binding": binding.pk, "uri": "doc://notes/{name}"}], "fill in the template's variables"),
            (["doc://notes/readme"], "resources[0] must be an object"),
        ]
        for resources, message in bad:
            answer = await sync_to_async(post)(resources)
            assert answer.status_code == 400 and message in answer.json()["message"], answer.json()
        answer = await sync_to_async(post)([
            {"server": "docs", "uri": "doc://notes/readme"},
            {"binding": binding.pk, "uri": "doc://images/logo.png"},
            {"server": "docs", "uri": "doc://missing"},
        ])
        assert answer.status_code == 201, answer.json()
        run_id = answer.json()["run"]["id"]
        fake_llm.script(Reply("The launch is on Tuesday."), Reply("Tuesday, again."))
        await execute_run(run_id)
        assert mcp.state.reads == ["doc://notes/readme", "doc://images/logo.png", "doc://missing"]
        again = await sync_to_async(client.post)(f"/api/v1/sessions/{session.pk}/regenerate/", {}, format="json")
        assert again.status_code in (200, 201), again.json()
        await execute_run(again.json()["run"]["id"])
        assert mcp.state.reads[3:] == mcp.state.reads[:3], "regenerating reads the resources again"

    run = await sync_to_async(Run.all_tenants.get)(pk=run_id)
    assert run.status == "completed", run.error
    assert run.request_options["resources"][0] == {"binding": binding.pk, "server_id": binding.mcp_server_id,
                                                   "server": "docs", "uri": "doc://notes/readme"}
    image = await sync_to_async(Artifact.all_tenants.filter(session_id=session.pk).order_by("pk").first)()
    assert (image.name, image.mime_type, bytes(image.content)) == ("logo.png", "image/png", PNG_IMAGE)
    # the first run's message left the history when it was regenerated; the run keeps its input
    assert run.input.splitlines() == [
        "Summarise these.", "[resource: docs doc://notes/readme]", "[resource: docs doc://images/logo.png]",
        "[resource: docs doc://missing]", f'[image: artifact:{image.pk} "logo.png", image/png, {len(PNG_IMAGE)} B]',
    ]
    request = fake_llm.requests[0]["messages"]
    system = request[0]["content"]
    assert "Resource 'doc://notes/readme' of MCP server 'docs', attached by the user to their message:" in system
    assert README_TEXT in system and "<untrusted-data" in system, "framed as outside data"
    assert "attached to the user's message as [image: artifact:" in system
    assert "Resource not found: doc://missing" in system
    [user] = [m for m in request if m["role"] == "user"]
    assert any(part.get("type") == "image_url" for part in user["content"]), "the image goes with the message"
    assert [b["data"]["resource"]["uri"] for b in run.context] == ["doc://notes/readme", "doc://images/logo.png",
                                                                  "doc://missing"]
    regenerated = await sync_to_async(Run.all_tenants.get)(pk=again.json()["run"]["id"])
    assert regenerated.status == "completed" and regenerated.request_options == run.request_options
    lines = regenerated.input.splitlines()
    assert lines[:4] == run.input.splitlines()[:4]
    assert len(lines) == 5 and lines[4].startswith("[image: artifact:") and lines[4] != run.input.splitlines()[4], \
        "the earlier run's image line is dropped; the new read attaches its own"


@pytest.mark.django_db(transaction=True)
def test_listing_what_a_member_may_attach(world, other_world, celery_worker, fake_llm):
    with serve_mcp_http() as mcp:
        agent, binding, _ = _agent_with_docs(world, fake_llm.base_url, mcp.url)
        answer = world.client().get(f"/api/v1/agents/{agent.pk}/resources/", {"q": "project"})
        assert answer.status_code == 200, answer.content
        body = answer.json()
        assert body["errors"] == []
        assert [(r["server"], r["binding"], r["uri"], r["template"]) for r in body["results"]] == [
            ("docs", binding.pk, "doc://notes/readme", False), ("docs", binding.pk, "doc://images/logo.png", False)]
        assert body["results"][0] == {
            "server": "docs", "binding": binding.pk, "uri": "doc://notes/readme", "name": "readme",
            "title": "Project readme", "description": "How the project works.", "mime_type": "text/markdown",
            "size": None, "template": False}
        templates = world.client().get(f"/api/v1/agents/{agent.pk}/resources/", {"q": "note by"}).json()["results"]
        assert [(r["uri"], r["template"]) for r in templates] == [("doc://notes/{name}", True)]
        assert mcp.state.resource_cursors == [None, "10"], "the second search used the worker's cached listing"
    theirs = other_world.client().get(f"/api/v1/agents/{agent.pk}/resources/")
    assert theirs.status_code == 404 and theirs.json()["message"] == "Agent not found."
