"""A2A push notifications (sessions/api/a2a/push.py, delivered by automations/outbound.py) and
the authenticated extended card, with the official a2a-sdk client against the live server and a
receiver on 127.0.0.1 (allowed by the test settings' OUTBOUND_ALLOWED_CIDRS, as for the outbound
webhooks' tests): the four config operations, a config given with SendMessage, the notification
of a task's end and of its pause for approval (its token and Authorization, the task in the
body), retries with backoff, a private address refused, another tenant's token refused."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import threading
import time
import uuid
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import jwt
import pytest
from a2a.client import ClientConfig, create_client
from a2a.types.a2a_pb2 import (
    AuthenticationInfo,
    DeleteTaskPushNotificationConfigRequest,
    GetExtendedAgentCardRequest,
    GetTaskPushNotificationConfigRequest,
    ListTaskPushNotificationConfigsRequest,
    Message,
    Part,
    Role,
    SendMessageConfiguration,
    SendMessageRequest,
    StreamResponse,
    TaskPushNotificationConfig,
    TaskState,
)
from a2a.utils.errors import InvalidParamsError, TaskNotFoundError
from django.utils import timezone
from google.protobuf.json_format import ParseDict

from agents.tests.factories import agent_with_route, bind_builtin
from automations.apps import run_event_to_a2a_push
from automations.models import DeliveryStatus, WebhookDelivery
from automations.outbound import delivery_attempt, task_push_emit
from llm.testing import Reply, ToolCalls
from sessions.models import ChatSession, Run, TaskPushConfig
from sessions.runs.records import run_event_observers
from tenants.scoping import tenant_scope

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("all_tenants_scope")]


class Receiver:
    """A local push-notification receiver: records each POST (headers, JSON body), answers the
    next of ``statuses`` (then 200)."""

    def __init__(self) -> None:
        self.requests: list[tuple[dict[str, str], dict]] = []
        self.bodies: list[bytes] = []
        """Each request's body as it came (for the signature)."""
        self.statuses: list[int] = []
        self.arrived = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                with receiver.arrived:
                    receiver.requests.append(({k.lower(): v for k, v in self.headers.items()}, json.loads(body)))
                    receiver.bodies.append(body)
                    receiver.arrived.notify_all()
                self.send_response(receiver.statuses.pop(0) if receiver.statuses else 200)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/a2a-hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def wait_for(self, count: int, timeout: float = 15.0) -> list[tuple[dict[str, str], dict]]:
        """The first ``count`` requests, once they arrived (fails after ``timeout`` seconds)."""
        with self.arrived:
            assert self.arrived.wait_for(lambda: len(self.requests) >= count, timeout), self.requests
            return self.requests[:count]


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.server.shutdown()


def _message(text: str, *, task_id: str = "", context_id: str = "",
             push: TaskPushNotificationConfig | None = None) -> SendMessageRequest:
    request = SendMessageRequest(message=Message(message_id=str(uuid.uuid4()), role=Role.ROLE_USER,
                                                 parts=[Part(text=text)], task_id=task_id, context_id=context_id))
    if push is not None:
        request.configuration.CopyFrom(SendMessageConfiguration(task_push_notification_config=push))
    return request


async def _client(base: str, token: str, slug: str = "helper"):
    http = httpx.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=30)
    return await create_client(f"{base}/a2a/{slug}/", client_config=ClientConfig(
        httpx_client=http, supported_protocol_bindings=["JSONRPC"], streaming=False))


def _task(body: dict):
    return ParseDict(body, StreamResponse()).task


