"""Single sign-on end to end: the platform's login through an OpenID Connect provider started in
the test (tenants/oidc/tests/oidc_provider.py, on 127.0.0.1), driven through Django's test
client: the start (state, nonce, PKCE), the provider's redirect, the callback (code exchange,
ID token checks), the account, its memberships from the rules, and every refusal as a page."""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

import pytest
import requests
from django.contrib.auth import get_user_model
from django.test import Client

from tenants.models import Membership, Role
from tenants.oidc.models import OidcIdentity
from tenants.oidc.provider import discovery_forget
from tenants.oidc.tests.oidc_provider import FakeOidcProvider
from tenants.scoping import system_scope
from tenants.services import membership_create

ALICE = {"sub": "f3a1-alice", "preferred_username": "alice", "email": "alice@example.com",
         "given_name": "Alice", "family_name": "Liddell", "groups": ["acme-users"]}


def sign_in(client: Client, provider: FakeOidcProvider, claims: dict, next_path: str = "/"):
    """The whole flow as a browser follows it; returns the callback's response."""
    provider.user = claims
    start = client.get("/oidc/authenticate/", {"next": next_path})
    assert start.status_code == 302, start.content
    at_provider = requests.get(start["Location"], allow_redirects=False, timeout=5)
    assert at_provider.status_code == 302, at_provider.text
    back = urlsplit(at_provider.headers["Location"])
    assert back.path == "/oidc/callback/"
    return client.get(f"{back.path}?{back.query}")


def memberships(username: str) -> dict[str, str]:
    with system_scope():
        return dict(Membership.all_tenants.filter(user__username=username)
                    .values_list("tenant__slug", "role"))


def me(client: Client) -> dict | None:
    answer = client.get("/api/v1/auth/me/")
    return answer.json() if answer.status_code == 200 else None


def test_first_login_creates_the_user_and_membership_a_later_one_follows_the_rules(sso, world, other_world):
    client = Client()
    answer = sign_in(client, sso, ALICE, next_path="/#/settings")
    assert answer.status_code == 302 and answer["Location"] == "/#/settings"
    request = sso.authorization_requests[-1]
    assert request["code_challenge_method"] == "S256" and request["code_challenge"] and request["nonce"]
    assert request["state"] and "openid" in request["scope"].split()
    assert sso.token_requests[-1]["code_verifier"]  # PKCE: the verifier went to the token endpoint

    user = get_user_model().objects.get(username="alice")
    assert (user.email, user.first_name, user.is_staff, user.has_usable_password()) == (
        "alice@example.com", "Alice", False, False)
    assert memberships("alice") == {"acme": Role.MEMBER}
    assert me(client)["tenant"]["slug"] == "acme"

    # An invitation's membership in a tenant no rule names (globex) is left alone by every login.
    with system_scope():
        membership_create(tenant=other_world.tenant, user=user, role=Role.MEMBER)
    client.logout()
    answer = sign_in(client, sso, {**ALICE, "groups": ["acme-users", "acme-admins"], "email": "a@example.org"})
    assert answer.status_code == 302 and answer["Location"] == "/"
    user.refresh_from_db()
    assert get_user_model().objects.filter(username__startswith="alice").count() == 1  # the same account
    assert memberships("alice") == {"acme": Role.ADMIN, "globex": Role.MEMBER}  # the highest matching role
    assert user.is_staff and user.email == "a@example.org"  # an admin somewhere: the console

    # No rule matches any more: the managed tenant's membership goes, the invitation's stays.
    client.logout()
    answer = sign_in(client, sso, {**ALICE, "groups": []})
    assert answer.status_code == 302 and memberships("alice") == {"globex": Role.MEMBER}
    user.refresh_from_db()
    assert not user.is_staff
    assert me(client)["tenant"]["slug"] == "globex"

    # Without it too: the "no access" page, and no session.
    with system_scope():
        Membership.all_tenants.filter(user=user).delete()
    client.logout()
    answer = sign_in(client, sso, {**ALICE, "groups": ["someone-elses"]})
    assert answer.status_code == 403 and b"No access" in answer.content
    assert me(client) is None


def test_a_user_matching_no_rule_gets_the_no_access_page_and_no_account(sso, world):
    client = Client()
    answer = sign_in(client, sso, {"sub": "bob-1", "preferred_username": "bob", "groups": ["initech-users", "x"]})
    assert answer.status_code == 403
    assert b"No access" in answer.content and b"no access to any tenant" in answer.content
    assert not get_user_model().objects.filter(username="bob").exists()
    assert not OidcIdentity.objects.exists()
    assert me(client) is None


