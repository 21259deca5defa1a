"""The resources this authorization server issues tokens for: the platform's MCP endpoints.

A resource's identifier (RFC 8707 ``resource``, RFC 9728 ``resource``) is the issuer's origin
plus the endpoint's mount, e.g. ``https://agents.example.com/mcp/agents/``. The origin is
``settings.OAUTH_ISSUER`` when set (what an operator behind a proxy configures), else the origin
the request reached (``scheme://host``, the ``Host`` checked against ``ALLOWED_HOSTS``).
"""

from __future__ import annotations

from typing import Any, Final
from urllib.parse import urlsplit

from django.conf import settings

MCP_RESOURCES: Final[dict[str, str]] = {
    "/mcp/agents/": "The agents of your tenant",
    "/mcp/knowledge/": "The knowledge bases of your tenant",
}
"""Mount → what a token for it reaches (shown on the consent page and in Settings)."""

SCOPE: Final[str] = "mcp"
"""The one scope: use the MCP endpoint as the member who consented (their role's rights)."""
SCOPES: Final[dict[str, str]] = {SCOPE: "Use the MCP server as you: list and call its tools in the tenant you choose"}

PRM_PREFIX: Final[str] = "/.well-known/oauth-protected-resource"


def origin(request: Any = None, base_url: str = "") -> str:
    """The issuer's origin ``scheme://host`` (no trailing slash): ``settings.OAUTH_ISSUER``, else
    ``base_url``, else ``request``'s (a Django request)."""
    configured = (getattr(settings, "OAUTH_ISSUER", "") or "").rstrip("/")
    if configured:
        return configured
    if base_url:
        return base_url.rstrip("/")
    return request.build_absolute_uri("/").rstrip("/")


def resource_url(mount: str, base: str) -> str:
    """The identifier of the MCP endpoint ``mount`` (``/mcp/agents/``) at origin ``base``."""
    return f"{base}{mount}"


def metadata_url(mount: str, base: str) -> str:
    """The RFC 9728 protected-resource metadata URL of ``mount`` (path-inserted form)."""
    return f"{base}{PRM_PREFIX}{mount}"


def mount_of(path: str) -> str | None:
    """The mount ``path`` names (with or without its trailing slash), or None."""
    normal = path if path.endswith("/") else f"{path}/"
    return normal if normal in MCP_RESOURCES else None


def resource_mount(resource: str, base: str) -> str | None:
    """The mount of the resource identifier ``resource`` when it names one of our MCP endpoints
    at origin ``base`` (scheme and authority compared case-insensitively, no query or fragment),
    else None."""
    try:
        parts = urlsplit(resource)
        ours = urlsplit(base)
    except ValueError:
        return None
    if (
        parts.query
        or parts.fragment
        or (parts.scheme.lower(), parts.netloc.lower()) != (ours.scheme.lower(), ours.netloc.lower())
    ):
        return None
    return mount_of(parts.path)