def test_push_configs_over_the_sdk_client_and_notifications_of_the_end_and_the_pause(
        world, other_world, fake_llm, celery_worker, live_server_url, receiver):
    agent = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], name="Helper")
    bind_builtin(agent, "test_echo", approval_policy=[{"pattern": "*", "action": "ask"}])
    agent_with_route(tenant=other_world.tenant, base_urls=[fake_llm.base_url], name="Helper")
    fake_llm.script(ToolCalls([("test_echo", {"text": "hi"})]), Reply("Echoed."))
    push = TaskPushNotificationConfig(id="mine", url=receiver.url, token="task-token-1",
                                      authentication=AuthenticationInfo(scheme="Bearer", credentials="receiver-secret"))

    async def scenario():
        client = await _client(live_server_url, world.member_token)
        foreign = await _client(live_server_url, other_world.member_token)
        try:
            [paused] = await _send(client, _message("echo hi", push=push))
            task_id = paused.task.id
            second = await client.create_task_push_notification_config(
                TaskPushNotificationConfig(task_id=task_id, url=receiver.url + "?second"))
            got = await client.get_task_push_notification_config(
                GetTaskPushNotificationConfigRequest(task_id=task_id, id="mine"))
            listed = await client.list_task_push_notification_configs(
                ListTaskPushNotificationConfigsRequest(task_id=task_id))
            for call in (
                foreign.create_task_push_notification_config(TaskPushNotificationConfig(task_id=task_id,
                                                                                        url=receiver.url)),
                foreign.list_task_push_notification_configs(ListTaskPushNotificationConfigsRequest(task_id=task_id)),
                foreign.get_task_push_notification_config(GetTaskPushNotificationConfigRequest(task_id=task_id,
                                                                                              id="mine")),
                foreign.delete_task_push_notification_config(
                    DeleteTaskPushNotificationConfigRequest(task_id=task_id, id="mine")),
            ):
                with pytest.raises(TaskNotFoundError):
                    await call
            await client.delete_task_push_notification_config(
                DeleteTaskPushNotificationConfigRequest(task_id=task_id, id=second.id))
            after_delete = await client.list_task_push_notification_configs(
                ListTaskPushNotificationConfigsRequest(task_id=task_id))
            [answered] = await _send(client, _message("approve", task_id=task_id))
        finally:
            await client.close()
            await foreign.close()
        return paused.task, second, got, listed, after_delete, answered.task

    paused, second, got, listed, after_delete, answered = asyncio.run(scenario())
    assert paused.status.state == TaskState.TASK_STATE_INPUT_REQUIRED
    assert (second.id, second.task_id) == (paused.id, paused.id)  # no id: the task's id
    assert (got.id, got.url, got.token, got.authentication.scheme, got.authentication.credentials) == (
        "mine", receiver.url, "task-token-1", "Bearer", "receiver-secret")
    assert [c.id for c in listed.configs] == ["mine", paused.id]
    assert [c.id for c in after_delete.configs] == ["mine"]
    assert answered.status.state == TaskState.TASK_STATE_COMPLETED
    # two state changes (input-required, then completed), each one notification to the config left
    (pause_headers, pause_body), (end_headers, end_body) = receiver.wait_for(2)
    assert len(receiver.requests) == 2  # the deleted config got none
    assert _task(pause_body).status.state == TaskState.TASK_STATE_INPUT_REQUIRED
    assert "`test_echo`" in _task(pause_body).status.message.parts[0].text
    ended = _task(end_body)
    assert (ended.id, ended.status.state, ended.artifacts[0].parts[0].text) == (
        paused.id, TaskState.TASK_STATE_COMPLETED, "Echoed.")
    for headers in (pause_headers, end_headers):
        assert headers["x-a2a-notification-token"] == "task-token-1"
        assert headers["authorization"] == "Bearer receiver-secret"
        assert headers["content-type"] == "application/json"
    assert pause_headers["webhook-id"] != end_headers["webhook-id"]
    row = TaskPushConfig.all_tenants.get(config_id="mine")
    assert "task-token-1" not in row.token_encrypted and "receiver-secret" not in row.auth_credentials_encrypted
    deliveries = WebhookDelivery.all_tenants.filter(push_config=row).order_by("pk")
    deadline = time.monotonic() + 10  # the receiver answered; the attempt's row commits just after
    while deliveries.exclude(status="delivered").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [(d.event_type, d.status) for d in deliveries] == [("a2a.task", "delivered")] * 2


def test_a_config_set_once_the_client_saw_the_pause_gets_the_end_only(
        world, fake_llm, celery_worker, live_server_url, receiver):
    """The notifications of a state change go to the configs the task had at that change,
    however late the worker's observers run: a client that adds a config as soon as it sees
    the pause must not get the pause on it (the slow observer makes the late run certain)."""
    agent = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], name="Helper")
    bind_builtin(agent, "test_echo", approval_policy=[{"pattern": "*", "action": "ask"}])
    fake_llm.script(ToolCalls([("test_echo", {"text": "hi"})]), Reply("Echoed."))
    index = run_event_observers.index(run_event_to_a2a_push)

    def slow_observer(*args):
        time.sleep(0.5)
        run_event_to_a2a_push(*args)

    slow_observer.wants = run_event_to_a2a_push.wants
    run_event_observers[index] = slow_observer

    async def scenario():
        client = await _client(live_server_url, world.member_token)
        try:
            [paused] = await _send(client, _message("echo hi", push=TaskPushNotificationConfig(
                id="first", url=receiver.url + "?first")))
            await client.create_task_push_notification_config(
                TaskPushNotificationConfig(task_id=paused.task.id, id="later", url=receiver.url + "?later"))
            [answered] = await _send(client, _message("approve", task_id=paused.task.id))
        finally:
            await client.close()
        return answered.task

    try:
        answered = asyncio.run(scenario())
    finally:
        run_event_observers[index] = run_event_to_a2a_push
    assert answered.status.state == TaskState.TASK_STATE_COMPLETED
    receiver.wait_for(3)
    deliveries = WebhookDelivery.all_tenants.order_by("pk")
    assert sorted((d.push_config.config_id, d.payload["task"]["status"]["state"]) for d in deliveries) == [
        ("first", "TASK_STATE_COMPLETED"), ("first", "TASK_STATE_INPUT_REQUIRED"), ("later", "TASK_STATE_COMPLETED")]


