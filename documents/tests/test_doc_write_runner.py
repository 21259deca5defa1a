"""doc_write through the run loop: a scripted model writes a document; artifact_updated events
reach the session stream and the user reads the document in the API."""

from __future__ import annotations

import pytest
from channels.db import database_sync_to_async as sync_to_async

from agents.tests.factories import agent_with_route, bind_builtin
from llm.testing import Reply, ToolCalls
from sessions.events import events_since
from sessions.models import ToolCall
from sessions.runner.loop import execute_run
from sessions.tests.conftest import post_message, reload_run

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("no_enqueue"),
    pytest.mark.usefixtures("all_tenants_scope"),
]


@sync_to_async
def make_agent(world, url):
    agent = agent_with_route(tenant=world.tenant, base_urls=[url])
    bind_builtin(agent, "doc_write")
    return agent


@sync_to_async
def tool_calls(run_id):
    return list(ToolCall.all_tenants.filter(run_id=run_id).order_by("id"))


async def test_a_run_writes_a_document_and_publishes_artifact_updated(world, fake_llm):
    agent = await make_agent(world, fake_llm.base_url)
    fake_llm.script(
        ToolCalls([("doc_write", {"op": "create", "title": "Plan", "content": "# Plan\n\n## Steps\n\nTBD\n"})]),
        Reply("Created the plan."),
    )
    run = await post_message(agent=agent, user=world.member, content="Write a plan")
    await execute_run(run.pk)
    run = await reload_run(run.pk)
    assert run.status == "completed", run.reason
    [call] = await tool_calls(run.pk)
    assert call.status == "succeeded", call.error
    doc_id = call.result_data["document_id"]
    assert fake_llm.requests[1]["messages"][-1]["content"] == f"Created document:{doc_id} «Plan» (version 1, 5 lines)."

    session = await sync_to_async(lambda: run.session)()
    fake_llm.script(
        ToolCalls([("doc_write", {"op": "patch", "id": doc_id, "section": "Steps", "content": "1. Book train"})]),
        Reply("Updated."),
    )
    second = await post_message(agent=agent, user=world.member, content="Add a step", session=session)
    await execute_run(second.pk)
    assert (await reload_run(second.pk)).status == "completed"

    events = [e for e in await events_since(session_id=session.pk, after_seq=0) if e["type"] == "artifact_updated"]
    assert [(e["run_id"], e["data"]) for e in events] == [
        (run.pk, {"document_id": doc_id, "title": "Plan", "op": "create", "version": 1}),
        (second.pk, {"document_id": doc_id, "title": "Plan", "op": "patch", "version": 2}),
    ]

    client = world.client()
    document = await sync_to_async(client.get)(f"/api/v1/documents/{doc_id}/")
    assert document.status_code == 200
    assert document.json()["content"] == "# Plan\n\n## Steps\n\n1. Book train\n"
    assert (document.json()["created_by_run"], document.json()["updated_by_run"]) == (run.pk, second.pk)
