"""Per-binding origin rules (the extension's ``protocol.js`` implements the same rule).

Entries are origins (``https://example.com``, ``http://127.0.0.1:8000``) or host patterns
with a leading wildcard (``*.example.com``: the host and every subdomain, any scheme/port).
``blocked_origins`` wins over ``allowed_origins``; an empty ``allowed_origins`` allows every
origin not blocked. ``about:blank`` and ``data:``-less internal pages are always allowed
(they carry no site data).

These rules are the tenant's own. They never widen the platform's address rules: the server
browser reaches only public addresses (web_fetch's rules, :mod:`browser.proxy`), whatever an
entry here names.
"""

from __future__ import annotations

from urllib.parse import urlsplit


def origin_of(url: str) -> str:
    """``scheme://host[:port]`` of ``url`` (lowercase; default ports dropped)."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    host = (parts.hostname or "").lower()
    port = parts.port
    if port is None or (scheme, port) in {("http", 80), ("https", 443)}:
        return f"{scheme}://{host}"
    return f"{scheme}://{host}:{port}"


def _matches(entry: str, url: str) -> bool:
    entry = entry.strip().lower().rstrip("/")
    if entry.startswith("*."):
        host = (urlsplit(url).hostname or "").lower()
        base = entry[2:]
        return host == base or host.endswith("." + base)
    return origin_of(url) == origin_of(entry) if "://" in entry else (urlsplit(url).hostname or "").lower() == entry


def origin_allowed(url: str, *, allowed: list[str] | tuple[str, ...], blocked: list[str] | tuple[str, ...]) -> bool:
    """Whether the binding's rules let the agent act on a page at ``url``."""
    if url in ("", "about:blank") or url.startswith("chrome://newtab"):
        return True
    if any(_matches(b, url) for b in blocked):
        return False
    return not allowed or any(_matches(a, url) for a in allowed)


def origin_config_errors(config: dict) -> list[str]:
    """What is wrong with a browser binding's ``config`` (``[]`` when valid)."""
    errors = []
    unknown = set(config) - {"backend", "fallback_to_server", "allowed_origins", "blocked_origins"}
    if unknown:
        errors.append(f"Unknown keys: {', '.join(sorted(unknown))}.")
    if config.get("backend", "extension") not in ("extension", "server"):
        errors.append("'backend' must be \"extension\" or \"server\".")
    if not isinstance(config.get("fallback_to_server", False), bool):
        errors.append("'fallback_to_server' must be true or false.")
    for key in ("allowed_origins", "blocked_origins"):
        value = config.get(key, [])
        if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
            errors.append(f"'{key}' must be a list of origins like \"https://example.com\" or \"*.example.com\".")
            continue
        for v in value:
            if not v.startswith("*.") and "://" in v and not urlsplit(v).hostname:
                errors.append(f"'{key}': {v!r} is not an origin.")
    return errors
