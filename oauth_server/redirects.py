"""Which redirect URIs a client may register and be sent to: :func:`redirect_uri_problem`.

The rule (OAuth 2.1 draft §2.3.1 and §7.5, RFC 8252 §7, RFC 9700 §2.1 and §4.1), one function
for every path that accepts a redirect URI:

- ``https`` with a host: anywhere.
- ``http``: only to a loopback host, ``127.0.0.1``, ``[::1]`` or ``localhost`` (RFC 8252 §7.3;
  the port is not compared at the authorization request, ``ALLOW_LOCALHOST_LOOPBACK``).
- A private-use scheme as native apps use (RFC 8252 §7.1): reverse-domain style
  (``com.example.app:/cb``) or an application's own (``cursor://…``, ``vscode://…``).
- Never: ``javascript:``, ``data:``, ``file:``, ``vbscript:``, ``about:``, ``blob:`` (and the
  other schemes of :data:`REFUSED_SCHEMES`), a fragment (``#``), credentials in the authority
  (``user@host``), white space.

Where it applies (wired in :meth:`oauth_server.apps.OAuthServerConfig.ready`):

- ``Application.clean`` (DOT's model, wrapped by :func:`application_clean`): the dynamic
  registration (RFC 7591 POST, RFC 7592 PUT), a Client ID Metadata Document's client (DOT's
  ``full_clean`` of the client it makes), the admin. A refused URI is DOT's
  ``invalid_client_metadata`` 400 at registration and an unknown client for a document.
- The authorization request: :meth:`oauth_server.validator.McpOAuth2Validator.validate_redirect_uri`
  and the consent POST (a client stored before this rule cannot be redirected to a refused URI).
- ``Application.get_allowed_schemes`` (:func:`application_allowed_schemes`): DOT's redirect
  response refuses a scheme not in this list; for a client it is ``https``, ``http`` and the
  private-use schemes of its own registered URIs that pass the rule.
"""

from __future__ import annotations

import re
from typing import Any, Final
from urllib.parse import urlsplit

LOOPBACK_HOSTS: Final[frozenset[str]] = frozenset({"127.0.0.1", "::1", "localhost"})
"""Hosts an ``http`` redirect URI may name (``urlsplit().hostname`` spells ``[::1]`` ``::1``)."""

REFUSED_SCHEMES: Final[frozenset[str]] = frozenset(
    {
        # script or document in the URI itself, or a local resource (RFC 9700 §4.1, browsers' lists)
        "javascript",
        "data",
        "file",
        "vbscript",
        "about",
        "blob",
        "filesystem",
        "view-source",
        # not a redirect target
        "ws",
        "wss",
        "ftp",
        "mailto",
        "tel",
        "sms",
    }
)
"""Schemes never accepted, whatever else the URI says."""

_SCHEME = re.compile(r"[a-z][a-z0-9+.-]*")


def redirect_uri_problem(uri: Any) -> str | None:
    """Why ``uri`` may not be a redirect URI, or None when it may (the rule in the module doc).

    Args:
        uri: The URI as registered or as the authorization request names it.

    Returns:
        A short reason for an error description (it does not repeat the URI), or None.
    """
    if not isinstance(uri, str) or not uri:
        return "a redirect URI must be a non-empty string"
    if any(c.isspace() for c in uri):
        return "a redirect URI may not contain white space"
    if "#" in uri:
        return "a redirect URI may not have a fragment (#)"
    try:
        parts = urlsplit(uri)
        hostname = parts.hostname
        parts.port  # noqa: B018  (raises ValueError for a port out of range)
    except ValueError:
        return "a redirect URI must be an absolute URI"
    scheme = parts.scheme.lower()
    if not scheme or not _SCHEME.fullmatch(scheme):
        return "a redirect URI must be an absolute URI with a scheme"
    if scheme in REFUSED_SCHEMES:
        return f"the {scheme}: scheme is not allowed for redirect URIs"
    if "@" in parts.netloc:
        return "a redirect URI may not carry credentials (user@host)"
    if scheme == "https":
        return None if hostname else "an https redirect URI must name a host"
    if scheme == "http":
        if hostname in LOOPBACK_HOSTS:
            return None
        return "http redirect URIs are allowed only to a loopback host (127.0.0.1, [::1], localhost); use https"
    # a private-use scheme (RFC 8252 §7.1): something must follow the scheme
    if not parts.netloc and not parts.path.strip("/"):
        return "a private-use scheme redirect URI needs a path, e.g. com.example.app:/callback"
    return None


def csp_source(uri: str) -> str:
    """The Content-Security-Policy source expression matching ``uri`` (a redirect URI the rule
    accepts), for ``form-action``: ``scheme://host[:port]`` for http(s), ``scheme:`` for a
    private-use scheme (CSP scheme-source, CSP3 §2.3.1); '' when none can be written."""
    parts = urlsplit(uri)
    scheme = parts.scheme.lower()
    if not _SCHEME.fullmatch(scheme):
        return ""
    if scheme in ("http", "https"):
        if not re.fullmatch(r"[A-Za-z0-9.:\[\]-]+", parts.netloc):
            return ""
        return f"{scheme}://{parts.netloc}"
    return f"{scheme}:"


def application_allowed_schemes(application: Any) -> list[str]:
    """``Application.get_allowed_schemes``: ``https``, ``http`` and the private-use schemes of
    ``application``'s registered redirect URIs that pass :func:`redirect_uri_problem` (DOT's
    registration check and its redirect response both read this list)."""
    schemes = ["https", "http"]
    for uri in (getattr(application, "redirect_uris", "") or "").split():
        scheme = urlsplit(uri).scheme.lower() if ":" in uri else ""
        if scheme and scheme not in schemes and redirect_uri_problem(uri) is None:
            schemes.append(scheme)
    return schemes


def application_clean(original: Any) -> Any:
    """Wrap DOT's ``Application.clean`` (``original``) with :func:`redirect_uri_problem` on each
    registered redirect URI: the problems are a ``ValidationError`` on ``redirect_uris``,
    reported with DOT's own (which DCR turns into ``invalid_client_metadata``)."""
    from django.core.exceptions import ValidationError

    def clean(self: Any) -> None:
        problems = [
            f"{problem}: {uri[:200]}"
            for uri in (self.redirect_uris or "").split()
            if (problem := redirect_uri_problem(uri)) is not None
        ]
        try:
            original(self)
        except ValidationError as exc:
            if not problems:
                raise
            errors = exc.update_error_dict({})
            errors.setdefault("redirect_uris", []).extend(ValidationError(p) for p in problems)
            raise ValidationError(errors) from exc
        if problems:
            raise ValidationError({"redirect_uris": problems})

    clean.__doc__ = original.__doc__
    clean.mcp_redirect_rule = True  # type: ignore[attr-defined]
    return clean
