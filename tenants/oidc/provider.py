"""The OpenID Connect provider the operator configured: its settings, endpoints and discovery.

The endpoints come from the settings (``OIDC_AUTHORIZATION_ENDPOINT``, ``OIDC_TOKEN_ENDPOINT``,
``OIDC_USERINFO_ENDPOINT``, ``OIDC_JWKS_URI``) or, for those left empty, from the provider's
discovery document, ``<OIDC_ISSUER>/.well-known/openid-configuration`` (OpenID Connect
Discovery 1.0, §4), fetched with ``OIDC_TIMEOUT_SECONDS`` and kept for an hour in the process
(a failure for 30 seconds, so a provider that is down is not asked on every click). Its
``issuer`` must be ``OIDC_ISSUER`` exactly (Discovery §4.3). These URLs are the operator's,
never a tenant's: they are fetched directly, not through the outbound address rules.

:func:`oidc_setting` is the library's ``get_settings`` for the platform's subclasses
(:mod:`tenants.oidc.backend`, :mod:`tenants.oidc.views`): the Django setting, with the
endpoints filled in from discovery.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import requests
from django.conf import settings
from django.core.exceptions import DisallowedHost, ImproperlyConfigured

from tenants.oidc.rules import RulesError, TenantRule, rules_parse

DISCOVERY_PATH = "/.well-known/openid-configuration"
DISCOVERY_CACHE_SECONDS = 3600.0
"""How long a fetched discovery document is used."""
DISCOVERY_FAILURE_SECONDS = 30.0
"""How long a failed fetch is remembered (every login start fails at once meanwhile)."""
SIGN_ALGORITHMS = frozenset({"RS256", "RS384", "RS512", "ES256", "ES384", "ES512", "HS256", "HS384", "HS512"})
"""ID token algorithms the library verifies: RS*/ES* with the provider's JWKS, HS* with the client secret."""

ENDPOINTS = {
    "OIDC_OP_AUTHORIZATION_ENDPOINT": "authorization_endpoint",
    "OIDC_OP_TOKEN_ENDPOINT": "token_endpoint",
    "OIDC_OP_USER_ENDPOINT": "userinfo_endpoint",
    "OIDC_OP_JWKS_ENDPOINT": "jwks_uri",
    "OIDC_OP_LOGOUT_ENDPOINT": "end_session_endpoint",
}
"""The library's endpoint settings and the discovery document's names for them."""
_OPTIONAL = frozenset({"OIDC_OP_USER_ENDPOINT", "OIDC_OP_LOGOUT_ENDPOINT"})
"""Endpoints a provider may lack: without UserInfo the ID token's claims are used; without an
end-session endpoint signing out ends the platform's session only."""

_lock = threading.Lock()
_documents: dict[str, tuple[float, dict[str, Any] | str]] = {}  # discovery URL -> (expiry, document or error)


class OidcUnavailable(Exception):
    """The provider's discovery document could not be had (unreachable, not JSON, wrong issuer).

    ``message`` says why, for the operator's log and the sign-in page.
    """

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def oidc_enabled() -> bool:
    """True when the operator switched single sign-on on (``OIDC_ENABLED``)."""
    return bool(getattr(settings, "OIDC_ENABLED", False))


def oidc_issuer() -> str:
    """``OIDC_ISSUER``: the provider's issuer identifier, compared exactly with each ID token's ``iss``."""
    return str(getattr(settings, "OIDC_ISSUER", "") or "")


def oidc_rules() -> tuple[TenantRule, ...]:
    """The parsed ``OIDC_TENANT_RULES`` (a JSON text or a list).

    Raises:
        RulesError: the rules are malformed (:func:`oidc_config_problems` reports it at start-up).
    """
    return rules_parse(getattr(settings, "OIDC_TENANT_RULES", "") or "")


def oidc_config_problems() -> list[str]:
    """What is wrong with the single sign-on settings (empty when off, or when right)."""
    if not oidc_enabled():
        return []
    problems = []
    issuer = oidc_issuer()
    if not issuer.startswith(("https://", "http://")):
        problems.append("OIDC_ISSUER must be the provider's issuer URL (https://…)")
    if not getattr(settings, "OIDC_RP_CLIENT_ID", ""):
        problems.append("OIDC_CLIENT_ID is empty")
    algorithm = getattr(settings, "OIDC_RP_SIGN_ALGO", "")
    if algorithm not in SIGN_ALGORITHMS:
        problems.append(f"OIDC_SIGN_ALGO {algorithm!r} is not one of {', '.join(sorted(SIGN_ALGORITHMS))}")
    elif algorithm.startswith("HS") and not getattr(settings, "OIDC_RP_CLIENT_SECRET", ""):
        problems.append(f"OIDC_SIGN_ALGO {algorithm} needs OIDC_CLIENT_SECRET (the key of its signatures)")
    try:
        if not oidc_rules():
            problems.append("OIDC_TENANT_RULES is empty: no one could sign in")
    except RulesError as exc:
        problems.append(str(exc))
    return problems


def oidc_config_check() -> None:
    """Refuse to start with single sign-on on and its settings wrong (called from ``ready()``).

    Raises:
        ImproperlyConfigured: naming every problem of :func:`oidc_config_problems`.
    """
    problems = oidc_config_problems()
    if problems:
        raise ImproperlyConfigured("Single sign-on (OIDC_ENABLED) is misconfigured: " + "; ".join(problems))


