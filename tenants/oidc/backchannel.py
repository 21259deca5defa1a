"""The provider's Back-Channel Logout: checking its logout tokens.

When an end user signs out at the provider (or an administrator ends their session there),
the provider POSTs a *logout token* to this platform's back-channel logout URI,
``<origin>/oidc/backchannel-logout/`` (OpenID Connect Back-Channel Logout 1.0). The token is a
JWT signed like the provider's ID tokens; :func:`logout_token_verify` checks it as §2.6 asks:

- signed with ``OIDC_SIGN_ALGO`` (never ``none``) by a key of the provider's JWKS (or, for
  HS*, the client secret); the ``typ`` header, when present, ``logout+jwt`` (or ``JWT``, which
  some providers send);
- ``iss`` exactly ``OIDC_ISSUER``, ``aud`` holding ``OIDC_CLIENT_ID`` (with several audiences
  ``azp`` must be it), ``iat`` present and at most :data:`LOGOUT_TOKEN_MAX_AGE_SECONDS` old,
  ``exp`` not passed when present (the 1.0 final text requires it; earlier providers omit it);
- ``events`` holding the member ``http://schemas.openid.net/event/backchannel-logout`` with a
  JSON object as its value, a ``sub`` or a ``sid`` (or both), no ``nonce`` (an ID token is
  therefore never taken for a logout token);
- ``jti`` present and not seen before from this issuer (kept in Django's cache for the
  token's maximum age): a captured token replayed later cannot sign the user out again.

The cheap checks on the unverified token (algorithm, issuer, events) come before the keys are
fetched, and the JWKS is cached per process (:data:`JWKS_CACHE_SECONDS`; re-fetched at most
every :data:`JWKS_REFRESH_SECONDS` for an unknown ``kid``), so a flood of forged tokens cannot
make the platform flood the provider.
"""

from __future__ import annotations

import hashlib
import threading
import time
from dataclasses import dataclass
from typing import Any

import jwt
import requests
from django.conf import settings
from django.core.cache import cache

from tenants.oidc.backend import LEEWAY_SECONDS, authorized_party_refusal
from tenants.oidc.provider import OidcUnavailable, oidc_issuer, oidc_setting

LOGOUT_EVENT = "http://schemas.openid.net/event/backchannel-logout"
"""The ``events`` member that makes a JWT a logout token (Back-Channel Logout 1.0, §2.4)."""
LOGOUT_TOKEN_MAX_AGE_SECONDS = 300
"""The oldest ``iat`` accepted (seconds, plus :data:`~tenants.oidc.backend.LEEWAY_SECONDS`); also
how long a ``jti`` is remembered. A provider sends the token at once (§2.5); the OWASP ASVS
(10.5.5) recommends a short lifetime, about two minutes."""
JWKS_CACHE_SECONDS = 300.0
"""How long a fetched JWKS is used (per process)."""
JWKS_REFRESH_SECONDS = 30.0
"""The least time between two fetches of the JWKS when a token names a ``kid`` not in it
(a key rotation at the provider)."""
_TYPES = frozenset({"logout+jwt", "application/logout+jwt", "jwt"})
_REQUIRED_CLAIMS = ["iss", "aud", "iat", "jti", "events"]

_jwks_lock = threading.Lock()
_jwks: dict[str, tuple[float, dict[str, Any]]] = {}
"""JWKS URI → (monotonic time fetched, the JWKS document)."""


