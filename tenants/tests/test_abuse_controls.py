"""Abuse controls (issue 23, M8 and L1): login lockout on both login endpoints, API throttles
per user and per tenant, and a CSRF-checked login."""

from __future__ import annotations

import uuid

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from rest_framework.test import APIClient

from agents.tests.factories import AgentFactory
from tenants.models import AuditEvent, Role
from tenants.services import membership_create

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("all_tenants_scope")]


@pytest.fixture
def lockout(settings):
    settings.AXES_FAILURE_LIMIT = 3
    settings.AXES_COOLOFF_TIME = 0.25  # hours: 15 minutes


@pytest.fixture
def fresh_user(world):
    """A member with a username no other test uses (lockout counters are per username + IP)."""
    user = get_user_model().objects.create_user(username=f"lock-{uuid.uuid4().hex[:10]}", password="right-pass-123",
                                                is_staff=True)
    membership_create(tenant=world.tenant, user=user, role=Role.ADMIN)
    return user


def _api_login(client, username, password, **extra):
    return client.post("/api/v1/auth/login/", {"username": username, "password": password}, format="json", **extra)


def test_api_login_locks_out_after_repeated_failures_even_with_the_right_password(lockout, fresh_user):
    client = APIClient()
    for _ in range(2):
        resp = _api_login(client, fresh_user.username, "wrong")
        assert resp.status_code == 400
    resp = _api_login(client, fresh_user.username, "wrong")
    assert resp.status_code == 429  # the third failure locks the pair out
    resp = _api_login(client, fresh_user.username, "right-pass-123")
    assert resp.status_code == 429
    assert int(resp["Retry-After"]) == 900
    assert set(resp.json()) == {"message", "extra"} and "Too many failed logins" in resp.json()["message"]
    # another address is not locked out (username + IP)
    ok = _api_login(APIClient(), fresh_user.username, "right-pass-123", REMOTE_ADDR="10.1.2.3")
    assert ok.status_code == 200, ok.content
    events = AuditEvent.all_tenants.filter(object_id=str(fresh_user.pk))
    assert events.filter(action="login_failed").count() == 3
    assert events.filter(action="login_locked_out").count() == 1


def test_a_successful_login_resets_the_failure_count(lockout, fresh_user):
    client = APIClient()
    for _ in range(2):
        assert _api_login(client, fresh_user.username, "wrong").status_code == 400
    assert _api_login(client, fresh_user.username, "right-pass-123").status_code == 200
    for _ in range(2):
        assert _api_login(client, fresh_user.username, "wrong").status_code == 400
    assert _api_login(client, fresh_user.username, "right-pass-123").status_code == 200


def test_console_login_locks_out_after_repeated_failures(lockout, fresh_user):
    client = Client()
    for _ in range(3):
        resp = client.post("/admin/login/", {"username": fresh_user.username, "password": "wrong"})
        assert resp.status_code in (200, 429)
    resp = client.post("/admin/login/?next=/admin/", {"username": fresh_user.username, "password": "right-pass-123"})
    assert resp.status_code == 429 and "_auth_user_id" not in client.session
    assert int(resp["Retry-After"]) > 0


def test_failed_login_of_an_unknown_user_is_recorded_without_a_tenant(lockout):
    name = f"ghost-{uuid.uuid4().hex[:8]}"
    assert _api_login(APIClient(), name, "whatever").status_code == 400
    event = AuditEvent.all_tenants.get(action="login_failed", detail__username=name)
    assert event.tenant_id is None and event.ip_address == "127.0.0.1" and event.actor_id is None


# --- throttles ---------------------------------------------------------------------------------


def _rates(settings, **rates):
    base = dict.fromkeys(settings.API_THROTTLE_RATES, "")
    base.update({key.replace("__", "."): value for key, value in rates.items()})
    settings.API_THROTTLE_RATES = base


def test_token_creation_is_throttled_per_user(world, settings):
    _rates(settings, tokens__user="3/minute")
    client = world.client()
    for _ in range(3):
        assert client.post("/api/v1/tokens/", {"name": "t"}, format="json").status_code == 201
    resp = client.post("/api/v1/tokens/", {"name": "t"}, format="json")
    assert resp.status_code == 429
    assert 0 < int(resp["Retry-After"]) <= 60
    assert set(resp.json()) == {"message", "extra"}
    assert client.get("/api/v1/tokens/").status_code == 200  # reading is not throttled
    # another user of the same tenant has a budget of their own
    assert world.client(admin=True).post("/api/v1/tokens/", {"name": "t"}, format="json").status_code == 201