async def _send(client, request):
    return [event async for event in client.send_message(request)]


REFUSED_URLS = ("http://10.0.0.7/hook", "http://169.254.169.254/latest/meta-data", "ftp://x/y")
"""A private address, the cloud metadata service, a scheme that is not http(s)."""


def test_a_push_url_the_outbound_rules_refuse_is_invalid_params_and_starts_no_run(
        world, fake_llm, celery_worker, live_server_url):
    agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], name="Helper")
    fake_llm.script(Reply("ok"))

    async def scenario():
        client = await _client(live_server_url, world.member_token)
        refused = []
        try:
            for url in REFUSED_URLS:
                with pytest.raises(InvalidParamsError) as with_message:
                    await _send(client, _message("hello", push=TaskPushNotificationConfig(url=url)))
                refused.append(with_message.value)
            started = await asyncio.to_thread(Run.all_tenants.count)
            [done] = await _send(client, _message("hello"))
            for url in REFUSED_URLS:
                with pytest.raises(InvalidParamsError) as created:
                    await client.create_task_push_notification_config(
                        TaskPushNotificationConfig(task_id=done.task.id, url=url))
                refused.append(created.value)
        finally:
            await client.close()
        return started, refused

    started, refused = asyncio.run(scenario())
    assert started == 0  # the refused configs started no run
    assert len(refused) == 6 and all("url:" in str(error) for error in refused)
    assert "private" in str(refused[0]) and "metadata" in str(refused[1]).lower()
    assert not TaskPushConfig.all_tenants.exists()


def _completed_run_with_a_push(world, receiver) -> tuple[Run, int]:
    """A completed run of the world's member with one push config to ``receiver``, and the id of
    the delivery its end's notification made (not attempted yet)."""
    agent = agent_with_route(tenant=world.tenant, base_urls=["http://127.0.0.1:9/v1"], name="Helper")
    session = ChatSession.all_tenants.create(tenant=world.tenant, agent=agent, user=world.member)
    run = Run.all_tenants.create(tenant=world.tenant, session=session, user=world.member, input="hi",
                                 status="completed", reply="Done.")
    with tenant_scope(world.tenant.pk):
        TaskPushConfig.objects.create(tenant=world.tenant, run=run, config_id="c", url=receiver.url,
                                      base_url="http://testserver")
        [pk] = task_push_emit(tenant_id=world.tenant.pk, run_id=run.pk)
    return run, pk


@pytest.mark.django_db  # not transactional: attempts are made here, none is queued for a worker
def test_a_failed_notification_is_retried_with_backoff_and_the_same_webhook_id(world, receiver):
    run, pk = _completed_run_with_a_push(world, receiver)
    receiver.statuses = [503]
    now = timezone.now()
    with tenant_scope(world.tenant.pk):
        assert delivery_attempt(delivery_id=pk, now=now) == DeliveryStatus.PENDING
        retry_at = WebhookDelivery.objects.get(pk=pk).next_attempt_at
        assert now + timedelta(seconds=30) <= retry_at < now + timedelta(seconds=90)
        assert delivery_attempt(delivery_id=pk, now=retry_at) == DeliveryStatus.DELIVERED
    assert len({headers["webhook-id"] for headers, _ in receiver.requests}) == 1 and len(receiver.requests) == 2
    assert _task(receiver.requests[1][1]).status.state == TaskState.TASK_STATE_COMPLETED
    assert "x-a2a-notification-token" not in receiver.requests[0][0]  # no token in this config


