"""The authorization server through HTTP (Django's test client): metadata documents, dynamic
registration and its rate limit, the consent page (login, tenant choice), PKCE S256 only, the
resource binding, refresh rotation, and the attacks the MCP authorization spec names."""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

import pytest
from django.test import Client

from oauth_server.models import McpGrant
from oauth_server.tests import flow
from tenants.resolution import caller_resolve
from tenants.services import membership_create

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("all_tenants_scope")]

BASE = "http://testserver"
KNOWLEDGE = f"{BASE}/mcp/knowledge/"
AGENTS = f"{BASE}/mcp/agents/"


@pytest.fixture
def client() -> Client:
    return Client()


def test_authorization_server_metadata(client):
    doc = client.get("/.well-known/oauth-authorization-server").json()
    assert doc["issuer"] == BASE
    assert doc["authorization_endpoint"] == f"{BASE}/oauth/authorize/"
    assert doc["token_endpoint"] == f"{BASE}/oauth/token/"
    assert doc["registration_endpoint"] == f"{BASE}/oauth/register/"
    assert doc["code_challenge_methods_supported"] == ["S256"]
    assert doc["response_types_supported"] == ["code"]
    assert doc["grant_types_supported"] == ["authorization_code", "refresh_token"]
    assert doc["client_id_metadata_document_supported"] is True
    assert doc["authorization_response_iss_parameter_supported"] is True
    assert "none" in doc["token_endpoint_auth_methods_supported"]


@pytest.mark.parametrize("mount", ["/mcp/agents/", "/mcp/knowledge/"])
@pytest.mark.parametrize("slash", ["", "/"])
def test_protected_resource_metadata_per_endpoint(client, mount, slash):
    doc = client.get(f"/.well-known/oauth-protected-resource{mount.rstrip('/')}{slash}").json()
    assert doc["resource"] == f"{BASE}{mount}"
    assert doc["authorization_servers"] == [BASE]
    assert doc["scopes_supported"] == ["mcp"]
    assert doc["bearer_methods_supported"] == ["header"]


def test_protected_resource_metadata_of_something_else_is_404(client):
    assert client.get("/.well-known/oauth-protected-resource/api/v1/").status_code == 404


def test_issuer_setting_names_everything(client, settings):
    settings.OAUTH_ISSUER = "https://agents.example.com"
    doc = client.get("/.well-known/oauth-protected-resource/mcp/agents/").json()
    assert doc == {
        **doc,
        "resource": "https://agents.example.com/mcp/agents/",
        "authorization_servers": ["https://agents.example.com"],
    }


def test_the_whole_flow_binds_the_token_to_one_membership_and_one_resource(client, world):
    client_id, token = flow.tokens_for(client, world.member_membership, resource=KNOWLEDGE)
    assert token["token_type"] == "Bearer" and token["scope"] == "mcp" and token["refresh_token"]
    caller = caller_resolve(raw_token=token["access_token"], resource_path="/mcp/knowledge/")
    assert caller is not None and caller.membership.pk == world.member_membership.pk and caller.user == world.member
    # the audience is /mcp/knowledge/ only
    assert caller_resolve(raw_token=token["access_token"], resource_path="/mcp/agents/") is None
    assert caller_resolve(raw_token=token["access_token"]) is None  # not at the REST API
    grant = McpGrant.all_tenants.get()
    assert (grant.membership_id, grant.resource, grant.application.client_id) == (
        world.member_membership.pk,
        KNOWLEDGE,
        client_id,
    )


def test_a_user_with_two_tenants_chooses_one(client, world, other_world):
    second = membership_create(tenant=other_world.tenant, user=world.member)
    client.force_login(world.member)
    registered = flow.register(client)
    codes = flow.pkce()
    params = flow.authorize_params(registered["client_id"], AGENTS, codes.challenge)
    page = client.get("/oauth/authorize/", params).content.decode()
    assert "Acme" in page and "Globex" in page and "Test IDE" in page and AGENTS in page
    answer = flow.redirect_query(flow.consent(client, params, membership_id=second.pk))
    token = flow.exchange(
        client, client_id=registered["client_id"], code=answer["code"], verifier=codes.verifier, resource=AGENTS
    ).json()
    caller = caller_resolve(raw_token=token["access_token"], resource_path="/mcp/agents/")
    assert caller.membership.pk == second.pk and caller.membership.tenant == other_world.tenant


