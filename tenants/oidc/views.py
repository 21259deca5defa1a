"""The two pages of single sign-on: the start of a login and the provider's callback.

- ``GET /oidc/authenticate/?next=<path>``: redirects to the provider's authorization endpoint
  with a fresh ``state``, ``nonce`` and PKCE ``code_challenge`` (S256), kept in the session
  (mozilla-django-oidc). ``next`` (a path of this site) is where the browser lands afterwards.
- ``GET /oidc/callback/?code=…&state=…``: the provider's redirect back; the backend
  (:mod:`tenants.oidc.backend`) exchanges the code and checks the ID token; a session starts.

- ``POST /oidc/backchannel-logout/`` (``logout_token=…``): the provider's Back-Channel Logout
  (:mod:`tenants.oidc.backchannel`): the sessions the token names end; 200, or 400 with a JSON
  ``{"error", "error_description"}`` for a refused token (§2.8), 503 when the provider's keys
  cannot be fetched.

All are 404 while single sign-on is off. Whatever goes wrong answers a page saying so, never
a server error: too many starts from one address (429), the provider unreachable (503), the
login refused by the provider or by a check (400), a user with no access (403, "no access":
the claims match no rule).
"""

from __future__ import annotations

import logging
from typing import Any

import jwt
import requests
from django.core.exceptions import SuspiciousOperation
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.utils.decorators import method_decorator
from django.views.decorators.cache import never_cache
from django.views.decorators.csrf import csrf_exempt
from django.views.generic import View
from mozilla_django_oidc.views import OIDCAuthenticationCallbackView, OIDCAuthenticationRequestView

from tenants.audit import audit_context, context_for_request
from tenants.oidc.backchannel import LogoutTokenRefused, logout_token_verify
from tenants.oidc.provider import OidcUnavailable, oidc_enabled, oidc_setting
from tenants.oidc.services import Refusal, oidc_session_record, oidc_sessions_end
from tenants.throttling import ClientIpThrottle

logger = logging.getLogger(__name__)

PAGES = {
    Refusal.NO_ACCESS: (403, "No access", "Your account at the sign-in service gives you no access to any "
                        "tenant of Agent Platform. Ask your administrator to add you to a group that has access."),
    Refusal.OPERATOR: (403, "Operator account", "This account is an operator's: sign in with its username "
                       "and password instead."),
    Refusal.INACTIVE: (403, "Account disabled", "This account has been disabled. Ask your administrator."),
    "unavailable": (503, "Sign-in service unavailable", "The sign-in service cannot be reached right now. "
                    "Try again in a minute; if it persists, tell your administrator."),
    "throttled": (429, "Too many sign-ins", "Too many sign-ins from your address. Try again in a minute."),
    "failed": (400, "Sign-in failed", "The sign-in could not be completed. Start again from the login page."),
    "cancelled": (400, "Sign-in cancelled", "The sign-in service did not sign you in. Start again from the "
                  "login page."),
}


def oidc_page(request: HttpRequest, outcome: str) -> HttpResponse:
    """The page of a login that ended without a session (``outcome``: a :data:`PAGES` key)."""
    status, title, text = PAGES[outcome]
    context = {"title": title, "text": text}
    return render(request, "oidc/outcome.html", context, status=status)


class OidcLoginView(OIDCAuthenticationRequestView):
    """``GET /oidc/authenticate/``: off to the provider (state, nonce and PKCE in the session).

    Each start is a login attempt of the client's address (``API_THROTTLE_RATES["login.ip"]``,
    shared with the password login): a start writes a session row, so a flood is refused
    (429, ``Retry-After``)."""

    get_settings = staticmethod(oidc_setting)
    throttle_scope = "login"

    def __init__(self, **kwargs: Any) -> None:
        # Not the library's __init__: it reads the authorization endpoint (maybe from discovery,
        # over HTTP) before the view could answer a failure with a page. get() reads it.
        View.__init__(self, **kwargs)

    def get(self, request: HttpRequest) -> HttpResponse:
        """A redirect to the authorization endpoint; 404 while off, 429 over the address's login
        budget, 503 when discovery fails."""
        if not oidc_enabled():
            raise Http404("Single sign-on is off.")
        throttle = ClientIpThrottle()
        if not throttle.allow_request(request, self):
            response = oidc_page(request, "throttled")
            response["Retry-After"] = str(max(1, int(throttle.wait() or 60)))
            return response
        try:
            self.OIDC_OP_AUTH_ENDPOINT = self.get_settings("OIDC_OP_AUTHORIZATION_ENDPOINT")
        except OidcUnavailable as exc:
            logger.warning("single sign-on unavailable: %s", exc.message)
            return oidc_page(request, "unavailable")
        self.OIDC_RP_CLIENT_ID = self.get_settings("OIDC_RP_CLIENT_ID")
        return super().get(request)


