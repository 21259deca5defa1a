"""The provider's Back-Channel Logout (OpenID Connect Back-Channel Logout 1.0): a logout token
POSTed to ``/oidc/backchannel-logout/`` ends the platform's sessions it names, by ``sid`` or by
``sub``, and nothing else; every forged, misdirected, stale or replayed token is refused with a
400 and ends nothing. The provider is the one started in the tests (oidc_provider.py)."""

from __future__ import annotations

import time

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from django.contrib.auth import get_user_model
from django.test import Client

from sessions.stream_guard import StreamCredential, credential_valid_sync
from tenants.models import Membership
from tenants.oidc import backchannel
from tenants.oidc.backchannel import LOGOUT_EVENT
from tenants.oidc.models import OidcSession
from tenants.oidc.tests.oidc_provider import FakeOidcProvider
from tenants.oidc.tests.test_oidc_login import ALICE, me, sign_in
from tenants.scoping import system_scope

BOB = {"sub": "b0b-2", "preferred_username": "bob", "groups": ["acme-users"]}
URL = "/oidc/backchannel-logout/"


def post_logout(token: str):
    """The provider's call: server to server, no cookie, no CSRF token."""
    return Client(enforce_csrf_checks=True).post(URL, {"logout_token": token})


def signed_in(sso: FakeOidcProvider, claims: dict) -> tuple[Client, str]:
    """A browser signed in as ``claims``, and the provider's ``sid`` of that login."""
    client = Client()
    assert sign_in(client, sso, claims).status_code == 302
    assert me(client) is not None
    return client, sso.sids[-1]


def test_a_logout_token_with_a_sid_ends_that_session_only(sso, world):
    first, first_sid = signed_in(sso, ALICE)
    second, _ = signed_in(sso, ALICE)
    bob, _ = signed_in(sso, BOB)
    assert OidcSession.objects.filter(identity__subject=ALICE["sub"]).count() == 2

    answer = post_logout(sso.logout_token(sub=ALICE["sub"], sid=first_sid))
    assert answer.status_code == 200
    assert "no-store" in answer["Cache-Control"]
    assert me(first) is None
    assert me(second) is not None and me(bob) is not None
    assert OidcSession.objects.filter(identity__subject=ALICE["sub"]).count() == 1


def test_a_logout_token_with_only_a_sub_ends_every_session_of_that_user(sso, world):
    first, _ = signed_in(sso, ALICE)
    second, _ = signed_in(sso, ALICE)
    bob, _ = signed_in(sso, BOB)

    assert post_logout(sso.logout_token(sub=ALICE["sub"])).status_code == 200
    assert me(first) is None and me(second) is None
    assert me(bob) is not None
    assert not OidcSession.objects.filter(identity__subject=ALICE["sub"]).exists()


def test_a_logout_token_with_only_a_sid_ends_that_session(sso, world):
    first, first_sid = signed_in(sso, ALICE)
    second, _ = signed_in(sso, ALICE)
    assert post_logout(sso.logout_token(sid=first_sid)).status_code == 200
    assert me(first) is None and me(second) is not None


def test_an_open_event_stream_of_the_ended_session_fails_its_next_credential_check(sso, world):
    """Streams re-check their login session every ``AUTH_RECHECK_SECONDS``; the ended session
    no longer authenticates, so the stream closes (4401 / ``stream_closed``)."""
    client, sid = signed_in(sso, ALICE)
    user = get_user_model().objects.get(username="alice")
    with system_scope():
        membership = Membership.all_tenants.get(user=user)
    credential = StreamCredential(user_id=user.pk, membership_id=membership.pk, session_key=client.session.session_key)
    assert credential_valid_sync(credential)
    assert post_logout(sso.logout_token(sub=ALICE["sub"], sid=sid)).status_code == 200
    assert not credential_valid_sync(credential)


def test_the_ended_sessions_are_announced_to_their_open_streams(sso, world, monkeypatch,
                                                               django_capture_on_commit_callbacks):
    """Once committed, each ended session's end is published (its streams close at once, not at
    their next check: sessions/tests/test_event_reader.py shows the reader's side)."""
    announced: list[str] = []
    monkeypatch.setattr("tenants.oidc.services.session_ended_publish",
                        lambda *, session_key: announced.append(session_key))
    first, _ = signed_in(sso, ALICE)
    second, _ = signed_in(sso, ALICE)
    keys = {first.session.session_key, second.session.session_key}
    with django_capture_on_commit_callbacks(execute=True):
        assert post_logout(sso.logout_token(sub=ALICE["sub"])).status_code == 200
    assert set(announced) == keys and len(announced) == 2


def test_a_session_signed_out_here_leaves_nothing_to_end(sso, world):
    client, sid = signed_in(sso, ALICE)
    assert client.post("/api/v1/auth/logout/").status_code == 200
    assert not OidcSession.objects.exists()
    # The provider's later logout token for it is still a success: nothing was open.
    assert post_logout(sso.logout_token(sub=ALICE["sub"], sid=sid)).status_code == 200