def test_another_users_membership_cannot_be_chosen(client, world, other_world):
    client.force_login(world.member)
    registered = flow.register(client)
    params = flow.authorize_params(registered["client_id"], AGENTS, flow.pkce().challenge)
    response = flow.consent(client, params, membership_id=other_world.member_membership.pk)
    assert response.status_code == 200 and "Choose the tenant" in response.content.decode()
    assert not McpGrant.all_tenants.exists()


def test_login_is_required_first(client, world):
    """A signed-out user is sent to the chat app's sign-in with ``next`` = the authorization
    request; signed in there (its API, as the app does), that request shows the consent page."""
    registered = flow.register(client)
    params = flow.authorize_params(registered["client_id"], AGENTS, flow.pkce().challenge)
    response = client.get("/oauth/authorize/", params)
    assert response.status_code == 302 and response["Location"].startswith("/?next=/oauth/authorize/")
    back_to = parse_qs(urlsplit(response["Location"]).query)["next"][0]
    assert parse_qs(urlsplit(back_to).query)["client_id"] == [registered["client_id"]]
    assert client.get(response["Location"]).status_code == 200  # the chat app (its sign-in form)
    signed_in = client.post(
        "/api/v1/auth/login/", {"username": "acme-user", "password": "pw-user-123"}, content_type="application/json"
    )
    assert signed_in.status_code == 200, signed_in.content
    assert client.get(back_to).status_code == 200  # the consent page, now


def test_deny_redirects_with_access_denied(client, world):
    client.force_login(world.member)
    registered = flow.register(client)
    params = flow.authorize_params(registered["client_id"], AGENTS, flow.pkce().challenge)
    answer = flow.redirect_query(flow.consent(client, params, membership_id=world.member_membership.pk, allow=False))
    assert answer["error"] == "access_denied" and answer["state"] == "st-1"
    assert not McpGrant.all_tenants.exists()


def test_refresh_rotates_and_the_old_refresh_token_is_dead(client, world):
    client_id, first = flow.tokens_for(client, world.member_membership, resource=AGENTS)
    second = flow.refresh(client, client_id=client_id, refresh_token=first["refresh_token"], resource=AGENTS)
    assert second.status_code == 200, second.content
    second = second.json()
    assert second["refresh_token"] != first["refresh_token"] and second["access_token"] != first["access_token"]
    assert caller_resolve(raw_token=second["access_token"], resource_path="/mcp/agents/").membership.pk == (
        world.member_membership.pk
    )
    assert caller_resolve(raw_token=first["access_token"], resource_path="/mcp/agents/") is None
    again = flow.refresh(client, client_id=client_id, refresh_token=first["refresh_token"], resource=AGENTS)
    assert again.status_code == 400 and again.json()["error"] == "invalid_grant"
    # reuse of a revoked refresh token revoked its whole family (REFRESH_TOKEN_REUSE_PROTECTION)
    assert caller_resolve(raw_token=second["access_token"], resource_path="/mcp/agents/") is None


def test_pkce_plain_is_refused(client, world):
    client.force_login(world.member)
    registered = flow.register(client)
    codes = flow.pkce()
    params = flow.authorize_params(registered["client_id"], AGENTS, codes.verifier, method="plain")
    answer = flow.redirect_query(client.get("/oauth/authorize/", params))
    assert answer["error"] == "invalid_request" and "S256" in answer["error_description"]
    # no challenge at all
    params = {k: v for k, v in params.items() if not k.startswith("code_challenge")}
    answer = flow.redirect_query(client.get("/oauth/authorize/", params))
    assert answer["error"] == "invalid_request"


def test_a_wrong_code_verifier_is_refused(client, world):
    client.force_login(world.member)
    registered = flow.register(client)
    codes = flow.pkce()
    params = flow.authorize_params(registered["client_id"], AGENTS, codes.challenge)
    answer = flow.redirect_query(flow.consent(client, params, membership_id=world.member_membership.pk))
    wrong = flow.exchange(
        client, client_id=registered["client_id"], code=answer["code"], verifier=flow.pkce().verifier, resource=AGENTS
    )
    assert wrong.status_code == 400 and wrong.json()["error"] == "invalid_grant"


