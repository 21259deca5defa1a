"""The Content-Security-Policy header (Django 5.2 has none of its own).

:class:`ContentSecurityPolicyMiddleware` adds ``Content-Security-Policy`` to every response
that has none yet: ``settings.CONTENT_SECURITY_POLICY``, or for a path under one of the
prefixes of ``settings.CONTENT_SECURITY_POLICY_PATHS`` that prefix's policy (the longest
matching prefix wins). It sits right after Django's ``SecurityMiddleware`` and before
WhiteNoise, so static files get it too (an uploaded or served SVG/HTML cannot run script).

The other security headers come from Django's ``SecurityMiddleware`` (settings.py: HSTS,
``X-Content-Type-Options``, ``Referrer-Policy``, ``Cross-Origin-Opener-Policy``) and
``XFrameOptionsMiddleware``.
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