class LogoutTokenRefused(Exception):
    """The logout token failed a check; :attr:`reason` says which (answered as a 400)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class LogoutRequest:
    """What a verified logout token asks: end the sessions of ``subject`` and/or ``sid`` at ``issuer``."""

    issuer: str
    subject: str | None
    sid: str | None


def jwks_forget() -> None:
    """Drop the cached JWKS (tests)."""
    with _jwks_lock:
        _jwks.clear()


def _jwks_fetch(uri: str) -> dict[str, Any]:
    try:
        response = requests.get(uri, timeout=settings.OIDC_TIMEOUT, headers={"Accept": "application/json"})
        response.raise_for_status()
        document = response.json()
    except (requests.RequestException, ValueError) as exc:
        raise OidcUnavailable(f"the provider's JWKS ({uri}) could not be fetched: {exc}") from None
    if not isinstance(document, dict) or not isinstance(document.get("keys"), list):
        raise OidcUnavailable(f"the provider's JWKS ({uri}) is not a JWK set")
    return document


def _jwks_document(uri: str, max_age: float) -> dict[str, Any]:
    """The JWKS at ``uri``, fetched again when the cached one is older than ``max_age`` seconds.
    Raises :class:`OidcUnavailable`."""
    now = time.monotonic()
    with _jwks_lock:
        cached = _jwks.get(uri)
    if cached is None or now - cached[0] > max_age:
        cached = (now, _jwks_fetch(uri))
        with _jwks_lock:
            _jwks[uri] = cached
    return cached[1]


def _jwk_match(document: dict[str, Any], kid: str | None, algorithm: str) -> Any:
    """The verification key of ``kid`` (or the only signing key when the token names none), or None."""
    candidates = []
    for entry in document["keys"]:
        if not isinstance(entry, dict) or entry.get("use", "sig") != "sig":
            continue
        if entry.get("alg") not in (None, algorithm):
            continue
        if kid is not None and entry.get("kid") != kid:
            continue
        candidates.append(entry)
    if len(candidates) != 1:
        return None
    try:
        return jwt.PyJWK(candidates[0], algorithm=algorithm).key
    except jwt.PyJWTError:
        return None


def _verification_key(kid: str | None, algorithm: str) -> Any:
    """The key that checks a logout token signed with ``algorithm`` under ``kid``.

    Raises:
        OidcUnavailable: the JWKS could not be fetched.
        LogoutTokenRefused: no key of the JWKS matches.
    """
    if algorithm.startswith("HS"):
        return settings.OIDC_RP_CLIENT_SECRET
    uri = oidc_setting("OIDC_OP_JWKS_ENDPOINT")
    key = _jwk_match(_jwks_document(uri, JWKS_CACHE_SECONDS), kid, algorithm)
    if key is None:  # the provider may have rotated its keys: ask again, but not more often than this
        key = _jwk_match(_jwks_document(uri, JWKS_REFRESH_SECONDS), kid, algorithm)
    if key is None:
        raise LogoutTokenRefused(f"no key of the provider's JWKS matches kid {kid!r}")
    return key


def _header_checked(token: str, algorithm: str, issuer: str) -> dict[str, Any]:
    """The token's JOSE header, after the checks that need no key (algorithm, ``typ``, ``iss``,
    the logout event, no ``nonce``). Raises :class:`LogoutTokenRefused`."""
    try:
        header = jwt.get_unverified_header(token)
        unverified = jwt.decode(token, options={"verify_signature": False})
    except jwt.PyJWTError as exc:
        raise LogoutTokenRefused(f"not a JWT: {exc}") from None
    if header.get("alg") != algorithm:
        raise LogoutTokenRefused(f"algorithm {header.get('alg')!r}, not OIDC_SIGN_ALGO {algorithm!r}")
    if "typ" in header and str(header["typ"]).lower() not in _TYPES:
        raise LogoutTokenRefused(f"typ {header['typ']!r} is not logout+jwt")
    if unverified.get("iss") != issuer:
        raise LogoutTokenRefused("iss is not OIDC_ISSUER")
    events = unverified.get("events")
    if not isinstance(events, dict) or not isinstance(events.get(LOGOUT_EVENT), dict):
        raise LogoutTokenRefused(f"events has no {LOGOUT_EVENT} object: not a logout token")
    if "nonce" in unverified:
        raise LogoutTokenRefused("a logout token must not carry a nonce")
    return header


def _claims_checked(claims: dict[str, Any]) -> tuple[str | None, str | None, str]:
    """``(sub, sid, jti)`` of verified claims, after the checks PyJWT does not make (``azp``, the
    age of ``iat``, the types, a ``sub`` or a ``sid``). Raises :class:`LogoutTokenRefused`."""
    refusal = authorized_party_refusal(claims, settings.OIDC_RP_CLIENT_ID)
    if refusal:
        raise LogoutTokenRefused(refusal)
    oldest = time.time() - LOGOUT_TOKEN_MAX_AGE_SECONDS - LEEWAY_SECONDS
    if not isinstance(claims["iat"], (int, float)) or claims["iat"] < oldest:
        raise LogoutTokenRefused(f"iat is older than {LOGOUT_TOKEN_MAX_AGE_SECONDS} seconds")
    subject, sid, jti = claims.get("sub"), claims.get("sid"), claims["jti"]
    for name, value in (("jti", jti), ("sub", subject), ("sid", sid)):
        if value is not None and (not isinstance(value, str) or not value):
            raise LogoutTokenRefused(f"{name} is not a string")
    if subject is None and sid is None:
        raise LogoutTokenRefused("a logout token names a sub or a sid")
    return subject, sid, jti


def logout_token_verify(token: str) -> LogoutRequest:
    """Check a logout token (see the module's docstring) and say what it asks.

    Args:
        token: The ``logout_token`` parameter of the provider's POST (a compact JWS).

    Returns:
        :class:`LogoutRequest`: the verified ``iss``, ``sub`` (or None) and ``sid`` (or None).

    Raises:
        LogoutTokenRefused: a check failed (the reason names it); the token's ``jti`` is then
            not remembered.
        OidcUnavailable: the provider's keys could not be fetched (discovery or JWKS).
    """
    algorithm = settings.OIDC_RP_SIGN_ALGO
    issuer = oidc_issuer()
    header = _header_checked(token, algorithm, issuer)
    key = _verification_key(header.get("kid"), algorithm)
    try:
        claims = jwt.decode(token, key, algorithms=[algorithm], audience=settings.OIDC_RP_CLIENT_ID,
                            issuer=issuer, leeway=LEEWAY_SECONDS, options={"require": _REQUIRED_CLAIMS})
    except jwt.PyJWTError as exc:
        raise LogoutTokenRefused(str(exc)) from None
    subject, sid, jti = _claims_checked(claims)
    # Remembered only once every check passed; a replay (or a second delivery) is refused.
    seen_key = "oidc:logout-jti:" + hashlib.sha256(f"{issuer}\n{jti}".encode()).hexdigest()
    if not cache.add(seen_key, 1, timeout=LOGOUT_TOKEN_MAX_AGE_SECONDS + 2 * LEEWAY_SECONDS):
        raise LogoutTokenRefused("jti was already used: a replayed logout token")
    return LogoutRequest(issuer=issuer, subject=subject, sid=sid)