def test_token_creation_is_throttled_per_tenant(world, other_world, settings):
    _rates(settings, tokens__tenant="3/minute")
    for client in (world.client(), world.client(admin=True), world.client()):
        assert client.post("/api/v1/tokens/", {}, format="json").status_code == 201
    assert world.client(admin=True).post("/api/v1/tokens/", {}, format="json").status_code == 429
    assert other_world.client().post("/api/v1/tokens/", {}, format="json").status_code == 201  # another tenant


def test_message_posting_is_throttled(world, settings, no_enqueue):
    _rates(settings, messages__user="3/minute")
    agent = AgentFactory(tenant=world.tenant)
    client = world.client()
    session = client.post("/api/v1/sessions/", {"agent": agent.pk}, format="json").json()
    for i in range(3):
        resp = client.post(f"/api/v1/sessions/{session['id']}/messages/", {"content": f"m{i}"}, format="json")
        assert resp.status_code == 201, resp.content
    resp = client.post(f"/api/v1/sessions/{session['id']}/messages/", {"content": "one more"}, format="json")
    assert resp.status_code == 429 and "Retry-After" in resp
    from sessions.models import Run

    assert Run.all_tenants.filter(session_id=session["id"]).count() == 3  # the throttled one made no run


def test_runs_are_throttled_per_tenant(world, settings, no_enqueue):
    _rates(settings, runs__tenant="2/minute")
    agent = AgentFactory(tenant=world.tenant)
    codes = []
    for client in (world.client(), world.client(admin=True), world.client()):
        session = client.post("/api/v1/sessions/", {"agent": agent.pk}, format="json").json()
        codes.append(client.post(f"/api/v1/sessions/{session['id']}/messages/", {"content": "hi"},
                                 format="json").status_code)
    assert codes == [201, 201, 429]


# --- login CSRF (L1) ---------------------------------------------------------------------------


def test_login_refuses_a_cross_site_post(world):
    client = APIClient(enforce_csrf_checks=True)
    body = {"username": world.member.username, "password": "pw-user-123"}
    resp = client.post("/api/v1/auth/login/", body, format="json")
    assert resp.status_code == 403 and resp.json()["message"].startswith("CSRF Failed")
    assert "_auth_user_id" not in client.session

    client.get("/")  # the SPA's page sets the csrftoken cookie
    token = client.cookies["csrftoken"].value
    evil = client.post("/api/v1/auth/login/", body, format="json", HTTP_X_CSRFTOKEN=token,
                       HTTP_ORIGIN="https://evil.example")
    assert evil.status_code == 403

    ok = client.post("/api/v1/auth/login/", body, format="json", HTTP_X_CSRFTOKEN=token)
    assert ok.status_code == 200, ok.content
    assert ok.json()["tenant"]["slug"] == "acme"


def test_lockout_on_the_running_asgi_app(lockout, fresh_user, live_server_url):
    """The served app (uvicorn, async middleware): the same 429 and body."""
    import httpx

    with httpx.Client(base_url=live_server_url, timeout=30) as client:
        client.get("/")
        headers = {"X-CSRFToken": client.cookies["csrftoken"]}
        codes = [client.post("/api/v1/auth/login/", json={"username": fresh_user.username, "password": "wrong"},
                             headers=headers).status_code for _ in range(3)]
        assert codes == [400, 400, 429]
        resp = client.post("/api/v1/auth/login/", json={"username": fresh_user.username, "password": "right-pass-123"},
                           headers=headers)
        assert resp.status_code == 429 and int(resp.headers["Retry-After"]) == 900
        assert set(resp.json()) == {"message", "extra"}


def test_login_attempts_are_throttled_per_client_address(world, settings):
    _rates(settings, login__ip="3/minute")
    client, address = APIClient(), f"10.7.{uuid.uuid4().int % 250}.{uuid.uuid4().int % 250}"
    codes = [_api_login(client, f"someone-{i}", "x", REMOTE_ADDR=address).status_code for i in range(3)]
    assert codes == [400, 400, 400]  # three usernames: no lockout, but ...
    resp = _api_login(client, world.member.username, "pw-user-123", REMOTE_ADDR=address)
    assert resp.status_code == 429 and "Retry-After" in resp  # ... the address has spent its budget
    assert _api_login(APIClient(), world.member.username, "pw-user-123", REMOTE_ADDR="10.9.9.9").status_code == 200