def test_a_local_account_is_never_signed_in_through_the_provider(sso, world):
    """Attack: the provider's user names a local account's username and e-mail (the library's own
    backend matches accounts by e-mail); a superuser's account linked to the provider is refused."""
    User = get_user_model()
    local = User.objects.create_user(username="alice", email="alice@example.com", password="pw-local-123",
                                     is_staff=True, is_superuser=True)
    client = Client()
    answer = sign_in(client, sso, ALICE)
    assert answer.status_code == 302
    assert me(client)["user"]["username"] == "alice-2"  # a new account of its own
    local.refresh_from_db()
    assert local.check_password("pw-local-123") and local.is_superuser and memberships("alice") == {}
    assert not OidcIdentity.objects.filter(user=local).exists()

    # An operator made the SSO account a superuser: the provider no longer signs it in.
    User.objects.filter(username="alice-2").update(is_superuser=True)
    client = Client()
    answer = sign_in(client, sso, ALICE)
    assert answer.status_code == 403 and b"Operator account" in answer.content
    assert me(client) is None


@pytest.mark.parametrize("attack", ["wrong_audience", "wrong_signature", "wrong_issuer", "expired", "unsigned",
                                    "wrong_nonce", "no_sub", "azp_of_another_client", "userinfo_of_another_sub"])
def test_a_forged_or_misdirected_id_token_is_refused(sso, world, attack):
    """Attack: each token the provider hands over is wrong in one way; no session, no account."""
    changes = {
        "wrong_audience": {"aud": "another-client"},
        "wrong_issuer": {"iss": "https://evil.example"},
        "expired": {"exp": 1_000_000_000, "iat": 999_999_000},
        "wrong_nonce": {"nonce": "replayed-nonce"},
        "no_sub": {"sub": None},
        "azp_of_another_client": {"aud": [sso.client_id, "another-client"], "azp": "another-client"},
    }
    sso.id_token_changes = changes.get(attack, {})
    sso.sign_with_other_key = attack == "wrong_signature"
    sso.unsigned = attack == "unsigned"
    if attack == "userinfo_of_another_sub":
        sso.userinfo_changes = {"sub": "someone-else"}
    client = Client()
    answer = sign_in(client, sso, ALICE)
    assert answer.status_code == 400 and b"Sign-in failed" in answer.content
    assert me(client) is None
    assert not get_user_model().objects.filter(username="alice").exists()


def test_a_replayed_callback_and_a_denied_login_are_pages_not_errors(sso, world):
    client = Client()
    sso.user = ALICE
    start = client.get("/oidc/authenticate/")
    callback = urlsplit(requests.get(start["Location"], allow_redirects=False, timeout=5).headers["Location"])
    assert client.get(f"{callback.path}?{callback.query}").status_code == 302
    client.logout()
    replay = client.get(f"{callback.path}?{callback.query}")  # the state was used: refused
    assert replay.status_code == 400 and me(client) is None

    sso.deny = True
    answer = sign_in(client, sso, ALICE)
    assert answer.status_code == 400 and b"Sign-in cancelled" in answer.content
    other = Client()  # a callback in a browser that never started a login
    query = parse_qs(callback.query)
    assert other.get("/oidc/callback/", {"code": "x", "state": query["state"][0]}).status_code == 400


def test_an_unreachable_provider_is_a_page(settings, world):
    from conftest import free_port

    settings.OIDC_ENABLED = True
    settings.OIDC_ISSUER = f"http://127.0.0.1:{free_port()}"
    settings.OIDC_RP_CLIENT_ID = "agent-platform"
    settings.OIDC_TIMEOUT = 2.0
    discovery_forget()
    answer = Client().get("/oidc/authenticate/")
    assert answer.status_code == 503 and b"Sign-in service unavailable" in answer.content
    discovery_forget()


def test_the_login_pages_offer_the_provider_only_when_on(sso, world, settings):
    page = Client().get("/")
    assert '"sso": {"name": "Keycloak", "url": "/oidc/authenticate/"}' in page.content.decode()
    console = Client().get("/admin/login/?next=/admin/")
    assert b"Sign in with Keycloak" in console.content and b"/oidc/authenticate/?next=/admin/" in console.content
    # Password logins still work (the backend ignores them).
    assert Client().post("/api/v1/auth/login/", {"username": "acme-user", "password": "pw-user-123"},
                         content_type="application/json").status_code == 200

    settings.OIDC_ENABLED = False
    assert '"sso": null' in Client().get("/").content.decode()
    assert b"Sign in with" not in Client().get("/admin/login/").content
    assert Client().get("/oidc/authenticate/").status_code == 404
    assert Client().get("/oidc/callback/?code=x&state=y").status_code == 404


