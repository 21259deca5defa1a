"""API tokens on the chat app's Settings page, in Debian's Chromium: a member creates a token,
sees the raw token once, the token works against the real API, it is listed, revoked and then
refused; the page shows the knowledge and agents MCP servers' URLs and configurations to paste and
the A2A card URL pattern; an API
error (the token-issuing throttle) shows its message in the panel's alert region.

Real ASGI app (uvicorn, the `live_server_url` fixture); the token checks are plain HTTP
requests without the browser's cookies.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from frontend.tests.axe import assert_no_serious_axe_violations
from frontend.tests.test_chat_flows import log_in, open_page

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.browser,
    pytest.mark.usefixtures("all_tenants_scope"),
]

T = 20_000  # ms
DOCS = Path(__file__).resolve().parents[2] / "docs"


@pytest.fixture(autouse=True)
def _needs_chromium():
    from frontend.tests.test_spa import CHROMIUM

    if not Path(CHROMIUM).exists():
        pytest.skip("Debian's chromium is not installed (scripts/ensure_chromium.sh installs it)")


def _get_with_token(url: str, token: str) -> tuple[int, dict]:
    """GET ``url`` with ``Authorization: Bearer <token>`` and no cookies: (status, JSON body)."""
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}", "Accept": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:  # noqa: S310 (the test server's http URL)
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def _open_settings(page, live_server_url, username):
    from playwright.sync_api import expect

    log_in(page, live_server_url, username)
    page.get_by_test_id("open-settings").click()
    expect(page.get_by_test_id("tokens-panel")).to_be_visible(timeout=T)
    # The list has loaded: the fixture's member already has one unnamed token.
    expect(page.get_by_test_id("token-item")).to_have_count(1, timeout=T)


def test_create_use_list_and_revoke_a_token_from_settings(world, live_server_url):
    from playwright.sync_api import expect

    me_url = live_server_url + "/api/v1/auth/me/"
    with open_page() as page:
        _open_settings(page, live_server_url, world.member.username)
        panel = page.get_by_test_id("tokens-panel")
        expect(panel.get_by_role("heading", name="API tokens", level=2)).to_be_visible()
        expect(page.get_by_role("region", name="API tokens")).to_be_visible()  # section + aria-labelledby
        expect(panel).to_contain_text("act as you in this tenant")
        # The fixture's token (created without a name).
        first = panel.get_by_test_id("token-item").first
        expect(first.get_by_test_id("token-item-name")).to_have_text("Unnamed")
        expect(first).to_contain_text("Last used never")
        expect(first.get_by_test_id("token-state")).to_have_text("Active")

        # The MCP server's URL on this origin, and a configuration with a placeholder.
        expect(panel.get_by_test_id("mcp-url")).to_have_text(live_server_url + "/mcp/knowledge/")
        config = json.loads(panel.get_by_test_id("mcp-config").inner_text())
        assert config == {"mcpServers": {"agent-platform-knowledge": {
            "url": live_server_url + "/mcp/knowledge/", "headers": {"Authorization": "Bearer <your token>"}}}}
        # The agents' MCP server beside it, and the A2A URLs of an agent (the slug a placeholder).
        expect(panel.get_by_test_id("agents-mcp-url")).to_have_text(live_server_url + "/mcp/agents/")
        config = json.loads(panel.get_by_test_id("agents-mcp-config").inner_text())
        assert config == {"mcpServers": {"agent-platform-agents": {
            "url": live_server_url + "/mcp/agents/", "headers": {"Authorization": "Bearer <your token>"}}}}
        expect(panel.get_by_test_id("agents-connect")).to_contain_text("one tool per agent, named by the agent’s slug")
        expect(panel.get_by_test_id("a2a-card-url")).to_have_text(
            live_server_url + "/a2a/<agent slug>/.well-known/agent-card.json")
        expect(panel.get_by_test_id("a2a-jsonrpc-url")).to_have_text(live_server_url + "/a2a/<agent slug>/")
        expect(panel.get_by_test_id("agents-connect")).to_contain_text("A2A-Version: 1.0")

        # Create a token: the raw token shows once, with the warning and a Copy button.
        name_input = panel.get_by_label("Token name")
        expect(name_input).to_have_attribute("maxlength", "100")
        name_input.fill("Claude Desktop")
        panel.get_by_role("button", name="Create token").click()
        box = panel.get_by_test_id("token-new")
        expect(box).to_be_visible(timeout=T)
        expect(box).to_contain_text("Copy it now: it will not be shown again.")
        expect(box.get_by_test_id("token-copy")).to_be_focused()
        raw = box.get_by_test_id("token-secret").inner_text().strip()
        assert raw.startswith("ap_") and len(raw) > 40, raw
        expect(panel.get_by_test_id("tokens-error")).to_be_hidden()

        # Copy puts it on the clipboard (the page may use it: open_page grants the permission).
        box.get_by_role("button", name="Copy", exact=True).click()
        expect(box.get_by_test_id("token-copy-status")).to_have_text("Copied to the clipboard.")
        assert page.evaluate("() => navigator.clipboard.readText()") == raw

        # The OpenAI client's snippet too (its base URL on this origin).
        expect(panel.get_by_test_id("openai-url")).to_have_text(live_server_url + "/api/openai/v1")
        snippet = panel.get_by_test_id("openai-snippet").inner_text()
        assert f'OpenAI(base_url="{live_server_url}/api/openai/v1", api_key="{raw}")' in snippet, snippet

        # The configuration now carries the new token.
        config = json.loads(panel.get_by_test_id("mcp-config").inner_text())
        assert config["mcpServers"]["agent-platform-knowledge"]["headers"] == {"Authorization": f"Bearer {raw}"}
        config = json.loads(panel.get_by_test_id("agents-mcp-config").inner_text())
        assert config["mcpServers"]["agent-platform-agents"]["headers"] == {"Authorization": f"Bearer {raw}"}
        panel.get_by_test_id("agents-mcp-config-copy").click()
        expect(panel.get_by_test_id("agents-connect")).to_contain_text("Copied to the clipboard.")
        assert json.loads(page.evaluate("() => navigator.clipboard.readText()")) == config

        # Listed first (newest first), with its prefix, never used, active.
        items = panel.get_by_test_id("token-item")
        expect(items).to_have_count(2, timeout=T)
        new = items.first
        expect(new.get_by_test_id("token-item-name")).to_have_text("Claude Desktop")
        expect(new.get_by_test_id("token-prefix")).to_have_text(raw[:10] + "…")
        expect(new).to_contain_text("Last used never")
        expect(new.get_by_test_id("token-state")).to_have_text("Active")

        assert_no_serious_axe_violations(page, label="settings with a new API token")
        if os.environ.get("SCREENSHOTS"):  # docs/*.png are rewritten only on request
            DOCS.mkdir(exist_ok=True)
            # The panel whole and unscrolled: taller than it (~2,000 px with the MCP and A2A
            # snippets), else the element screenshot scrolls it under the shell's sticky header.
            page.set_viewport_size({"width": 1280, "height": 2800})
            page.evaluate("() => window.scrollTo(0, 0)")
            panel.screenshot(path=str(DOCS / "chat-settings-tokens.png"))
            page.set_viewport_size({"width": 1280, "height": 800})

        # The token works against the real API: it acts as this member in this tenant.
        status, body = _get_with_token(me_url, raw)
        assert status == 200, body
        assert body["user"]["username"] == world.member.username
        assert body["tenant"]["slug"] == world.tenant.slug

        # After a reload the raw token is gone for good; the list shows that it was used.
        page.reload()
        panel = page.get_by_test_id("tokens-panel")
        expect(panel.get_by_test_id("token-item")).to_have_count(2, timeout=T)
        expect(panel.get_by_test_id("token-new")).to_be_hidden()
        assert raw not in panel.inner_text()
        new = panel.get_by_test_id("token-item").first
        expect(new.get_by_test_id("token-item-name")).to_have_text("Claude Desktop")
        expect(new).not_to_contain_text("Last used never")

        # Revoke, after an inline confirmation (Cancel first: nothing happens).
        new.get_by_role("button", name="Revoke").click()
        expect(new.get_by_test_id("token-confirm")).to_contain_text("Revoke “Claude Desktop”?")
        new.get_by_test_id("token-revoke-cancel").click()
        expect(new.get_by_test_id("token-confirm")).to_have_count(0)
        expect(new.get_by_test_id("token-revoke")).to_be_focused()
        assert _get_with_token(me_url, raw)[0] == 200
        new.get_by_test_id("token-revoke").click()
        new.get_by_test_id("token-revoke-confirm").click()
        revoked = panel.locator('[data-testid="token-item"][data-status="revoked"]')
        expect(revoked).to_have_count(1, timeout=T)
        expect(revoked.get_by_test_id("token-item-name")).to_have_text("Claude Desktop")
        expect(revoked.get_by_test_id("token-state")).to_contain_text("Revoked ")
        expect(revoked.get_by_role("button")).to_have_count(0)  # no Revoke on a revoked token
        expect(panel.get_by_test_id("tokens-status")).to_have_text("Revoked “Claude Desktop”.")
        # The other token is untouched.
        expect(panel.locator('[data-testid="token-item"][data-status="active"]')).to_have_count(1)

        # The same token is refused from now on.
        status, body = _get_with_token(me_url, raw)
        assert status == 401, body
        assert body["message"] == "Invalid or revoked token."
        status, _ = _get_with_token(live_server_url + "/api/v1/tokens/", raw)
        assert status == 401


def test_an_api_error_on_create_shows_its_message_in_the_alert_region(world, live_server_url, settings):
    from playwright.sync_api import expect

    settings.API_THROTTLE_RATES = {**settings.API_THROTTLE_RATES, "tokens.user": "1/hour"}
    with open_page(color_scheme="dark") as page:
        _open_settings(page, live_server_url, world.member.username)
        panel = page.get_by_test_id("tokens-panel")
        panel.get_by_label("Token name").fill("First")
        panel.get_by_role("button", name="Create token").click()
        expect(panel.get_by_test_id("token-new")).to_be_visible(timeout=T)
        expect(panel.get_by_test_id("token-item")).to_have_count(2, timeout=T)

        panel.get_by_label("Token name").fill("Second")
        panel.get_by_role("button", name="Create token").click()
        alert = panel.get_by_role("alert")
        expect(alert).to_be_visible(timeout=T)
        expect(alert).to_contain_text("Request was throttled")
        expect(alert).to_have_attribute("data-testid", "tokens-error")
        # Nothing was issued: the list is unchanged, the name stays in the field to try later.
        expect(panel.get_by_test_id("token-item")).to_have_count(2)
        expect(panel.get_by_label("Token name")).to_have_value("Second")
        expect(panel.get_by_role("button", name="Create token")).to_be_enabled()
        assert_no_serious_axe_violations(page, label="settings (dark) with a token error")