def _now() -> int:
    return int(time.time())


REFUSED = {
    "signed with a key not in the JWKS": lambda sso: sso.logout_token(
        sub=ALICE["sub"], key=rsa.generate_private_key(public_exponent=65537, key_size=2048)),
    "unsigned (alg none)": lambda sso: jwt.encode(
        {"iss": sso.issuer, "aud": sso.client_id, "iat": _now(), "jti": "x1", "sub": ALICE["sub"],
         "events": {LOGOUT_EVENT: {}}}, None, algorithm="none", headers={"kid": sso.kid}),
    "HS256 with the client secret": lambda sso: sso.logout_token(
        sub=ALICE["sub"], key=sso.client_secret, algorithm="HS256"),
    "for another client": lambda sso: sso.logout_token(sub=ALICE["sub"], changes={"aud": "other-client"}),
    "several audiences, azp another": lambda sso: sso.logout_token(
        sub=ALICE["sub"], changes={"aud": [sso.client_id, "other"], "azp": "other"}),
    "from another issuer": lambda sso: sso.logout_token(sub=ALICE["sub"], changes={"iss": "https://evil.example"}),
    "without events": lambda sso: sso.logout_token(sub=ALICE["sub"], changes={"events": None}),
    "with another event": lambda sso: sso.logout_token(
        sub=ALICE["sub"], changes={"events": {"http://schemas.openid.net/event/other": {}}}),
    "with a nonce": lambda sso: sso.logout_token(sub=ALICE["sub"], changes={"nonce": "n-0"}),
    "expired": lambda sso: sso.logout_token(sub=ALICE["sub"], changes={"iat": _now() - 900, "exp": _now() - 600}),
    "issued too long ago": lambda sso: sso.logout_token(sub=ALICE["sub"], changes={"iat": _now() - 900, "exp": None}),
    "without iat": lambda sso: sso.logout_token(sub=ALICE["sub"], changes={"iat": None}),
    "without jti": lambda sso: sso.logout_token(sub=ALICE["sub"], changes={"jti": None}),
    "naming neither sub nor sid": lambda sso: sso.logout_token(),
    "an empty sub": lambda sso: sso.logout_token(sub=""),
    "typed as an access token": lambda sso: sso.logout_token(sub=ALICE["sub"], headers={"typ": "at+jwt"}),
    "not a JWT": lambda sso: "not-a-token",
}


@pytest.mark.parametrize("attack", sorted(REFUSED))
def test_a_forged_stale_or_misdirected_logout_token_is_refused_and_ends_nothing(sso, world, attack):
    client, _ = signed_in(sso, ALICE)
    answer = post_logout(REFUSED[attack](sso))
    assert answer.status_code == 400, answer.content
    assert answer.json()["error"] == "invalid_request" and answer.json()["error_description"]
    assert me(client) is not None
    assert OidcSession.objects.count() == 1


def test_an_id_token_is_never_taken_for_a_logout_token(sso, world):
    """Cross-JWT confusion: the session's own ID token (signed by the provider, same iss, aud
    and sub) has no logout event and a nonce, so it ends nothing."""
    client, _ = signed_in(sso, ALICE)
    id_token = client.session["oidc_id_token"]
    assert jwt.decode(id_token, options={"verify_signature": False})["sub"] == ALICE["sub"]
    assert post_logout(id_token).status_code == 400
    assert me(client) is not None


def test_a_replayed_logout_token_is_refused(sso, world):
    token = sso.logout_token(sub=ALICE["sub"])
    assert post_logout(token).status_code == 200
    client, _ = signed_in(sso, ALICE)  # signed in again after the logout
    answer = post_logout(token)  # captured, replayed
    assert answer.status_code == 400 and "replayed" in answer.json()["error_description"]
    assert me(client) is not None


def test_a_key_rotated_at_the_provider_is_fetched(sso, world, monkeypatch):
    client, _ = signed_in(sso, ALICE)
    assert post_logout(sso.logout_token(sub=BOB["sub"])).status_code == 200  # the JWKS is now cached
    sso.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    sso.kid = "test-key-2"
    monkeypatch.setattr(backchannel, "JWKS_REFRESH_SECONDS", 0.0)
    assert post_logout(sso.logout_token(sub=ALICE["sub"])).status_code == 200
    assert me(client) is None


def test_the_wrong_requests_are_answered_not_errors(sso, world, settings):
    assert Client().post(URL, {}).status_code == 400
    assert Client().get(URL).status_code == 405
    settings.OIDC_OP_JWKS_ENDPOINT = "http://127.0.0.1:9/jwks"  # nothing listens there
    answer = post_logout(sso.logout_token(sub=ALICE["sub"]))
    assert answer.status_code == 503 and answer.json()["error"] == "temporarily_unavailable"
    settings.OIDC_ENABLED = False
    assert post_logout(sso.logout_token(sub=ALICE["sub"])).status_code == 404
