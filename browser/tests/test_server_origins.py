"""Origin rules of a browser binding (issue 24): ``blocked_origins`` on the server backend
(real headless Chromium), blocked winning over allowed, and wildcard entries (``*.host``),
which no other test used.

The local site answers on 127.0.0.1 and on ``site.test`` (two origins of one server; the
``test_names`` fixture resolves the name for the server browser's address rules, which refuse
``localhost`` itself).
"""

from __future__ import annotations

import pytest

from browser.origins import origin_allowed
from browser.tests.site import LocalSite
from browser.tests.test_tools import run_tools
from browser.tools import BrowserNavigate
from capabilities.tools import ToolError

pytestmark = pytest.mark.usefixtures("all_tenants_scope")


def _navigate_outcomes(config: dict, urls: list[str]) -> list[str]:
    """Navigate to each of ``urls`` in turn on the server backend: ``"ok"`` or the ToolError's
    code (``origin_blocked`` with ``"redirected"`` when a redirect was refused)."""
    async def body(run, ctx, events, pool):
        outcomes = []
        for url in urls:
            try:
                await BrowserNavigate(run).execute({"url": url}, ctx())
                outcomes.append("ok")
            except ToolError as exc:
                outcomes.append(exc.code + (" redirected" if "redirected" in exc.message else ""))
        return outcomes

    return run_tools(config, body)


@pytest.mark.browser
@pytest.mark.usefixtures("needs_chromium", "test_names")
def test_server_backend_refuses_a_blocked_origin_and_lets_others_through():
    """Mutation: the server backend's ``_check_origin`` ignoring ``blocked_origins``
    (``blocked=[]``): every navigation here would be ``ok``."""
    with LocalSite() as site:
        outcomes = _navigate_outcomes({"backend": "server", "blocked_origins": [site.origin]}, [
            site.url("/login"),  # blocked
            site.alias_url("/login"),  # another origin: allowed (no allow-list)
            site.alias_url("/redirect?to=" + site.url("/search")),  # redirected into the blocked origin
        ])
    assert outcomes == ["origin_blocked", "ok", "origin_blocked redirected"]


@pytest.mark.browser
@pytest.mark.usefixtures("needs_chromium", "test_names")
def test_server_backend_blocked_wins_over_allowed():
    """Mutation: the same (``blocked=[]``): the allow-list alone would let it through."""
    with LocalSite() as site:
        outcomes = _navigate_outcomes(
            {"backend": "server", "allowed_origins": [site.origin, site.alias_origin], "blocked_origins": [site.origin]},
            [site.url("/login"), site.alias_url("/login")],
        )
    assert outcomes == ["origin_blocked", "ok"]


@pytest.mark.browser
@pytest.mark.usefixtures("needs_chromium", "test_names")
def test_server_backend_wildcard_entries_match_the_host_and_its_subdomains():
    """``*.site.test`` matches ``site.test`` itself (any scheme and port), not 127.0.0.1.

    Mutation: the ``*.`` branch of ``origins._matches`` removed (the entry is then compared
    as a plain host name and matches nothing)."""
    with LocalSite() as site:
        allowed = _navigate_outcomes({"backend": "server", "allowed_origins": ["*.site.test"]},
                                     [site.alias_url("/login"), site.url("/login")])
        blocked = _navigate_outcomes({"backend": "server", "blocked_origins": ["*.Site.Test"]},
                                     [site.alias_url("/login"), site.url("/login")])
    assert allowed == ["ok", "origin_blocked"]
    assert blocked == ["origin_blocked", "ok"]


def test_wildcard_rules_match_subdomains_but_not_lookalike_hosts():
    """Mutations: ``host.endswith(base)`` instead of ``host.endswith("." + base)`` (the
    look-alike ``notexample.com`` would match); the ``*.`` branch removed; blocked checked
    after allowed."""
    allow = ["*.example.com"]
    assert origin_allowed("https://example.com/", allowed=allow, blocked=[])
    assert origin_allowed("https://a.b.example.com:8443/x", allowed=allow, blocked=[])
    assert origin_allowed("http://API.Example.com/", allowed=allow, blocked=[])
    assert not origin_allowed("https://notexample.com/", allowed=allow, blocked=[])
    assert not origin_allowed("https://example.com.evil.net/", allowed=allow, blocked=[])
    # blocked wins, wildcards included
    assert not origin_allowed("https://shop.example.com/", allowed=allow, blocked=["*.shop.example.com"])
    assert origin_allowed("https://www.example.com/", allowed=allow, blocked=["*.shop.example.com"])
    assert not origin_allowed("https://x.example.com/", allowed=["https://x.example.com"], blocked=["*.example.com"])
    # no allow-list: everything not blocked
    assert origin_allowed("https://other.org/", allowed=[], blocked=["*.example.com"])
    assert not origin_allowed("https://deep.a.example.com/", allowed=[], blocked=["*.example.com"])
