"""One tenant resolution for REST, WebSocket and SSE (issue 24, item 7): the same caller with
the same choice lands in the same tenant through every entry point, and a choice made through
one is the default of the others."""

from __future__ import annotations

import pytest
from asgiref.sync import async_to_sync
from django.contrib.auth.models import AnonymousUser
from django.test import RequestFactory
from rest_framework.test import APIClient

from agent_platform import ws_auth
from sessions.sse import _authorize
from tenants.resolution import caller_resolve
from tenants.services import membership_create, tenant_create

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("all_tenants_scope")]


@pytest.fixture
def two_tenant_user(world, other_world):
    """other_world's member, also a member of world's tenant (joined later)."""
    user = other_world.member
    membership_create(tenant=world.tenant, user=user)
    return user


def _ws(user, query: str = ""):
    scope = {"type": "websocket", "user": user, "query_string": query.encode()}
    return async_to_sync(ws_auth._resolve)(scope)


def test_every_entry_point_follows_the_users_last_pick(two_tenant_user, world, other_world):
    user = two_tenant_user
    assert caller_resolve(user=user).membership.tenant_id == other_world.tenant.pk, "the oldest membership"
    _, _, tenant_id, _ = _ws(user)
    assert tenant_id == other_world.tenant.pk

    client = APIClient()
    client.force_login(user)
    assert client.get("/api/v1/auth/me/", HTTP_X_TENANT=world.tenant.slug).json()["tenant"]["slug"] == world.tenant.slug
    _, _, tenant_id, _ = _ws(user)
    assert tenant_id == world.tenant.pk, "a pick made through REST is the WebSocket's default"

    _, _, tenant_id, _ = _ws(user, f"tenant={other_world.tenant.slug}")
    assert tenant_id == other_world.tenant.pk, "?tenant= picks on a WebSocket"
    assert client.get("/api/v1/auth/me/").json()["tenant"]["slug"] == other_world.tenant.slug, (
        "and that pick is REST's default")


def test_a_token_decides_alone_and_a_bad_token_is_nobody(world, other_world, two_tenant_user):
    user, membership_id, tenant_id, token_id = _ws(AnonymousUser(), f"token={world.member_token}&tenant={other_world.tenant.slug}")
    assert (user, membership_id, tenant_id) == (world.member, world.member_membership.pk, world.tenant.pk)
    assert token_id is not None
    user, membership_id, tenant_id, token_id = _ws(AnonymousUser(), "token=ap_not-a-token")
    assert not user.is_authenticated and (membership_id, tenant_id, token_id) == (None, None, None)
    assert caller_resolve(raw_token="ap_not-a-token") is None


def test_a_tenant_the_user_does_not_belong_to_is_no_membership(two_tenant_user):
    stranger = tenant_create(name="Initech", slug="initech")
    caller = caller_resolve(user=two_tenant_user, tenant_slug=stranger.slug)
    assert caller is not None and caller.membership is None
    _, membership_id, tenant_id, _ = _ws(two_tenant_user, "tenant=initech")
    assert (membership_id, tenant_id) == (None, None)


def test_sse_resolves_through_the_same_function(two_tenant_user, world, other_world, monkeypatch):
    """The SSE entry point asks caller_resolve with X-Tenant (or ?tenant=) and the cookie's user;
    a malformed bearer header is a 401, not a crash."""
    import sessions.sse as sse

    seen = []
    real = sse.caller_resolve

    def spy(**kwargs):
        caller = real(**kwargs)
        seen.append(caller.membership.tenant_id if caller and caller.membership else None)
        return caller

    monkeypatch.setattr(sse, "caller_resolve", spy)
    monkeypatch.setattr(sse, "get_user", lambda request: two_tenant_user)
    request = RequestFactory().get("/api/v1/sessions/999999/events", HTTP_X_TENANT=world.tenant.slug)
    request.session = type("S", (), {"session_key": "k"})()
    assert async_to_sync(_authorize)(request, 999999) == (404, "Session not found.")
    assert seen == [world.tenant.pk]
    request = RequestFactory().get(f"/api/v1/sessions/999999/events?tenant={other_world.tenant.slug}")
    request.session = type("S", (), {"session_key": "k"})()
    async_to_sync(_authorize)(request, 999999)
    assert seen[-1] == other_world.tenant.pk
    bad = RequestFactory().get("/api/v1/sessions/999999/events", HTTP_AUTHORIZATION="Bearer   ")
    assert async_to_sync(_authorize)(bad, 999999) == (401, "Invalid or revoked token.")
