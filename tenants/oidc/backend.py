"""The authentication backend of single sign-on: mozilla-django-oidc's, made strict.

What the library does (``OIDCAuthenticationBackend.authenticate``): exchanges the
authorization code at the token endpoint (with the PKCE ``code_verifier`` and the client's
credentials), checks the ID token's signature against the provider's JWKS (or, for HS*, the
client secret) and its ``nonce`` against the one the login started with.

What this subclass changes:

- The ID token is also checked for ``iss`` (exactly ``OIDC_ISSUER``), ``aud`` (holds
  ``OIDC_CLIENT_ID``; with several audiences ``azp`` must be it), ``exp``, ``iat`` and ``sub``
  (required), and ``nbf`` when present (OpenID Connect Core 1.0, §3.1.3.7). The library checks
  none of these: it decodes with ``verify_aud`` off and no issuer. An unsigned token
  (``alg: none``) is never accepted.
- The UserInfo response (when the provider has that endpoint) must name the same ``sub``
  (Core §5.3.4); its claims are added to the ID token's.
- The account is found by the identity link (``iss`` + ``sub``) and the memberships follow
  the claim mapping rules (:func:`tenants.oidc.services.oidc_login_sync`), not the library's
  match by e-mail address, which would sign in a local account with the same e-mail.
- It acts only for the callback view's call (``nonce`` among the credentials), and only
  while ``OIDC_ENABLED``: every password login also asks every backend, and must neither
  reach the provider nor wait for it. Its sessions end when single sign-on is switched off.

A refused login leaves the reason on the request (``request.oidc_refusal``, a
:class:`~tenants.oidc.services.Refusal` value) for the callback's page.
"""

from __future__ import annotations

import logging
from typing import Any

import jwt
from django.contrib.auth import get_user_model
from django.contrib.auth.backends import ModelBackend
from django.core.exceptions import SuspiciousOperation
from django.http import HttpRequest
from mozilla_django_oidc.auth import OIDCAuthenticationBackend

from tenants.oidc.provider import oidc_enabled, oidc_issuer, oidc_rules, oidc_setting
from tenants.oidc.services import oidc_login_sync

logger = logging.getLogger(__name__)

REQUIRED_CLAIMS = ["iss", "aud", "exp", "iat", "sub"]
"""Claims an ID token must carry (OpenID Connect Core 1.0, §2)."""
LEEWAY_SECONDS = 60
"""Clock skew allowed on ``exp``, ``iat`` and ``nbf``."""


def authorized_party_refusal(claims: dict[str, Any], client_id: str) -> str | None:
    """Why a token verified for ``aud`` is still not this client's, or None: with several
    audiences, or an ``azp`` at all, ``azp`` must be ``client_id`` (OpenID Connect Core 1.0,
    §3.1.3.7, steps 4-5; Back-Channel Logout 1.0, §2.6, for logout tokens)."""
    audiences = claims["aud"] if isinstance(claims["aud"], list) else [claims["aud"]]
    authorized_party = claims.get("azp")
    if (len(audiences) > 1 or authorized_party is not None) and authorized_party != client_id:
        return f"azp {authorized_party!r} is not this client"
    return None


_PROTOCOL_CLAIMS = frozenset({"iss", "sub", "aud", "exp", "iat", "nbf", "nonce", "azp", "at_hash", "auth_time"})


