"""The browser tools on the server-side backend (real headless Chromium through Playwright):
approval for password fields, origins, snapshot budget, argument errors, idle contexts."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from django.core.exceptions import ValidationError

from agents.models import CapabilityBinding, CapabilityKind
from agents.tests.factories import AgentFactory
from browser.server_backend import ServerBrowserPool
from browser.tests.site import LocalSite
from browser.tools import (
    BrowserClick,
    BrowserConfig,
    BrowserGetText,
    BrowserNavigate,
    BrowserPress,
    BrowserRun,
    BrowserSnapshot,
    BrowserType,
    ServerBackend,
)
from capabilities.tools import ApprovalRequired, ToolContext, ToolError
from llm.tokens import estimate_text_tokens

pytestmark = [
    pytest.mark.browser,
    pytest.mark.usefixtures("needs_chromium"),
    pytest.mark.usefixtures("all_tenants_scope"),
]


class _PoolBackend(ServerBackend):
    """The server backend on a pool of the test's own (closed at the end)."""

    def __init__(self, pool: ServerBrowserPool) -> None:
        super().__init__(tenant_id=1, session_id=1)
        self.pool = pool

    async def execute(self, op, params, *, deadline_ms, idempotency_key):
        return await self.pool.execute(key="t1.s1", op=op, params=params, deadline_ms=deadline_ms,
                                       idempotency_key=idempotency_key)


def run_tools(config: dict[str, Any], body) -> Any:
    async def main():
        pool = ServerBrowserPool()
        events: list[tuple[str, dict]] = []

        async def publish(kind, data):
            events.append((kind, data))

        counter = iter(range(1, 1000))

        def ctx(approved=False):
            return ToolContext(tenant_id=1, session_id=1, run_id=1, tool_call_id=next(counter), publish=publish,
                               user_id=1, approved=approved)

        run = BrowserRun(config=BrowserConfig.from_json(config), backend_override=_PoolBackend(pool))
        try:
            return await body(run, ctx, events, pool)
        finally:
            await pool.shutdown()

    return asyncio.run(main())


def ref(text: str, pattern: str) -> str:
    import re

    match = re.search(r"\[ref=(e\d+)\] " + pattern, text)
    assert match, text
    return match.group(1)


def test_typing_a_password_needs_approval_and_acts_once_approved():
    with LocalSite() as site:
        async def body(run, ctx, events, pool):
            await BrowserNavigate(run).execute({"url": site.url("/login")}, ctx())
            snap = (await BrowserSnapshot(run).execute({}, ctx())).content
            pw = ref(snap, r'textbox "Password" type=password')
            with pytest.raises(ApprovalRequired) as info:
                await BrowserType(run).execute({"ref": pw, "text": "hunter2"}, ctx())
            assert info.value.reason == f"Typing into a password field on {site.origin}"
            page = pool._sessions["t1.s1"].current
            assert await page.input_value("input[name=pw]") == ""  # nothing typed before approval
            result = await BrowserType(run).execute({"ref": pw, "text": "hunter2"}, ctx(approved=True))
            assert await page.input_value("input[name=pw]") == "hunter2"
            assert "value=•••" in result.content and "hunter2" not in result.content
            with pytest.raises(ApprovalRequired):  # Enter in the focused password field submits the form
                await BrowserPress(run).execute({"keys": "Enter"}, ctx())
            assert page.url.endswith("/login")
            with pytest.raises(ApprovalRequired):
                await BrowserClick(run).execute({"ref": ref(snap, r'button "Sign in"')}, ctx())
            done = await BrowserClick(run).execute({"ref": ref(snap, r'button "Sign in"')}, ctx(approved=True))
            assert "/welcome" in done.content
            return [d["status"] for kind, d in events if kind == "browser_operation"]

        statuses = run_tools({}, body)
        assert statuses.count("awaiting_approval") == 3


def test_server_backend_refuses_blocked_origins_and_redirects(test_names):
    with LocalSite() as site:
        async def body(run, ctx, events, pool):
            with pytest.raises(ToolError) as info:
                await BrowserNavigate(run).execute({"url": site.alias_url("/search")}, ctx())
            assert info.value.code == "origin_blocked"
            with pytest.raises(ToolError) as info:
                await BrowserNavigate(run).execute({"url": site.url("/redirect?to=" + site.alias_url("/x"))}, ctx())
            assert info.value.code == "origin_blocked" and "redirected" in info.value.message

        run_tools({"allowed_origins": [site.origin]}, body)


def test_snapshot_respects_its_token_budget_and_lists_visible_elements_first():
    with LocalSite() as site:
        async def body(run, ctx, events, pool):
            await BrowserNavigate(run).execute({"url": site.url("/form")}, ctx())
            full = await BrowserSnapshot(run).execute({}, ctx())
            small = await BrowserSnapshot(run).execute({"max_tokens": 100}, ctx())
            return full, small

        full, small = run_tools({}, body)
        body_lines = small.content.splitlines()[2:]
        assert estimate_text_tokens("\n".join(body_lines[:-1])) <= 100
        assert body_lines[-1].startswith("[… ") and "more elements" in body_lines[-1]
        assert full.data["tokens"] <= 2000 and 'button "Send"' in full.content
        assert 'combobox "Country"' in full.content and 'radio "Sales"' in full.content


def test_bad_arguments_are_tool_errors_the_model_can_fix():
    run = BrowserRun(config=BrowserConfig())
    ctx = ToolContext(tenant_id=1, session_id=1, run_id=1, tool_call_id=1)
    for tool, args in ((BrowserNavigate(run), {"url": "file:///etc/passwd"}), (BrowserClick(run), {}),
                       (BrowserType(run), {"ref": "e1"}), (BrowserGetText(run), {"max_chars": 0})):
        with pytest.raises(ToolError) as info:
            asyncio.run(tool.execute(args, ctx))
        assert info.value.code == "invalid_arguments"


def test_idle_session_contexts_are_closed():
    with LocalSite() as site:
        async def body(run, ctx, events, pool):
            await BrowserNavigate(run).execute({"url": site.url("/counter")}, ctx())
            assert pool.session_keys() == ["t1.s1"]
            assert await pool.close_idle(idle_seconds=3600) == 0
            assert await pool.close_idle(idle_seconds=0) == 1
            assert pool.session_keys() == []
            # The next call opens a fresh context (no tab yet).
            with pytest.raises(ToolError) as info:
                await BrowserSnapshot(run).execute({}, ctx())
            assert info.value.code == "no_tab"

        run_tools({}, body)


@pytest.mark.django_db
def test_browser_binding_config_is_validated(world):
    agent = AgentFactory(tenant=world.tenant)
    good = CapabilityBinding(tenant=world.tenant, agent=agent, kind=CapabilityKind.BROWSER, config={
        "backend": "server", "allowed_origins": ["https://example.com", "*.example.org"], "blocked_origins": [],
    })
    good.full_clean()
    for config in ({"backend": "cloud"}, {"allowed_origins": "https://example.com"}, {"fallback_to_server": "yes"},
                   {"colour": "blue"}):
        bad = CapabilityBinding(tenant=world.tenant, agent=agent, kind=CapabilityKind.BROWSER, config=config)
        with pytest.raises(ValidationError) as info:
            bad.full_clean()
        assert "config" in info.value.message_dict