def test_the_token_request_cannot_widen_the_resource(client, world):
    client.force_login(world.member)
    registered = flow.register(client)
    codes = flow.pkce()
    params = flow.authorize_params(registered["client_id"], KNOWLEDGE, codes.challenge)
    answer = flow.redirect_query(flow.consent(client, params, membership_id=world.member_membership.pk))
    widened = flow.exchange(
        client, client_id=registered["client_id"], code=answer["code"], verifier=codes.verifier, resource=AGENTS
    )
    assert widened.status_code == 400 and widened.json()["error"] == "invalid_target"


@pytest.mark.parametrize(
    "resource", ["", "https://elsewhere.example/mcp/agents/", f"{BASE}/api/v1/", f"{AGENTS} {KNOWLEDGE}"]
)
def test_a_resource_that_is_not_one_of_our_endpoints_is_refused(client, world, resource):
    client.force_login(world.member)
    registered = flow.register(client)
    params = flow.authorize_params(registered["client_id"], resource, flow.pkce().challenge)
    if not resource:
        del params["resource"]
    answer = flow.redirect_query(client.get("/oauth/authorize/", params))
    assert answer["error"] == "invalid_target"


def test_a_redirect_uri_not_registered_is_refused_without_redirecting(client, world):
    client.force_login(world.member)
    registered = flow.register(client)
    params = flow.authorize_params(
        registered["client_id"], AGENTS, flow.pkce().challenge, redirect_uri="https://attacker.example/callback"
    )
    response = client.get("/oauth/authorize/", params)
    assert response.status_code == 400
    assert "attacker.example" not in response.get("Location", "")
    assert "invalid_request" in response.content.decode() or "Mismatching redirect" in response.content.decode()


def test_registration_is_rate_limited_per_address(client, settings):
    settings.API_THROTTLE_RATES = {**settings.API_THROTTLE_RATES, "oauth_register.ip": "2/hour"}
    flow.register(client)
    flow.register(client)
    refused = client.post(
        "/oauth/register/", data='{"redirect_uris": ["http://127.0.0.1:1/cb"]}', content_type="application/json"
    )
    assert refused.status_code == 429 and int(refused["Retry-After"]) >= 1
    assert refused.json()["error"] == "too_many_requests"


def test_a_cimd_client_id_on_a_private_address_is_refused(client, world):
    client.force_login(world.member)
    params = flow.authorize_params("https://10.20.30.40/oauth/client.json", AGENTS, flow.pkce().challenge)
    response = client.get("/oauth/authorize/", params)
    assert response.status_code == 400
    assert "invalid_client" in response.content.decode() or "invalid_request" in response.content.decode()
    assert not response.has_header("Location")


def test_a_tampered_consent_post_is_a_400_not_a_500(client, world):
    client.force_login(world.member)
    registered = flow.register(client)
    codes = flow.pkce()
    params = flow.authorize_params(registered["client_id"], AGENTS, codes.challenge)
    fields = flow.hidden_fields(client.get("/oauth/authorize/", params).content.decode())
    for change in (
        {"client_id": "no-such-client"},
        {"redirect_uri": "https://attacker.example/cb"},
        {"code_challenge_method": "plain"},
        {"resource": "https://elsewhere.example/mcp/agents/"},
        {"redirect_uri": "https://attacker.example/cb", "code_challenge_method": "plain"},
    ):
        response = client.post(
            "/oauth/authorize/", {**fields, **change, "allow": "on", "membership": str(world.member_membership.pk)}
        )
        assert response.status_code in (302, 400), (change, response.status_code)
        assert "attacker.example" not in response.get("Location", "")
        if response.status_code == 302:
            assert "code=" not in response["Location"], change
    assert not McpGrant.all_tenants.exists()


def test_the_consent_page_lets_its_form_lead_to_the_registered_redirect_uri_only(client, world):
    client.force_login(world.member)
    registered = flow.register(client)
    page = client.get(
        "/oauth/authorize/", flow.authorize_params(registered["client_id"], AGENTS, flow.pkce().challenge)
    )
    policy = page["Content-Security-Policy"]
    assert "form-action 'self' http://127.0.0.1:33418;" in policy + ";"
    assert "frame-ancestors 'none'" in policy  # the rest of the site's policy stays
    elsewhere = client.get(
        "/oauth/authorize/",
        flow.authorize_params(
            registered["client_id"], AGENTS, flow.pkce().challenge, redirect_uri="https://attacker.example/cb"
        ),
    )
    assert "attacker.example" not in elsewhere.get("Content-Security-Policy", "")
