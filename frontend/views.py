"""Serves the chat SPA (static files under frontend/static/frontend/)."""

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.csrf import ensure_csrf_cookie

from tenants.oidc.provider import oidc_login_link


@ensure_csrf_cookie
def index(request: HttpRequest) -> HttpResponse:
    """The SPA's page. ``authenticated`` tells the app whether this browser has a session, so a
    signed-out visitor gets the login form without first asking ``auth/me/`` (a 401 the browser
    would log as a console error). ``sso`` is the "Sign in with <provider>" link while single
    sign-on is on (``{"name", "url"}``), else null."""
    config = {"api_base": "/api/v1", "ws_base": "/ws", "authenticated": request.user.is_authenticated,
              "sso": oidc_login_link()}
    return render(request, "frontend/index.html", {"config_json": config})