def _fetch(url: str, issuer: str) -> dict[str, Any]:
    try:
        response = requests.get(url, timeout=settings.OIDC_TIMEOUT, headers={"Accept": "application/json"})
        response.raise_for_status()
        document = response.json()
    except requests.RequestException as exc:
        raise OidcUnavailable(f"the provider's discovery document ({url}) could not be fetched: {exc}") from None
    except ValueError:
        raise OidcUnavailable(f"the provider's discovery document ({url}) is not JSON") from None
    if not isinstance(document, dict):
        raise OidcUnavailable(f"the provider's discovery document ({url}) is not a JSON object")
    if document.get("issuer") != issuer:
        raise OidcUnavailable(f"the provider's discovery document names issuer {document.get('issuer')!r},"
                              f" not OIDC_ISSUER {issuer!r}")
    return document


def discovery_document() -> dict[str, Any]:
    """The provider's discovery document (cached, see the module's docstring).

    Raises:
        OidcUnavailable: it could not be fetched, is not a JSON object, or names another issuer
            (also for 30 seconds after such a failure, without asking again).
    """
    issuer = oidc_issuer()
    url = issuer.rstrip("/") + DISCOVERY_PATH
    now = time.monotonic()
    with _lock:
        cached = _documents.get(url)
    if cached is not None and cached[0] > now:
        if isinstance(cached[1], str):
            raise OidcUnavailable(cached[1])
        return cached[1]
    try:
        document = _fetch(url, issuer)
    except OidcUnavailable as exc:
        with _lock:
            _documents[url] = (now + DISCOVERY_FAILURE_SECONDS, exc.message)
        raise
    with _lock:
        _documents[url] = (now + DISCOVERY_CACHE_SECONDS, document)
    return document


def discovery_forget() -> None:
    """Drop every cached discovery document and failure (tests; an operator's provider change
    takes effect at the next process start anyway)."""
    with _lock:
        _documents.clear()


def oidc_setting(attr: str, *default: Any) -> Any:
    """The library's setting ``attr``: Django's, with the provider's endpoints from discovery.

    Args:
        attr: A setting name (``OIDC_OP_TOKEN_ENDPOINT``, ``OIDC_RP_CLIENT_ID``, …).
        default: Returned when Django has no such setting (as the library's ``get_settings``).

    Returns:
        An endpoint's URL ("" for a UserInfo endpoint neither configured nor discovered), or the
        setting's value.

    Raises:
        OidcUnavailable: an endpoint left to discovery, and discovery failed or lacks it.
        ImproperlyConfigured: no such setting and no default.
    """
    if attr in ENDPOINTS:
        configured = getattr(settings, attr, "")
        if configured:
            return configured
        value = discovery_document().get(ENDPOINTS[attr]) or ""
        if not value and attr not in _OPTIONAL:
            raise OidcUnavailable(f"the provider's discovery document has no {ENDPOINTS[attr]}")
        return value
    if default:
        return getattr(settings, attr, default[0])
    try:
        return getattr(settings, attr)
    except AttributeError:
        raise ImproperlyConfigured(f"Setting {attr} not found") from None


def oidc_login_link() -> dict[str, str] | None:
    """The login pages' "Sign in with <provider>" link, or None when single sign-on is off.

    Returns:
        ``{"name": OIDC_PROVIDER_NAME, "url": "/oidc/authenticate/"}`` (add ``?next=<path>``).
    """
    if not oidc_enabled():
        return None
    from django.urls import reverse

    return {"name": str(getattr(settings, "OIDC_PROVIDER_NAME", "") or "SSO"), "url": reverse("oidc-login")}


PROVIDER_LOGOUT_ATTRIBUTE = "oidc_provider_logout_url"
"""The request attribute :func:`provider_logout_remember` sets (the logout API and the console's
logged-out page read it)."""


def provider_logout_url(request: Any) -> str | None:
    """Where to send the browser so that signing out of the platform also signs out of the
    provider (OpenID Connect RP-Initiated Logout 1.0, §2): the provider's
    ``end_session_endpoint`` (``OIDC_END_SESSION_ENDPOINT``, else discovery) with
    ``id_token_hint`` (the ID token of this session's login), ``client_id`` and
    ``post_logout_redirect_uri`` (this site's ``/``; register it at the provider).

    Returns:
        The URL, or None: single sign-on off, a session that did not start through it, a
        session without its ID token, or a provider without that endpoint (or unreachable:
        signing out of the platform never waits on the provider).
    """
    from urllib.parse import urlencode

    from django.contrib.auth import BACKEND_SESSION_KEY

    session = getattr(request, "session", None)
    if not oidc_enabled() or session is None or session.get(BACKEND_SESSION_KEY) != "tenants.oidc.backend.OidcBackend":
        return None
    id_token = session.get("oidc_id_token")
    try:
        endpoint = oidc_setting("OIDC_OP_LOGOUT_ENDPOINT")
    except OidcUnavailable:
        return None
    if not endpoint or not id_token:
        return None
    query = urlencode({"id_token_hint": id_token, "client_id": settings.OIDC_RP_CLIENT_ID,
                       "post_logout_redirect_uri": request.build_absolute_uri("/")})
    return f"{endpoint}{'&' if '?' in endpoint else '?'}{query}"


def provider_logout_remember(sender: Any, request: Any = None, **kwargs: Any) -> None:
    """``user_logged_out``: keep :func:`provider_logout_url` on the request (the signal comes
    before the session is flushed, which loses the ID token). Signing out never fails on it: a
    request that cannot name its own origin (a test client's bare request) gets None."""
    if request is None:
        return
    try:
        url = provider_logout_url(request)
    except (KeyError, ValueError, DisallowedHost):
        url = None
    setattr(request, PROVIDER_LOGOUT_ATTRIBUTE, url)
