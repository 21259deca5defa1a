"""The Content-Security-Policy header (Django 5.2 has none of its own).

:class:`ContentSecurityPolicyMiddleware` adds ``Content-Security-Policy`` to every response
that has none yet: ``settings.CONTENT_SECURITY_POLICY``, or for a path under one of the
prefixes of ``settings.CONTENT_SECURITY_POLICY_PATHS`` that prefix's policy (the longest
matching prefix wins). It sits right after Django's ``SecurityMiddleware`` and before
WhiteNoise, so static files get it too (an uploaded or served SVG/HTML cannot run script).

The other security headers come from Django's ``SecurityMiddleware`` (settings.py: HSTS,
``X-Content-Type-Options``, ``Referrer-Policy``, ``Cross-Origin-Opener-Policy``) and
``XFrameOptionsMiddleware``.

:func:`security_headers_for` gives all of them for an ASGI app served beside Django, outside
its middleware (the knowledge MCP server, ``/mcp/knowledge/``).
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponseBase
from django.utils.deprecation import MiddlewareMixin

HEADER = "Content-Security-Policy"


def policy_for_path(path: str) -> str:
    """The policy for a request path: the longest prefix of ``CONTENT_SECURITY_POLICY_PATHS``
    that ``path`` starts with, else ``CONTENT_SECURITY_POLICY``; "" means no header."""
    best = ""
    for prefix in getattr(settings, "CONTENT_SECURITY_POLICY_PATHS", {}):
        if path.startswith(prefix) and len(prefix) > len(best):
            best = prefix
    if best:
        return settings.CONTENT_SECURITY_POLICY_PATHS[best]
    return getattr(settings, "CONTENT_SECURITY_POLICY", "")


class ContentSecurityPolicyMiddleware(MiddlewareMixin):
    """Adds ``Content-Security-Policy`` (:func:`policy_for_path`) to responses that lack it.
    Sync and async (``MiddlewareMixin``); no state per request."""

    def process_response(self, request: HttpRequest, response: HttpResponseBase) -> Any:
        if HEADER not in response:
            policy = policy_for_path(request.path)
            if policy:
                response[HEADER] = policy
        return response


def security_headers_for(request: HttpRequest) -> list[tuple[str, str]]:
    """The security headers Django's middleware puts on a response to ``request``, for an app
    that answers outside that middleware: ``SecurityMiddleware``'s (``Strict-Transport-Security``
    on a secure request when ``SECURE_HSTS_SECONDS`` is set, ``X-Content-Type-Options``,
    ``Referrer-Policy``, ``Cross-Origin-Opener-Policy``), :class:`ContentSecurityPolicyMiddleware`'s
    and ``XFrameOptionsMiddleware``'s, computed by those middlewares themselves on an empty
    response (so they follow the same settings).

    Returns:
        ``[(name, value)]`` in the order the middlewares set them.
    """
    from django.http import HttpResponse
    from django.middleware.clickjacking import XFrameOptionsMiddleware
    from django.middleware.security import SecurityMiddleware

    def not_called(_request: HttpRequest) -> HttpResponseBase:  # only process_response is used
        raise AssertionError

    response: HttpResponseBase = HttpResponse()
    untouched = set(response.headers)
    for middleware in (SecurityMiddleware, ContentSecurityPolicyMiddleware, XFrameOptionsMiddleware):
        response = middleware(not_called).process_response(request, response)
    return [(name, value) for name, value in response.items() if name not in untouched]
