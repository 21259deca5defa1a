"""Settings → Connections in Debian's Chromium (capabilities/mcp_oauth): an MCP server of the
tenant that needs each person's OAuth account (here the platform's own /mcp/knowledge/, on the
real ASGI app) is listed as not connected; Connect goes through the service's consent page and
back, and the panel says Connected; Disconnect revokes it. Another tenant's server is not listed.
With ``SCREENSHOTS=1`` it writes docs/chat-settings-connections.png (one server connected, one not)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from capabilities.mcp_oauth.models import McpOAuthConnection
from capabilities.models import McpServer
from frontend.tests.axe import assert_no_serious_axe_violations
from frontend.tests.test_chat_flows import DOCS, log_in, open_page

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


def test_connect_and_disconnect_an_oauth_mcp_server_from_settings(world, other_world, live_server_url, settings):
    from playwright.sync_api import expect

    settings.OUTBOUND_ALLOWED_CIDRS = ["127.0.0.1/32"]  # the "remote" server is this test's own
    server = McpServer.all_tenants.create(tenant=world.tenant, name="Our knowledge", alias="ourkb",
                                          transport="streamable_http", url=f"{live_server_url}/mcp/knowledge/",
                                          auth_mode="oauth_user")
    McpServer.all_tenants.create(tenant=world.tenant, name="Issue tracker", alias="issues", transport="streamable_http",
                                 url="https://mcp.example.com/issues", auth_mode="oauth_user")
    McpServer.all_tenants.create(tenant=other_world.tenant, name="Their secret server", alias="theirs",
                                 transport="streamable_http", url="https://mcp.example.com/mcp", auth_mode="oauth_user")
    with open_page() as page:  # (its event loop: no ORM calls inside)
        log_in(page, live_server_url, world.member.username)
        page.get_by_test_id("open-settings").click()
        panel = page.get_by_test_id("connections-panel")
        expect(panel.get_by_test_id("connection-item")).to_have_count(2, timeout=T)
        item = panel.get_by_test_id("connection-item").filter(has_text="Our knowledge")
        expect(item.get_by_test_id("connection-state")).to_have_text("Not connected")
        expect(panel).not_to_contain_text("Their secret server")
        assert_no_serious_axe_violations(page, label="settings with an MCP server to connect")

        item.get_by_test_id("connection-connect").click()
        expect(page.get_by_role("heading", level=1)).to_contain_text("wants to use", timeout=T)  # the consent page
        page.get_by_role("button", name="Allow").click()
        expect(page).to_have_url(f"{live_server_url}/#/settings", timeout=T)  # back; the notice read and removed
        panel = page.get_by_test_id("connections-panel")
        item = panel.get_by_test_id("connection-item").filter(has_text="Our knowledge")
        expect(panel.get_by_test_id("connections-status")).to_have_text("Connected.", timeout=T)
        expect(item.get_by_test_id("connection-state")).to_have_text("Connected", timeout=T)
        other = panel.get_by_test_id("connection-item").filter(has_text="Issue tracker")
        expect(other.get_by_test_id("connection-state")).to_have_text("Not connected")  # each server on its own
        expect(other.get_by_test_id("connection-connect")).to_be_visible()
        if os.environ.get("SCREENSHOTS"):  # docs/*.png are rewritten only on request
            panel.screenshot(path=str(DOCS / "chat-settings-connections.png"))

        item.get_by_test_id("connection-disconnect").click()
        expect(panel.get_by_test_id("connections-status")).to_have_text("Disconnected Our knowledge.", timeout=T)
        expect(item.get_by_test_id("connection-state")).to_have_text("Not connected")
    assert not McpOAuthConnection.all_tenants.filter(server=server).exists()
