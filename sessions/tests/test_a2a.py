"""A2A 1.0 at /a2a/<slug>/ (sessions/api/a2a), with the official a2a-sdk client against the
live ASGI server: the card (token, public switch, 0.3 fields), SendMessage blocking over both
bindings, SendStreamingMessage, GetTask, ListTasks, CancelTask, SubscribeToTask, an approval as
input-required and its answer, the spec's error codes, A2A-Version negotiation, and the tenant
boundary (another tenant's token sees no card, task or cancel)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import pytest
from a2a.client import A2ACardResolver, ClientConfig, create_client
from a2a.types.a2a_pb2 import (
    CancelTaskRequest,
    GetTaskRequest,
    ListTasksRequest,
    Message,
    Part,
    Role,
    SendMessageRequest,
    SubscribeToTaskRequest,
    TaskState,
)
from a2a.utils.errors import (
    TaskNotCancelableError,
    TaskNotFoundError,
    UnsupportedOperationError,
)

from agents.models import AgentInstance
from agents.tests.factories import AgentFactory, agent_with_route, bind_builtin
from llm.testing import Delay, Reply, ToolCalls
from sessions.models import Approval, Run, TaskPushConfig

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("all_tenants_scope")]

JSONRPC, REST = "JSONRPC", "HTTP+JSON"


def _run(coro_fn: Callable[[], Awaitable[Any]]) -> Any:
    return asyncio.run(coro_fn())


def _message(text: str, *, task_id: str = "", context_id: str = "") -> SendMessageRequest:
    return SendMessageRequest(message=Message(message_id=str(uuid.uuid4()), role=Role.ROLE_USER,
                                              parts=[Part(text=text)], task_id=task_id, context_id=context_id))


def _http(token: str | None) -> httpx.AsyncClient:
    return httpx.AsyncClient(headers={"Authorization": f"Bearer {token}"} if token else {}, timeout=30)


async def _client(base: str, token: str, *, binding: str = JSONRPC, streaming: bool = False, polling: bool = False):
    config = ClientConfig(httpx_client=_http(token), supported_protocol_bindings=[binding], streaming=streaming,
                          polling=polling)
    return await create_client(f"{base}/a2a/helper/", client_config=config)


async def _send(client, request: SendMessageRequest) -> list:
    return [event async for event in client.send_message(request)]


@pytest.fixture(params=["rls", "app-layer-only"])
def tenant_walls(request, monkeypatch) -> str:
    """The cross-tenant tests run twice: with PostgreSQL's row-level security, and with it out
    of the way (``app.all_tenants = on``, as agent_platform/tests/test_tenant_isolation_app_layer.py
    does), so a leak in the application layer is not hidden by the database."""
    if request.param == "app-layer-only":
        from tenants import rls

        real_wanted_state = rls.wanted_state

        def every_tenant() -> tuple[str, str, str]:
            role, _tenant_ids, _all = real_wanted_state()
            return role, "", "on"

        monkeypatch.setattr(rls, "wanted_state", every_tenant)
    return request.param


def _reply(task) -> str:
    return "".join(p.text for a in task.artifacts if a.artifact_id == "reply" for p in a.parts)


def test_the_card_is_for_the_tenants_callers_or_public_with_the_switch(world, other_world, live_server_url,
                                                                       tenant_walls):
    agent = agent_with_route(tenant=world.tenant, base_urls=["http://127.0.0.1:9/v1"], name="Helper",
                             description="Answers questions.")
    AgentFactory(tenant=other_world.tenant, name="Secret")
    card_url = f"{live_server_url}/a2a/helper/.well-known/agent-card.json"

    async def scenario():
        async with _http(world.member_token) as http:
            card = await A2ACardResolver(http, f"{live_server_url}/a2a/helper/").get_agent_card()
            raw = (await http.get(card_url)).json()
            old_path = await http.get(f"{live_server_url}/a2a/helper/.well-known/agent.json")
        async with _http(None) as anonymous:
            no_token = await anonymous.get(card_url)
        async with _http(other_world.member_token) as foreign:
            theirs = await foreign.get(card_url)
            missing = await foreign.get(f"{live_server_url}/a2a/nope/.well-known/agent-card.json")
            their_own = await foreign.get(f"{live_server_url}/a2a/secret/.well-known/agent-card.json")
        return card, raw, old_path, no_token, theirs, missing, their_own

    card, raw, old_path, no_token, theirs, missing, their_own = _run(scenario)
    assert (card.name, card.description, card.capabilities.streaming) == ("Helper", "Answers questions.", True)
    assert {(i.protocol_binding, i.protocol_version, i.url) for i in card.supported_interfaces} == {
        (JSONRPC, "1.0", f"{live_server_url}/a2a/helper/"), (REST, "1.0", f"{live_server_url}/a2a/helper/rest"),
        (JSONRPC, "0.3", f"{live_server_url}/a2a/helper/"), (REST, "0.3", f"{live_server_url}/a2a/helper/rest"),
    }
    assert card.security_schemes["bearer"].http_auth_security_scheme.scheme == "Bearer"
    assert [list(r.schemes) for r in card.security_requirements] == [["bearer"]]
    # the 0.3 card's fields, for older clients
    assert (raw["url"], raw["preferredTransport"], raw["protocolVersion"]) == (
        f"{live_server_url}/a2a/helper/", JSONRPC, "0.3")
    assert old_path.status_code == 200 and old_path.json()["name"] == "Helper"
    assert no_token.status_code == 401 and no_token.headers["WWW-Authenticate"].startswith("Bearer")
    assert theirs.status_code == 404 and missing.status_code == 404
    assert theirs.json() == {"message": "No agent 'helper'.", "extra": {}}
    assert missing.json()["message"] == "No agent 'nope'." and their_own.status_code == 200

    switched = world.client(admin=True).patch(f"/api/v1/admin/agents/{agent.pk}/", {"a2a_public": True}, format="json")
    assert switched.status_code == 200 and switched.json()["a2a_public"] is True
    assert AgentInstance.all_tenants.get(pk=agent.pk).a2a_public

    async def public():
        async with _http(None) as anonymous:
            card = await anonymous.get(card_url)
            call = await anonymous.post(f"{live_server_url}/a2a/helper/", json={
                "jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": "1"}})
        return card, call

    card_response, call = _run(public)
    assert card_response.status_code == 200 and card_response.json()["name"] == "Helper"
    assert call.status_code == 401  # a public card; calls still need a token
    assert not Run.all_tenants.exists()


@pytest.mark.parametrize("binding", [JSONRPC, REST])
def test_send_message_blocking_is_a_run_and_context_continues_the_chat(binding, world, fake_llm, celery_worker,
                                                                       live_server_url):
    agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], name="Helper")
    fake_llm.script(Reply("Paris."), Reply("Still Paris."))

    async def scenario():
        client = await _client(live_server_url, world.member_token, binding=binding)
        try:
            [first] = await _send(client, _message("Capital of France?"))
            [second] = await _send(client, _message("And now?", context_id=first.task.context_id))
        finally:
            await client.close()
        return first.task, second.task

    first, second = _run(scenario)
    run = Run.all_tenants.get(pk=int(first.id))
    assert (first.status.state, _reply(first), first.context_id) == (
        TaskState.TASK_STATE_COMPLETED, "Paris.", str(run.session_id))
    assert [(m.role, m.parts[0].text) for m in first.history] == [
        (Role.ROLE_USER, "Capital of France?"), (Role.ROLE_AGENT, "Paris.")]
    assert (run.status, run.input, run.user_id, run.session.agent.slug) == (
        "completed", "Capital of France?", world.member.pk, "helper")
    assert run.purpose == "api"  # counted in usage and budgets as the API's, not the chat app's
    usage = world.client(admin=True).get("/api/v1/admin/usage/").json()
    assert [row["run_purpose"] for row in usage["by_run_purpose"]] == ["api"]
    assert (second.context_id, _reply(second)) == (first.context_id, "Still Paris.")
    assert [(m["role"], m["content"]) for m in fake_llm.requests[1]["messages"][1:]] == [
        ("user", "Capital of France?"), ("assistant", "Paris."), ("user", "And now?")]


@pytest.mark.parametrize("binding", [JSONRPC, REST])
def test_streaming_sends_the_task_working_the_reply_in_chunks_then_completed(binding, world, fake_llm, celery_worker,
                                                                             live_server_url):
    agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], name="Helper")
    fake_llm.script(Reply("A fairly long answer, in chunks.", chunk_size=5))

    async def scenario():
        client = await _client(live_server_url, world.member_token, binding=binding, streaming=True)
        try:
            return await _send(client, _message("Talk to me"))
        finally:
            await client.close()

    events = _run(scenario)
    kinds = [e.WhichOneof("payload") for e in events]
    assert kinds[0] == "task" and events[0].task.status.state in (TaskState.TASK_STATE_SUBMITTED,
                                                                   TaskState.TASK_STATE_WORKING)
    assert "status_update" in kinds[1:] and kinds[-1] == "status_update"
    assert events[-1].status_update.status.state == TaskState.TASK_STATE_COMPLETED
    chunks = [e.artifact_update for e in events if e.HasField("artifact_update")]
    assert len(chunks) >= 2 and chunks[-1].last_chunk and not chunks[0].append
    assert "".join(p.text for c in chunks for p in c.artifact.parts) == "A fairly long answer, in chunks."
    states = [e.status_update.status.state for e in events if e.HasField("status_update")]
    assert states[0] == TaskState.TASK_STATE_WORKING
    assert {e.status_update.task_id for e in events if e.HasField("status_update")} == {events[0].task.id}


def test_a_stream_opens_with_the_task_as_submitted_even_when_its_run_already_finished(
        world, fake_llm, no_enqueue, live_server_url, monkeypatch):
    """A fast worker can finish the run between its start and the stream's first event: the
    task still opens the stream as submitted, then the updates replayed from the run's start
    (not its final state first, then the updates that led to it). Reproduced here by running
    the run to its end right after it is started, before the handler builds the task."""
    from asgiref.sync import async_to_sync

    from sessions.api.a2a import handler
    from sessions.runner.loop import execute_run

    agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], name="Helper")
    fake_llm.script(Reply("Done already.", chunk_size=5))
    start = handler._start_sync

    def start_and_finish(*args, **kwargs):
        run = start(*args, **kwargs)
        async_to_sync(execute_run)(run.pk)
        return run

    monkeypatch.setattr(handler, "_start_sync", start_and_finish)

    async def scenario():
        client = await _client(live_server_url, world.member_token, streaming=True)
        try:
            return await _send(client, _message("Talk to me"))
        finally:
            await client.close()

    events = _run(scenario)
    assert events[0].WhichOneof("payload") == "task"
    assert events[0].task.status.state == TaskState.TASK_STATE_SUBMITTED, events[0].task.status
    states = [e.status_update.status.state for e in events if e.HasField("status_update")]
    assert states[0] == TaskState.TASK_STATE_WORKING and states[-1] == TaskState.TASK_STATE_COMPLETED
    assert Run.all_tenants.get(pk=int(events[0].task.id)).status == "completed"


def test_get_and_list_tasks_are_the_callers_runs_of_the_agent(world, other_world, fake_llm, celery_worker,
                                                              live_server_url, tenant_walls):
    agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], name="Helper")
    agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], name="Other")
    agent_with_route(tenant=other_world.tenant, base_urls=[fake_llm.base_url], name="Helper")
    fake_llm.script(Reply("one"), Reply("two"), Reply("three"))

    async def scenario():
        client = await _client(live_server_url, world.member_token)
        foreign = await _client(live_server_url, other_world.member_token)
        colleague = await _client(live_server_url, world.admin_token)
        other_agent = await create_client(f"{live_server_url}/a2a/other/", client_config=ClientConfig(
            httpx_client=_http(world.member_token), supported_protocol_bindings=[JSONRPC], streaming=False))
        try:
            [a] = await _send(client, _message("first"))
            [b] = await _send(client, _message("second", context_id=a.task.context_id))
            [c] = await _send(client, _message("elsewhere"))
            got = await client.get_task(GetTaskRequest(id=a.task.id, history_length=1))
            page1 = await client.list_tasks(ListTasksRequest(page_size=2, include_artifacts=True))
            page2 = await client.list_tasks(ListTasksRequest(page_size=2, page_token=page1.next_page_token))
            in_context = await client.list_tasks(ListTasksRequest(context_id=a.task.context_id))
            completed = await client.list_tasks(ListTasksRequest(status=TaskState.TASK_STATE_WORKING))
            theirs = await foreign.list_tasks(ListTasksRequest())
            with pytest.raises(TaskNotFoundError):
                await foreign.get_task(GetTaskRequest(id=a.task.id))
            for other in (colleague, other_agent):  # another user of the tenant; another agent of the user
                assert list((await other.list_tasks(ListTasksRequest())).tasks) == []
                with pytest.raises(TaskNotFoundError):
                    await other.get_task(GetTaskRequest(id=a.task.id))
            with pytest.raises(TaskNotFoundError):
                await client.get_task(GetTaskRequest(id="999999"))
        finally:
            for opened in (client, foreign, colleague, other_agent):
                await opened.close()
        return (a.task, b.task, c.task), got, page1, page2, in_context, completed, theirs

    (a, b, c), got, page1, page2, in_context, working, theirs = _run(scenario)
    assert got.id == a.id and [m.parts[0].text for m in got.history] == ["one"]  # the last message only
    assert [t.id for t in page1.tasks] == [c.id, b.id] and page1.total_size == 3 and page1.next_page_token
    assert _reply(page1.tasks[0]) == "three"
    assert [t.id for t in page2.tasks] == [a.id] and not page2.next_page_token and not page2.tasks[0].artifacts
    assert [t.id for t in in_context.tasks] == [b.id, a.id]
    assert list(working.tasks) == [] and list(theirs.tasks) == []


def test_cancel_cancels_the_run_and_a_finished_task_is_not_cancelable(world, other_world, fake_llm, celery_worker,
                                                                      live_server_url):
    agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], name="Helper")
    AgentFactory(tenant=other_world.tenant, name="Helper")  # the same slug in the other tenant
    fake_llm.script(Delay(30, Reply("too late")))

    async def scenario():
        client = await _client(live_server_url, world.member_token, polling=True)
        foreign = await _client(live_server_url, other_world.member_token)
        try:
            [sent] = await _send(client, _message("Take your time"))
            # returnImmediately: the task as soon as its run is queued, or already started by a
            # worker that claimed it first; never its end (the model takes 30 s).
            assert sent.task.status.state in (TaskState.TASK_STATE_SUBMITTED, TaskState.TASK_STATE_WORKING)
            while not fake_llm.requests:
                await asyncio.sleep(0.05)
            with pytest.raises(TaskNotFoundError):
                await foreign.cancel_task(CancelTaskRequest(id=sent.task.id))
            cancelled = await client.cancel_task(CancelTaskRequest(id=sent.task.id))
            with pytest.raises(TaskNotCancelableError):
                await client.cancel_task(CancelTaskRequest(id=sent.task.id))
        finally:
            await client.close()
            await foreign.close()
        return cancelled

    cancelled = _run(scenario)
    assert cancelled.status.state == TaskState.TASK_STATE_CANCELED
    assert Run.all_tenants.get(pk=int(cancelled.id)).status == "cancelled"


def test_an_approval_is_input_required_and_a_message_to_the_task_answers_it(world, fake_llm, celery_worker,
                                                                            live_server_url):
    agent = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], name="Helper")
    bind_builtin(agent, "test_echo", approval_policy=[{"pattern": "*", "action": "ask"}])
    fake_llm.script(ToolCalls([("test_echo", {"text": "hi"})]), Reply("Echoed."))

    async def scenario():
        client = await _client(live_server_url, world.member_token)
        streaming = await _client(live_server_url, world.member_token, streaming=True)
        try:
            [paused] = await _send(client, _message("echo hi"))
            waiting = [e async for e in streaming.subscribe(SubscribeToTaskRequest(id=paused.task.id))]
            answered = await _send(streaming, _message("approve", task_id=paused.task.id,
                                                       context_id=paused.task.context_id))
            with pytest.raises(UnsupportedOperationError):  # terminal
                [e async for e in streaming.subscribe(SubscribeToTaskRequest(id=paused.task.id))]
        finally:
            await client.close()
            await streaming.close()
        return paused.task, waiting, answered

    paused, waiting, answered = _run(scenario)
    # subscribing to a task that waits for input: the task, and nothing to follow until someone answers
    assert [e.task.status.state for e in waiting] == [TaskState.TASK_STATE_INPUT_REQUIRED]
    assert paused.status.state == TaskState.TASK_STATE_INPUT_REQUIRED
    assert "`test_echo`" in paused.status.message.parts[0].text
    assert answered[-1].status_update.status.state == TaskState.TASK_STATE_COMPLETED
    assert answered[0].task.id == paused.id
    assert Approval.all_tenants.get(run_id=int(paused.id)).status == "approved"
    assert Run.all_tenants.get(pk=int(paused.id)).reply == "Echoed."


def test_subscribe_follows_a_working_task_to_its_end(world, fake_llm, celery_worker, live_server_url):
    agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], name="Helper")
    fake_llm.script(Delay(1.0, Reply("Done at last.")))

    async def scenario():
        client = await _client(live_server_url, world.member_token, polling=True)
        streaming = await _client(live_server_url, world.member_token, streaming=True)
        try:
            [sent] = await _send(client, _message("slowly"))
            return [e async for e in streaming.subscribe(SubscribeToTaskRequest(id=sent.task.id))]
        finally:
            await client.close()
            await streaming.close()

    events = _run(scenario)
    assert events[0].HasField("task") and events[0].task.status.state in (
        TaskState.TASK_STATE_SUBMITTED, TaskState.TASK_STATE_WORKING)
    assert events[-1].status_update.status.state == TaskState.TASK_STATE_COMPLETED
    chunks = [p.text for e in events if e.HasField("artifact_update") for p in e.artifact_update.artifact.parts]
    assert "".join(chunks) == "Done at last."


def _rpc(url: str, token: str, method: str, params: dict, version: str | None = "1.0") -> dict:
    headers = {"Authorization": f"Bearer {token}", **({"A2A-Version": version} if version else {})}
    response = httpx.post(url, headers=headers, json={"jsonrpc": "2.0", "id": 7, "method": method, "params": params},
                          timeout=30)
    assert response.status_code == 200, response.text
    return response.json()


def test_errors_have_the_specs_codes_and_the_version_is_negotiated(world, fake_llm, celery_worker, live_server_url):
    agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], name="Helper")
    fake_llm.script(Reply("old client, new server"))
    url, token = f"{live_server_url}/a2a/helper/", world.member_token
    text = {"messageId": "m1", "role": "ROLE_USER", "parts": [{"text": "hi"}]}

    def code(method, params, version="1.0"):
        return _rpc(url, token, method, params, version)["error"]["code"]

    assert code("GetTask", {"id": "424242"}) == -32001  # TaskNotFound
    assert code("NoSuchMethod", {}) == -32601
    assert code("SendMessage", {"message": {**text, "parts": [{"url": "https://x/y.png"}]}}) == -32005
    assert code("CreateTaskPushNotificationConfig", {"taskId": "1", "url": "https://x/hook"}) == -32001  # no task
    assert _rpc(url, token, "GetExtendedAgentCard", {}, "1.0")["result"]["name"] == "Helper"
    assert code("SendMessage", {"message": {"messageId": "m2", "role": "ROLE_USER", "parts": []}}) == -32602
    assert code("SendMessage", {"message": {**text, "role": "ROLE_AGENT"}}) == -32602
    assert code("SendMessage", {"message": text}, version="2.0") == -32009  # VersionNotSupported
    assert code("SendMessage", {"message": text}, version=None) == -32009  # none means 0.3: not 1.0's methods
    assert not Run.all_tenants.exists()
    legacy = _rpc(url, token, "message/send", {"message": {"messageId": "m3", "role": "user", "kind": "message",
                                                           "parts": [{"kind": "text", "text": "hi"}]}}, version=None)
    assert legacy["result"]["kind"] == "task" and legacy["result"]["status"]["state"] == "completed"
    rest = httpx.get(f"{url}rest/tasks/424242", headers={"Authorization": f"Bearer {token}", "A2A-Version": "1.0"},
                     timeout=10)
    assert rest.status_code == 404 and "TASK_NOT_FOUND" in rest.text


def test_a_foreign_token_reaches_no_task_of_ours_over_either_binding(world, other_world, fake_llm, celery_worker,
                                                                     live_server_url, tenant_walls):
    agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], name="Helper")
    agent_with_route(tenant=other_world.tenant, base_urls=[fake_llm.base_url], name="Helper")
    fake_llm.script(Delay(30, Reply("never")))

    async def scenario():
        client = await _client(live_server_url, world.member_token, polling=True)
        try:
            [sent] = await _send(client, _message("ours"))
        finally:
            await client.close()
        return sent.task

    task = _run(scenario)
    url, headers = f"{live_server_url}/a2a/helper/", {"Authorization": f"Bearer {other_world.member_token}",
                                                       "A2A-Version": "1.0"}
    for method, params in [("GetTask", {"id": task.id}), ("CancelTask", {"id": task.id}),
                           ("SubscribeToTask", {"id": task.id}),
                           ("SendMessage", {"message": {"messageId": "x", "role": "ROLE_USER", "taskId": task.id,
                                                        "parts": [{"text": "approve"}]}}),
                           ("CreateTaskPushNotificationConfig", {"taskId": task.id, "url": "https://93.184.215.14/h"}),
                           ("GetTaskPushNotificationConfig", {"taskId": task.id, "id": task.id}),
                           ("ListTaskPushNotificationConfigs", {"taskId": task.id}),
                           ("DeleteTaskPushNotificationConfig", {"taskId": task.id, "id": task.id})]:
        answer = httpx.post(url, headers=headers, json={"jsonrpc": "2.0", "id": 1, "method": method, "params": params},
                            timeout=10).json()
        assert answer["error"]["code"] == -32001, (method, answer)
    listed = httpx.get(f"{url}rest/tasks", headers=headers, timeout=10).json()
    assert listed.get("tasks", []) == []
    configs = httpx.get(f"{url}rest/tasks/{task.id}/pushNotificationConfigs", headers=headers, timeout=10)
    assert configs.status_code == 404
    assert not TaskPushConfig.all_tenants.exists()
    cancel = httpx.post(f"{url}rest/tasks/{task.id}:cancel", headers=headers, timeout=10)
    assert cancel.status_code == 404
    assert Run.all_tenants.get(pk=int(task.id)).status in ("queued", "running")
    ours = httpx.post(f"{url}rest/tasks/{task.id}:cancel", timeout=10,
                      headers={**headers, "Authorization": f"Bearer {world.member_token}"})
    assert ours.status_code == 200 and ours.json()["status"]["state"] == "TASK_STATE_CANCELED"


def test_a_question_is_answered_and_a_tool_call_denied_by_a_message_to_the_task(world, fake_llm, celery_worker,
                                                                              live_server_url):
    agent = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], name="Helper")
    bind_builtin(agent, "ask_user")
    bind_builtin(agent, "test_echo", approval_policy=[{"pattern": "*", "action": "ask"}])
    fake_llm.script(ToolCalls([("ask_user", {"question": "Which city?"})]),
                    ToolCalls([("test_echo", {"text": "Tokyo"})]), Reply("Not echoed, then."))

    async def scenario():
        client = await _client(live_server_url, world.member_token)
        try:
            [asked] = await _send(client, _message("plan a trip"))
            [confirm] = await _send(client, _message("Tokyo", task_id=asked.task.id))
            [unclear] = [None]
            try:
                await _send(client, _message("maybe?", task_id=asked.task.id))
            except Exception as exc:  # neither approve nor deny
                unclear = exc
            [denied] = await _send(client, _message("deny not now", task_id=asked.task.id))
        finally:
            await client.close()
        return asked.task, confirm.task, unclear, denied.task

    asked, confirm, unclear, denied = _run(scenario)
    assert asked.status.state == TaskState.TASK_STATE_INPUT_REQUIRED and "Which city?" in asked.status.message.parts[0].text
    assert confirm.status.state == TaskState.TASK_STATE_INPUT_REQUIRED and "`test_echo`" in confirm.status.message.parts[0].text
    assert type(unclear).__name__ == "InvalidParamsError" and "approve" in str(unclear)
    assert denied.id == asked.id and denied.status.state == TaskState.TASK_STATE_COMPLETED and _reply(denied) == (
        "Not echoed, then.")
    assert [(a.kind, a.status, a.answer) for a in Approval.all_tenants.filter(run_id=int(asked.id)).order_by("id")] == [
        ("question", "answered", "Tokyo"), ("tool_call", "denied", "not now")]


def test_over_the_throttles_a_message_is_a_429_with_retry_after(world, live_server_url, monkeypatch):
    agent_with_route(tenant=world.tenant, base_urls=["http://127.0.0.1:9/v1"], name="Helper")
    monkeypatch.setattr("sessions.api.a2a.handler.throttle_wait", lambda **kwargs: 3.2)
    headers = {"Authorization": f"Bearer {world.member_token}", "A2A-Version": "1.0"}
    body = {"message": {"messageId": "m1", "role": "ROLE_USER", "parts": [{"text": "hi"}]}}
    rpc = httpx.post(f"{live_server_url}/a2a/helper/", headers=headers, timeout=10,
                     json={"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": body})
    rest = httpx.post(f"{live_server_url}/a2a/helper/rest/message:send", headers=headers, json=body, timeout=10)
    for response in (rpc, rest):
        assert response.status_code == 429 and response.headers["Retry-After"] == "4", response.text
        assert response.json()["message"] == "Too many requests; try again later."
    assert not Run.all_tenants.exists()


def test_without_a_free_stream_slot_a_waiting_or_streamed_answer_is_a_429_and_starts_no_run(world, live_server_url,
                                                                                          monkeypatch):
    agent_with_route(tenant=world.tenant, base_urls=["http://127.0.0.1:9/v1"], name="Helper")

    async def no_slot(*, user_id):
        return None

    monkeypatch.setattr("sessions.stream_guard.stream_slot_acquire", no_slot)
    headers = {"Authorization": f"Bearer {world.member_token}", "A2A-Version": "1.0"}
    body = {"message": {"messageId": "m1", "role": "ROLE_USER", "parts": [{"text": "hi"}]}}
    for method in ("SendMessage", "SendStreamingMessage"):
        response = httpx.post(f"{live_server_url}/a2a/helper/", headers=headers, timeout=10,
                              json={"jsonrpc": "2.0", "id": 1, "method": method, "params": body})
        assert response.status_code == 429 and response.headers["Retry-After"] == "15", (method, response.text)
        assert response.json()["message"].startswith("Too many open answers")
    streamed = httpx.post(f"{live_server_url}/a2a/helper/rest/message:stream", headers=headers, json=body, timeout=10)
    assert streamed.status_code == 429
    assert not Run.all_tenants.exists()


@pytest.mark.parametrize("binding", [JSONRPC, REST])
def test_an_a2a_0_3_client_is_served_by_the_sdks_0_3_adapter(binding, world, fake_llm, celery_worker, live_server_url):
    """The a2a-sdk client picks its 0.3 transport for a card offering only 0.3 interfaces: it
    sends the 0.3 methods and paths (``message/send``, ``/v1/message:send``) and reads 0.3
    answers, which the server's 0.3 adapter turns into the same runs."""
    from a2a.client import ClientFactory
    from a2a.types.a2a_pb2 import AgentCard

    agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], name="Helper")
    fake_llm.script(Reply("Hello from 1.0."))

    async def scenario():
        http = _http(world.member_token)
        card = await A2ACardResolver(http, f"{live_server_url}/a2a/helper/").get_agent_card()
        legacy = AgentCard()
        legacy.CopyFrom(card)
        del legacy.supported_interfaces[:]
        legacy.supported_interfaces.extend(i for i in card.supported_interfaces if i.protocol_version == "0.3")
        client = ClientFactory(ClientConfig(httpx_client=http, supported_protocol_bindings=[binding],
                                            streaming=False)).create(legacy)
        try:
            [sent] = await _send(client, _message("hi"))
            got = await client.get_task(GetTaskRequest(id=sent.task.id))
        finally:
            await client.close()
            await http.aclose()
        return type(client._transport).__name__, sent.task, got

    transport, sent, got = _run(scenario)
    assert transport.startswith("Compat")
    assert sent.status.state == TaskState.TASK_STATE_COMPLETED and _reply(sent) == "Hello from 1.0."
    assert got.id == sent.id and Run.all_tenants.get(pk=int(sent.id)).reply == "Hello from 1.0."


def test_a_file_the_run_stores_is_an_artifact_streamed_and_stored_with_its_download(world, fake_llm, celery_worker,
                                                                                    live_server_url):
    agent = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], name="Helper")
    bind_builtin(agent, "test_big")
    fake_llm.script(ToolCalls([("test_big", {"chars": 60000})]), Reply("Stored it."))

    async def scenario():
        client = await _client(live_server_url, world.member_token, streaming=True)
        try:
            events = await _send(client, _message("make something big"))
            task = await client.get_task(GetTaskRequest(id=events[0].task.id))
        finally:
            await client.close()
        return events, task

    events, task = _run(scenario)
    files = [e.artifact_update.artifact for e in events
             if e.HasField("artifact_update") and e.artifact_update.artifact.artifact_id.startswith("artifact-")]
    assert len(files) == 1 and files[0].parts[0].url.startswith(f"{live_server_url}/api/v1/artifacts/")
    assert [a.artifact_id for a in task.artifacts] == ["reply", files[0].artifact_id] and _reply(task) == "Stored it."
    download = httpx.get(files[0].parts[0].url, headers={"Authorization": f"Bearer {world.member_token}"}, timeout=10)
    assert download.status_code == 200 and len(download.content) == 60000