class OidcBackend(OIDCAuthenticationBackend):
    """Signs in a user who completed the provider's authorization code flow (see the module)."""

    get_settings = staticmethod(oidc_setting)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # Not the library's __init__: it reads the provider's endpoints (maybe from discovery,
        # over HTTP) when the backend is made, which Django does for every password login too.
        # They are read by configure(), for the callback's login only.
        self.UserModel = get_user_model()

    def configure(self) -> None:
        """Read the endpoints and the client's settings, as the library's ``__init__`` would.

        Raises:
            OidcUnavailable: an endpoint left to discovery and discovery failed.
        """
        self.OIDC_OP_TOKEN_ENDPOINT = self.get_settings("OIDC_OP_TOKEN_ENDPOINT")
        self.OIDC_OP_USER_ENDPOINT = self.get_settings("OIDC_OP_USER_ENDPOINT")
        self.OIDC_OP_JWKS_ENDPOINT = self.get_settings("OIDC_OP_JWKS_ENDPOINT")
        self.OIDC_RP_CLIENT_ID = self.get_settings("OIDC_RP_CLIENT_ID")
        self.OIDC_RP_CLIENT_SECRET = self.get_settings("OIDC_RP_CLIENT_SECRET", "")
        self.OIDC_RP_SIGN_ALGO = self.get_settings("OIDC_RP_SIGN_ALGO", "RS256")
        self.OIDC_RP_IDP_SIGN_KEY = None

    def authenticate(self, request: HttpRequest | None, **kwargs: Any) -> Any:
        """The user of the callback's ``code``, or None (see the module's docstring).

        Raises:
            OidcUnavailable, requests.RequestException, SuspiciousOperation, jwt.PyJWTError:
                the provider is unreachable or answered wrongly, or a token was refused; the
                callback view turns each into a page.
        """
        if request is None or "nonce" not in kwargs or not oidc_enabled():
            return None
        self.configure()
        return super().authenticate(request, **kwargs)

    def get_user(self, user_id: Any) -> Any:
        """The session's user (active only, as Django's own backend), none while single sign-on is off."""
        if not oidc_enabled():
            return None
        return ModelBackend.get_user(self, user_id)

    def get_payload_data(self, token: Any, key: Any) -> dict[str, Any]:
        """The ID token's claims, after checking its signature with ``key`` and its claims.

        Raises:
            SuspiciousOperation: another algorithm than ``OIDC_SIGN_ALGO`` (``none`` included),
                a bad signature, a wrong ``iss`` or ``aud`` or ``azp``, an expired token, a
                missing required claim.
        """
        try:
            algorithm = jwt.get_unverified_header(token).get("alg")
            if algorithm != self.OIDC_RP_SIGN_ALGO:
                raise SuspiciousOperation(f"ID token refused: algorithm {algorithm!r}, "
                                          f"not OIDC_SIGN_ALGO {self.OIDC_RP_SIGN_ALGO!r}")
            claims = jwt.decode(
                token, key, algorithms=[self.OIDC_RP_SIGN_ALGO], audience=self.OIDC_RP_CLIENT_ID,
                issuer=oidc_issuer(), leeway=LEEWAY_SECONDS, options={"require": REQUIRED_CLAIMS},
            )
        except jwt.PyJWTError as exc:
            raise SuspiciousOperation(f"ID token refused: {exc}") from None
        refusal = authorized_party_refusal(claims, self.OIDC_RP_CLIENT_ID)
        if refusal:
            raise SuspiciousOperation(f"ID token refused: {refusal}")
        return claims

    def get_userinfo(self, access_token: Any, id_token: Any, payload: dict[str, Any]) -> dict[str, Any]:
        """The ID token's claims with the UserInfo response's (when the provider has that endpoint).

        Raises:
            SuspiciousOperation: the UserInfo response is not an object or names another ``sub``.
        """
        claims = dict(payload)
        if self.OIDC_OP_USER_ENDPOINT:
            info = super().get_userinfo(access_token, id_token, payload)
            if not isinstance(info, dict) or info.get("sub") != payload.get("sub"):
                raise SuspiciousOperation("UserInfo refused: its sub is not the ID token's")
            claims.update({name: value for name, value in info.items() if name not in _PROTOCOL_CLAIMS})
        return claims

    def verify_claims(self, claims: dict[str, Any]) -> bool:
        """A login needs a ``sub`` (the rules decide the rest; the library's asks for an e-mail)."""
        return isinstance(claims.get("sub"), str) and bool(claims["sub"])

    def get_or_create_user(self, access_token: Any, id_token: Any, payload: dict[str, Any]) -> Any:
        """The linked (or new) account with its memberships brought in line, or None (refused).

        Raises:
            SuspiciousOperation: the claims were refused (the library then answers None).
        """
        claims = self.get_userinfo(access_token, id_token, payload)
        if not self.verify_claims(claims):
            raise SuspiciousOperation("Claims verification failed: no sub")
        sid = payload.get("sid")
        self.request.oidc_sid = sid if isinstance(sid, str) else ""  # recorded with the session (back-channel logout)
        outcome = oidc_login_sync(issuer=payload["iss"], claims=claims, rules=oidc_rules())
        if outcome.user is None:
            self.request.oidc_refusal = outcome.refusal
            logger.info("single sign-on refused for sub %r: %s", claims["sub"], outcome.refusal)
        return outcome.user
