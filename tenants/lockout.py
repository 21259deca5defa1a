"""Login lockout (django-axes) wired to this project: the backend and the locked-out answer.

Both login endpoints (``POST /api/v1/auth/login/`` and the console's ``/admin/login/``) call
``django.contrib.auth.authenticate(request, …)``; :class:`LockoutBackend` (first in
``AUTHENTICATION_BACKENDS``) refuses any attempt for a username + client address that has
failed ``AXES_FAILURE_LIMIT`` times within the cool-off (``AXES_COOLOFF_TIME``), before the
password is even checked. Counters live in the Redis cache (``AXES_HANDLER``). Failed logins
and lockouts are also audit events (:mod:`tenants.audit`).
"""

from __future__ import annotations

from typing import Any

from axes.backends import AxesStandaloneBackend
from axes.helpers import get_cool_off
from django.http import HttpRequest, HttpResponse, JsonResponse

LOCKED_OUT_MESSAGE = "Too many failed logins; try again later."


class LockoutBackend(AxesStandaloneBackend):
    """django-axes' lockout check for logins that come with a request.

    ``authenticate()`` without a request (Django's test client ``login()``, management
    commands) is not an HTTP login attempt: axes cannot key it by address, and refuses it with
    a ValueError; this backend lets the next backends decide instead. Every HTTP login path of
    the platform passes the request.
    """

    def authenticate(self, request: HttpRequest | None, username: str | None = None, password: str | None = None,
                     **kwargs: Any) -> None:
        if request is None:
            return None
        return super().authenticate(request, username=username, password=password, **kwargs)


def retry_after_seconds(request: HttpRequest | None = None) -> int:
    """Seconds until a lockout ends (the configured cool-off; at least 1)."""
    cool_off = get_cool_off(request)
    return max(1, int(cool_off.total_seconds())) if cool_off else 3600


def lockout_response(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
    """``AXES_LOCKOUT_CALLABLE``: 429 with ``Retry-After``; for ``/api/`` the
    ``{message, extra}`` body, for the console a plain text page.

    (axes calls it with ``(request, response, credentials)`` or ``(request, credentials)``
    depending on the middleware's mode; only the request is used.)
    """
    wait = retry_after_seconds(request)
    if request.path.startswith("/api/"):
        response: HttpResponse = JsonResponse(
            {"message": LOCKED_OUT_MESSAGE, "extra": {"retry_after_seconds": wait}}, status=429)
    else:
        response = HttpResponse(LOCKED_OUT_MESSAGE, status=429, content_type="text/plain; charset=utf-8")
    response["Retry-After"] = str(wait)
    return response