class OidcCallbackView(OIDCAuthenticationCallbackView):
    """``GET /oidc/callback/``: the provider's answer; a session, or a page saying why not."""

    get_settings = staticmethod(oidc_setting)

    @property
    def success_url(self) -> str:
        """The login's ``next`` (checked when the login started), else the chat app."""
        return self.request.session.get("oidc_login_next") or "/"

    def login_failure(self) -> HttpResponse:
        """The page of a refused login: the backend's reason, the provider's error, or a failure."""
        refusal = getattr(self.request, "oidc_refusal", "")
        if refusal in PAGES:
            return oidc_page(self.request, refusal)
        return oidc_page(self.request, "cancelled" if self.request.GET.get("error") else "failed")

    def login_success(self) -> HttpResponse:
        """The library's login (the session starts), then the session recorded with the ID
        token's ``sid`` so that the provider's Back-Channel Logout can end it."""
        response = super().login_success()
        session = self.request.session
        if session.session_key is None:
            session.save()
        oidc_session_record(user=self.user, session_key=session.session_key,
                            sid=getattr(self.request, "oidc_sid", ""))
        return response

    def get(self, request: HttpRequest) -> HttpResponse:
        """Completes the login; every failure is a page (see the module's docstring)."""
        if not oidc_enabled():
            raise Http404("Single sign-on is off.")
        try:
            with audit_context(context_for_request(request, source="auth")):
                return super().get(request)
        except OidcUnavailable as exc:
            logger.warning("single sign-on unavailable: %s", exc.message)
            return oidc_page(request, "unavailable")
        except requests.HTTPError as exc:
            logger.warning("single sign-on: the provider refused: %s", exc)
            return oidc_page(request, "failed")
        except requests.RequestException as exc:
            logger.warning("single sign-on: the provider did not answer: %s", exc)
            return oidc_page(request, "unavailable")
        except (SuspiciousOperation, jwt.PyJWTError, KeyError, TypeError, ValueError) as exc:
            logger.warning("single sign-on refused: %s: %s", type(exc).__name__, exc)
            return oidc_page(request, "failed")


@method_decorator([csrf_exempt, never_cache], name="dispatch")
class OidcBackchannelLogoutView(View):
    """``POST /oidc/backchannel-logout/``: the provider ends sessions (Back-Channel Logout 1.0).

    The body is ``application/x-www-form-urlencoded`` with ``logout_token`` (§2.5); no cookie
    and no CSRF token (the provider calls server to server: the token's signature is the
    authentication). Answers (§2.8), all ``Cache-Control: no-store``: 200 (the sessions the
    token names ended, or none was open), 400 ``{"error": "invalid_request",
    "error_description"}`` (no token, or a check of :func:`~tenants.oidc.backchannel.
    logout_token_verify` failed: nothing ended), 503 (the provider's keys could not be
    fetched; the provider may retry), 404 while single sign-on is off.
    """

    http_method_names = ["post"]

    def post(self, request: HttpRequest) -> HttpResponse:
        if not oidc_enabled():
            raise Http404("Single sign-on is off.")
        token = request.POST.get("logout_token", "")
        if not token:
            return JsonResponse({"error": "invalid_request", "error_description": "logout_token is missing"}, status=400)
        try:
            logout = logout_token_verify(token)
        except LogoutTokenRefused as exc:
            logger.warning("single sign-on: a back-channel logout token was refused: %s", exc.reason)
            return JsonResponse({"error": "invalid_request", "error_description": exc.reason}, status=400)
        except OidcUnavailable as exc:
            logger.warning("single sign-on: back-channel logout unavailable: %s", exc.message)
            return JsonResponse({"error": "temporarily_unavailable", "error_description": exc.message}, status=503)
        ended = oidc_sessions_end(issuer=logout.issuer, subject=logout.subject, sid=logout.sid)
        logger.info("single sign-on: the provider's back-channel logout (sub %r, sid %r) ended %d session(s)",
                    logout.subject, logout.sid, ended)
        return HttpResponse(status=200)
