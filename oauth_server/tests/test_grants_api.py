"""The user's OAuth grants in Settings: ``GET /api/v1/oauth-grants/`` lists those of the
request's membership, ``DELETE /api/v1/oauth-grants/<id>/`` revokes one (its tokens stop at
once); a grant of another user or another tenant is the same 404 as a missing one."""

from __future__ import annotations

import pytest
from django.test import Client

from oauth_server.models import McpGrant
from oauth_server.tests import flow
from tenants.resolution import caller_resolve
from tenants.services import membership_create

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("all_tenants_scope")]

AGENTS = "http://testserver/mcp/agents/"
NOT_FOUND = {"message": "OAuth grant not found.", "extra": {}}


def test_the_grant_is_listed_and_revoking_it_stops_its_tokens(world):
    client_id, token = flow.tokens_for(Client(), world.member_membership, resource=AGENTS, name="My IDE")
    api = world.client()
    [listed] = api.get("/api/v1/oauth-grants/").json()
    assert listed == {
        **listed,
        "client_name": "My IDE",
        "client_id": client_id,
        "resource": AGENTS,
        "scope": "mcp",
        "tenant": "Acme",
    }
    assert caller_resolve(raw_token=token["access_token"], resource_path="/mcp/agents/") is not None
    assert api.delete(f"/api/v1/oauth-grants/{listed['id']}/").status_code == 204
    assert caller_resolve(raw_token=token["access_token"], resource_path="/mcp/agents/") is None
    refreshed = Client().post(
        "/oauth/token/",
        {
            "grant_type": "refresh_token",
            "refresh_token": token["refresh_token"],
            "client_id": client_id,
            "resource": AGENTS,
        },
    )
    assert refreshed.status_code == 400 and refreshed.json()["error"] == "invalid_grant"
    assert api.get("/api/v1/oauth-grants/").json() == []


def test_another_users_and_another_tenants_grants_are_hidden(world, other_world):
    flow.tokens_for(Client(), other_world.member_membership, resource=AGENTS)
    flow.tokens_for(Client(), world.admin_membership, resource=AGENTS)
    theirs = McpGrant.all_tenants.get(membership=other_world.member_membership)
    admins = McpGrant.all_tenants.get(membership=world.admin_membership)
    api = world.client()
    assert api.get("/api/v1/oauth-grants/").json() == []
    for grant in (theirs, admins):
        response = api.delete(f"/api/v1/oauth-grants/{grant.pk}/")
        assert response.status_code == 404 and response.json() == NOT_FOUND
    assert api.delete("/api/v1/oauth-grants/999999/").json() == NOT_FOUND
    assert McpGrant.all_tenants.count() == 2


def test_a_deleted_membership_takes_its_tokens_along(world, other_world):
    second = membership_create(tenant=other_world.tenant, user=world.member)
    client_id, token = flow.tokens_for(Client(), second, resource=AGENTS)
    assert caller_resolve(raw_token=token["access_token"], resource_path="/mcp/agents/").membership.pk == second.pk
    second.delete()
    assert caller_resolve(raw_token=token["access_token"], resource_path="/mcp/agents/") is None
    refreshed = Client().post(
        "/oauth/token/",
        {
            "grant_type": "refresh_token",
            "refresh_token": token["refresh_token"],
            "client_id": client_id,
            "resource": AGENTS,
        },
    )
    assert refreshed.status_code == 400


def test_an_inactive_user_and_an_expired_token_are_refused(world, settings):
    _, token = flow.tokens_for(Client(), world.member_membership, resource=AGENTS)
    world.member.is_active = False
    world.member.save()
    assert caller_resolve(raw_token=token["access_token"], resource_path="/mcp/agents/") is None
    world.member.is_active = True
    world.member.save()
    from django.utils import timezone
    from oauth2_provider.models import AccessToken

    AccessToken.objects.update(expires=timezone.now())
    assert caller_resolve(raw_token=token["access_token"], resource_path="/mcp/agents/") is None


def test_a_client_deleting_its_registration_takes_its_grants_along(world, no_scope):
    """RFC 7592 DELETE by the client itself, outside any tenant scope (as in production): its
    grants go (row-level security hides them from Django's own cascade: the receiver deletes
    them in the system scope) and the answer is no error."""
    from tenants.scoping import system_scope

    client = Client()
    client.force_login(world.member)
    registered = flow.register(client)
    codes = flow.pkce()
    answer = flow.redirect_query(
        flow.consent(
            client,
            flow.authorize_params(registered["client_id"], AGENTS, codes.challenge),
            membership_id=world.member_membership.pk,
        )
    )
    token = flow.exchange(
        client, client_id=registered["client_id"], code=answer["code"], verifier=codes.verifier, resource=AGENTS
    ).json()
    with system_scope():
        assert McpGrant.all_tenants.filter(token_family__isnull=False).count() == 1
    deleted = Client().delete(
        f"/oauth/register/{registered['client_id']}/",
        HTTP_AUTHORIZATION=f"Bearer {registered['registration_access_token']}",
    )
    assert deleted.status_code == 204, deleted.content
    with system_scope():
        assert not McpGrant.all_tenants.exists()
        assert caller_resolve(raw_token=token["access_token"], resource_path="/mcp/agents/") is None
