"""Connected (OAuth) apps on the chat app's Settings page, in Debian's Chromium: an app the
member allowed on the consent page is listed with its MCP endpoint; revoking it (after a
confirmation) removes it, and its access token is refused at once; the panel shows the MCP URLs
an OAuth client needs. The consent page returns to a native app's private-use scheme. Real ASGI app (uvicorn, ``live_server_url``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.test import Client

from frontend.tests.axe import assert_no_serious_axe_violations
from frontend.tests.test_chat_flows import log_in, open_page
from oauth_server.tests import flow
from tenants.resolution import caller_resolve

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.browser,
    pytest.mark.usefixtures("all_tenants_scope"),
]

T = 20_000  # ms


@pytest.fixture(autouse=True)
def _needs_chromium():
    from frontend.tests.test_spa import CHROMIUM

    if not Path(CHROMIUM).exists():
        pytest.skip("Debian's chromium is not installed (scripts/ensure_chromium.sh installs it)")


def test_a_connected_app_is_listed_and_revoked_from_settings(world, other_world, live_server_url):
    from playwright.sync_api import expect

    _, token = flow.tokens_for(Client(), world.member_membership, resource="http://testserver/mcp/agents/",
                               name="Claude Desktop")
    flow.tokens_for(Client(), other_world.member_membership, resource="http://testserver/mcp/agents/",
                    name="Their secret IDE")
    assert caller_resolve(raw_token=token["access_token"], resource_path="/mcp/agents/") is not None
    with open_page() as page:  # (its event loop: no ORM calls inside)
        log_in(page, live_server_url, world.member.username)
        page.get_by_test_id("open-settings").click()
        panel = page.get_by_test_id("grants-panel")
        expect(panel.get_by_role("heading", name="Connected apps", level=2)).to_be_visible(timeout=T)
        item = panel.get_by_test_id("grant-item")
        expect(item).to_have_count(1, timeout=T)
        expect(item.get_by_test_id("grant-client")).to_have_text("Claude Desktop")
        expect(item.get_by_test_id("grant-resource")).to_have_text("Agents (MCP)")
        expect(panel).not_to_contain_text("Their secret IDE")
        expect(panel.get_by_test_id("oauth-agents-url")).to_have_text(live_server_url + "/mcp/agents/")
        expect(panel.get_by_test_id("oauth-knowledge-url")).to_have_text(live_server_url + "/mcp/knowledge/")
        assert_no_serious_axe_violations(page, label="settings with a connected app")

        item.get_by_test_id("grant-revoke").click()
        item.get_by_test_id("grant-revoke-cancel").click()
        expect(item.get_by_test_id("grant-revoke")).to_be_focused()
        item.get_by_test_id("grant-revoke").click()
        item.get_by_test_id("grant-revoke-confirm").click()
        expect(panel.get_by_test_id("grants-empty")).to_be_visible(timeout=T)
        expect(panel.get_by_test_id("grants-status")).to_have_text("Revoked “Claude Desktop”.")
    assert caller_resolve(raw_token=token["access_token"], resource_path="/mcp/agents/") is None


def test_the_consent_flow_in_the_browser_signs_in_on_the_chat_app(world, other_world, live_server_url):
    """An MCP client sends the browser to the authorization URL: signed out, the chat app's own
    sign-in appears, and after it the consent page (the app, the endpoint, the tenants to choose
    from, in the chat app's look); Allow returns to the client's redirect URI with a code."""
    from urllib.parse import parse_qs, urlencode, urlsplit

    from playwright.sync_api import expect

    from tenants.services import membership_create

    membership_create(tenant=other_world.tenant, user=world.member)
    registered = flow.register(Client(), name="Example IDE")
    resource = f"{live_server_url}/mcp/agents/"
    params = flow.authorize_params(registered["client_id"], resource, flow.pkce().challenge)
    with open_page() as page:
        page.route(flow.REDIRECT_URI + "*", lambda route: route.fulfill(status=200, body="the client got it"))
        page.goto(f"{live_server_url}/oauth/authorize/?{urlencode(params)}")
        page.get_by_test_id("login-username").fill(world.member.username)
        page.get_by_test_id("login-password").fill("pw-user-123")
        page.get_by_test_id("login-submit").click()
        heading = page.get_by_role("heading", level=1)
        expect(heading).to_have_text("Example IDE wants to use Agent Platform as you", timeout=T)
        expect(page.locator("main")).to_contain_text(resource)
        tenants = page.get_by_role("radio")
        expect(tenants).to_have_count(2)
        assert_no_serious_axe_violations(page, label="the OAuth consent page")
        page.get_by_label("Globex").check()
        page.get_by_role("button", name="Allow").click()
        page.wait_for_url(flow.REDIRECT_URI + "*", timeout=T)
        answer = parse_qs(urlsplit(page.url).query)
    assert answer["state"] == ["st-1"] and answer["code"] and answer["iss"] == [live_server_url]


def test_allow_returns_to_a_native_apps_private_use_scheme(world, live_server_url):
    """A native app's private-use redirect URI (RFC 8252 §7.1): the consent page's CSP
    ``form-action`` names its scheme (``com.example.ide:``), so Chromium follows Allow's
    redirect to it (no handler here: it reports the launch) instead of refusing it under
    the CSP (``open_page`` fails the test on a CSP report)."""
    from urllib.parse import urlencode

    from playwright.sync_api import expect

    redirect_uri = "com.example.ide:/oauth/callback"
    registered = flow.register(Client(), name="Native IDE", redirect_uri=redirect_uri)
    params = flow.authorize_params(
        registered["client_id"], f"{live_server_url}/mcp/agents/", flow.pkce().challenge, redirect_uri=redirect_uri
    )
    with open_page() as page:
        seen: list[str] = []
        page.on("console", lambda msg: seen.append(msg.text))
        page.on("request", lambda request: seen.append(request.url))
        page.goto(f"{live_server_url}/oauth/authorize/?{urlencode(params)}")
        page.get_by_test_id("login-username").fill(world.member.username)
        page.get_by_test_id("login-password").fill("pw-user-123")
        page.get_by_test_id("login-submit").click()
        expect(page.get_by_role("heading", level=1)).to_have_text(
            "Native IDE wants to use Agent Platform as you", timeout=T
        )
        page.get_by_role("button", name="Allow").click()
        page.wait_for_timeout(1500)  # the navigation to the scheme has no load event to wait for
        assert any(text.startswith(redirect_uri + "?code=") for text in seen), seen[-3:]