def test_the_extended_card_is_for_the_tenants_callers_and_lists_the_tools(world, other_world, live_server_url):
    agent = agent_with_route(tenant=world.tenant, base_urls=["http://127.0.0.1:9/v1"], name="Helper",
                             description="Answers.", a2a_public=True)
    bind_builtin(agent, "test_echo", approval_policy=[{"pattern": "*", "action": "ask"}])

    async def scenario():
        client = await _client(live_server_url, world.member_token)
        try:
            extended = await client.get_extended_agent_card(GetExtendedAgentCardRequest())
        finally:
            await client.close()
        async with httpx.AsyncClient(timeout=10) as http:
            anonymous = await http.get(f"{live_server_url}/a2a/helper/rest/extendedAgentCard",
                                       headers={"A2A-Version": "1.0"})
            card = await http.get(f"{live_server_url}/a2a/helper/.well-known/agent-card.json")
            foreign = await http.post(f"{live_server_url}/a2a/helper/", headers={
                "Authorization": f"Bearer {other_world.member_token}", "A2A-Version": "1.0"},
                json={"jsonrpc": "2.0", "id": 1, "method": "GetExtendedAgentCard", "params": {}})
        return extended, anonymous, card, foreign

    extended, anonymous, card, foreign = asyncio.run(scenario())
    assert card.status_code == 200
    capabilities = card.json()["capabilities"]
    assert capabilities["pushNotifications"] is True and capabilities["extendedAgentCard"] is True
    assert len(card.json()["skills"]) == 1
    assert anonymous.status_code == 401 and anonymous.headers["WWW-Authenticate"].startswith("Bearer")
    assert foreign.status_code == 404  # another tenant's token: no agent 'helper' there
    assert extended.name == "Helper" and extended.version == "draft"
    assert [s.id for s in extended.skills] == ["helper", f"builtin-{agent.bindings.get().pk}"]
    assert "person's approval" in extended.skills[1].description and "model turns per task" in (
        extended.skills[0].description)


def _verified(token: str, body: bytes, jwks: dict, *, audience: str) -> dict:
    """What a receiver does (A2A's JWT + JWKS flow): the key named by the JWT's ``kid`` from the
    published set, the ES256 signature, ``iss``/``aud``/``exp``, then the body's SHA-256 against
    the ``request_body_sha256`` claim. Raises ``jwt.InvalidTokenError`` or ``AssertionError``."""
    kid = jwt.get_unverified_header(token)["kid"]
    [key] = [jwt.PyJWK(jwk) for jwk in jwks["keys"] if jwk["kid"] == kid]
    claims = jwt.decode(token, key.key, algorithms=["ES256"], audience=audience, issuer="http://testserver",
                        options={"require": ["iss", "aud", "iat", "exp", "jti"]})
    assert claims["request_body_sha256"] == hashlib.sha256(body).hexdigest(), "the body was changed"
    return claims


@pytest.mark.django_db  # not transactional: the attempt is made here
def test_a_notification_is_signed_with_the_published_key_set(world, receiver, client):
    run, pk = _completed_run_with_a_push(world, receiver)
    with tenant_scope(world.tenant.pk):
        assert delivery_attempt(delivery_id=pk) == DeliveryStatus.DELIVERED
    [(headers, _)] = receiver.requests
    [body] = receiver.bodies
    from sessions.api.a2a.cards import SIGNED_PUSH_EXTENSION, agent_card

    card = agent_card(base_url="http://testserver", slug="helper", name="Helper", description="", tenant_name="T")
    [extension] = [e for e in card.capabilities.extensions if e.uri == SIGNED_PUSH_EXTENSION]
    jwks_uri = extension.params["jwksUri"]
    assert jwks_uri == "http://testserver/.well-known/jwks.json"
    published = client.get(jwks_uri.removeprefix("http://testserver"))  # anonymous
    assert published.status_code == 200
    jwks = published.json()
    token = headers["x-a2a-notification-signature"]
    assert headers["authorization"] == f"Bearer {token}"  # the config sets no Authorization of its own

    claims = _verified(token, body, jwks, audience=receiver.url)
    assert claims["taskId"] == str(run.pk) and claims["exp"] - claims["iat"] == 300
    assert jwt.get_unverified_header(token)["alg"] == "ES256"

    tampered = body.replace(b"Done.", b"Paid.")
    assert tampered != body
    with pytest.raises(AssertionError, match="the body was changed"):
        _verified(token, tampered, jwks, audience=receiver.url)
    head, payload, signature = token.split(".")
    forged_claims = {**claims, "request_body_sha256": hashlib.sha256(tampered).hexdigest()}
    forged = ".".join([head, base64.urlsafe_b64encode(json.dumps(forged_claims).encode()).rstrip(b"=").decode(),
                       signature])
    with pytest.raises(jwt.InvalidSignatureError):
        _verified(forged, tampered, jwks, audience=receiver.url)
    with pytest.raises(jwt.InvalidAudienceError):
        _verified(token, body, jwks, audience="https://elsewhere.example/hook")
