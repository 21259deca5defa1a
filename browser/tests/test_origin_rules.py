"""The origin rules of a browser binding as functions (browser/origins.py): an origin's port,
the pages always allowed, and the validation of a binding's config. No browser: the server
backend's use of them is tested in ``test_server_origins.py``.

Written from ``make mutation``'s origins target (issue 35): its survivors were these rules,
which only the Chromium tests reached, and ``origin_config_errors``, which no test of the
target ran.
"""

from __future__ import annotations

import pytest

from browser.origins import origin_allowed, origin_config_errors, origin_of


def test_an_origin_keeps_a_non_default_port_and_drops_the_default_one():
    """Mutations: the port dropped (every port of a host one origin); http's default port kept."""
    assert origin_of("http://127.0.0.1:8000/a?b") == "http://127.0.0.1:8000"
    assert origin_of("HTTP://Example.COM:80/x") == "http://example.com"
    assert origin_of("https://example.com:443/") == "https://example.com"
    assert origin_of("https://example.com:80/") == "https://example.com:80"


def test_an_origin_entry_matches_its_port_only():
    allowed = ["http://127.0.0.1:8000"]
    assert origin_allowed("http://127.0.0.1:8000/login", allowed=allowed, blocked=[])
    assert not origin_allowed("http://127.0.0.1:9000/login", allowed=allowed, blocked=[])
    assert not origin_allowed("http://127.0.0.1/login", allowed=allowed, blocked=[])
    assert origin_allowed("http://example.com:80/", allowed=["http://example.com"], blocked=[])
    assert not origin_allowed("http://127.0.0.1:8000/x", allowed=[], blocked=["http://127.0.0.1:8000/"])
    assert origin_allowed("https://127.0.0.1:8000/x", allowed=[], blocked=["http://127.0.0.1:8000/"])  # another scheme
    # a plain host entry: that host, any scheme and port
    assert origin_allowed("https://example.com:8443/", allowed=["Example.com"], blocked=[])


@pytest.mark.parametrize("url", ["", "about:blank", "chrome://newtab/"])
def test_a_page_with_no_site_is_always_allowed(url):
    """The page before any navigation (``""``), ``about:blank`` and a new tab carry no site
    data: allowed whatever the rules say."""
    assert origin_allowed(url, allowed=["https://example.com"], blocked=["*.example.com"])


def test_a_valid_config_has_no_errors():
    assert origin_config_errors({}) == []
    assert (
        origin_config_errors(
            {
                "backend": "server",
                "fallback_to_server": True,
                "allowed_origins": ["https://example.com", "*.example.org", "intranet"],
                "blocked_origins": ["http://127.0.0.1:8000"],
            }
        )
        == []
    )
    assert origin_config_errors({"backend": "extension", "fallback_to_server": False}) == []


@pytest.mark.parametrize(
    ("config", "error"),
    [
        ({"backend": "server", "extra": 1, "other": 2}, "Unknown keys: extra, other."),
        ({"backend": "cloud"}, '\'backend\' must be "extension" or "server".'),
        ({"fallback_to_server": "yes"}, "'fallback_to_server' must be true or false."),
        (
            {"allowed_origins": "https://example.com"},
            '\'allowed_origins\' must be a list of origins like "https://example.com" or "*.example.com".',
        ),
        (
            {"blocked_origins": ["https://example.com", "  "]},
            '\'blocked_origins\' must be a list of origins like "https://example.com" or "*.example.com".',
        ),
        (
            {"blocked_origins": [3]},
            '\'blocked_origins\' must be a list of origins like "https://example.com" or "*.example.com".',
        ),
        ({"allowed_origins": ["https://"]}, "'allowed_origins': 'https://' is not an origin."),
    ],
)
def test_an_invalid_config_says_what_is_wrong(config, error):
    assert origin_config_errors(config) == [error]