def test_a_session_started_through_the_provider_ends_when_single_sign_on_is_switched_off(sso, world, settings):
    client = Client()
    assert sign_in(client, sso, ALICE).status_code == 302
    assert me(client) is not None
    settings.OIDC_ENABLED = False
    assert me(client) is None


def test_signing_out_of_a_single_sign_on_session_signs_out_of_the_provider(sso, world):
    """RP-Initiated Logout: the logout API answers the provider's end-session URL with this
    session's ID token as the hint; the console's logged-out page sends the browser there."""
    import jwt

    client = Client()
    assert sign_in(client, sso, ALICE).status_code == 302
    answer = client.post("/api/v1/auth/logout/")
    assert answer.status_code == 200 and me(client) is None
    url = urlsplit(answer.json()["provider_logout_url"])
    assert f"{url.scheme}://{url.netloc}{url.path}" == f"{sso.issuer}/logout"
    query = {name: values[0] for name, values in parse_qs(url.query).items()}
    assert query["client_id"] == sso.client_id and query["post_logout_redirect_uri"] == "http://testserver/"
    hint = jwt.decode(query["id_token_hint"], options={"verify_signature": False})
    assert (hint["sub"], hint["iss"]) == (ALICE["sub"], sso.issuer)
    back = requests.get(answer.json()["provider_logout_url"], allow_redirects=False, timeout=5)
    assert back.status_code == 302 and back.headers["Location"] == "http://testserver/"
    assert sso.logout_requests[-1]["id_token_hint"] == query["id_token_hint"]

    # The console: its logout page sends the browser to the provider too.
    console = Client()
    sign_in(console, sso, {**ALICE, "groups": ["acme-admins"]})
    page = console.post("/admin/logout/").content.decode()
    assert f'content="0; url={sso.issuer}/logout?id_token_hint=' in page
    assert 'data-testid="provider-logout"' in page


def test_a_password_session_or_a_provider_without_end_session_signs_out_here_only(sso, world, settings):
    client = Client()
    client.force_login(world.member)
    answer = client.post("/api/v1/auth/logout/")
    assert answer.status_code == 200 and answer.json() == {"provider_logout_url": None}

    sso.end_session_enabled = False
    discovery_forget()
    client = Client()
    assert sign_in(client, sso, ALICE).status_code == 302
    assert client.post("/api/v1/auth/logout/").json() == {"provider_logout_url": None}
    assert me(client) is None


def test_next_may_only_be_a_path_of_this_site(sso, world):
    client = Client()
    answer = sign_in(client, sso, ALICE, next_path="https://evil.example/phish")
    assert answer.status_code == 302 and answer["Location"] == "/"


def test_logins_changes_are_audited_and_a_tenants_last_owner_stays(sso, world):
    from tenants.models import AuditEvent
    from tenants.oidc.provider import oidc_rules
    from tenants.oidc.services import oidc_login_sync

    assert sign_in(Client(), sso, {**ALICE, "realm_access": {"roles": ["acme-owners"]}}).status_code == 302
    assert memberships("alice") == {"acme": Role.OWNER}
    with system_scope():
        event = AuditEvent.all_tenants.get(action="create", object_type="tenants.membership",
                                           tenant=world.tenant, detail__via="oidc")
        assert event.source == "auth" and event.changes["role"] == {"to": "owner"}
        assert AuditEvent.all_tenants.filter(action="create", object_type="oidc.oidcidentity").count() == 1
    # alice is acme's only owner: a login whose rules say member leaves her owner (logged).
    outcome = oidc_login_sync(issuer=sso.issuer, claims=ALICE, rules=oidc_rules())
    assert outcome.user.username == "alice" and memberships("alice") == {"acme": Role.OWNER}


def test_starts_of_a_login_count_against_the_address_login_budget(sso, world, settings):
    settings.API_THROTTLE_RATES = {**settings.API_THROTTLE_RATES, "login.ip": "2/minute"}
    client = Client(REMOTE_ADDR="198.51.100.7")
    assert [client.get("/oidc/authenticate/").status_code for _ in range(2)] == [302, 302]
    answer = client.get("/oidc/authenticate/")
    assert answer.status_code == 429 and int(answer["Retry-After"]) >= 1 and b"Too many sign-ins" in answer.content
    assert Client(REMOTE_ADDR="198.51.100.8").get("/oidc/authenticate/").status_code == 302
