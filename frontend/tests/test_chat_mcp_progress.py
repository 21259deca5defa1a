"""An MCP tool's progress in the chat app (issue 37), in Debian's Chromium: while the call runs,
the tool card shows a determinate progress bar (the server gave a total) with the server's
message; once the call ends, bar and message go. With ``SCREENSHOTS=1`` it writes
docs/chat-tool-progress.png (the run with the bar half way)."""

from __future__ import annotations

import os
import re

import pytest

from agents.models import CapabilityBinding, CapabilityKind
from agents.tests.factories import agent_with_route
from capabilities.services import mcp_server_save
from capabilities.tests.prog_test_server import serve_prog
from frontend.tests.test_chat_flows import DOCS, T, _needs_chromium, ask, log_in, open_page, start_chat  # noqa: F401
from llm.testing import Reply, ToolCalls

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.browser,
    pytest.mark.usefixtures("all_tenants_scope"),
]


def test_the_tool_card_shows_an_mcp_servers_progress_bar(world, fake_llm, celery_worker, live_server_url):
    from playwright.sync_api import expect

    agent = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], name="Stepper")
    with serve_prog() as (url, _state):
        server = mcp_server_save(tenant=world.tenant, env=None, name="prog", alias="prog",
                                 transport="streamable_http", url=url)
        CapabilityBinding.all_tenants.create(tenant=world.tenant, agent=agent, kind=CapabilityKind.MCP_SERVER,
                                             mcp_server=server)
        fake_llm.script(ToolCalls([("prog__steps", {"n": 4, "delay": 1.0})]), Reply("All steps done."))
        with open_page() as page:
            log_in(page, live_server_url, world.member.username)
            start_chat(page, "Stepper")
            ask(page, "Take the steps")
            card = page.get_by_test_id("tool-call-card")
            bar = card.get_by_test_id("tool-progress-bar")
            expect(bar).to_be_visible(timeout=T)
            expect(bar).to_have_attribute("max", "4")
            expect(card.get_by_test_id("tool-progress")).to_contain_text("of 4")
            expect(bar).to_have_attribute("aria-valuetext", re.compile(r"^(25|50|75|100)%$"))  # determinate
            if os.environ.get("SCREENSHOTS"):  # docs/*.png are rewritten only on request
                expect(bar).to_have_attribute("aria-valuetext", "50%")  # each step lasts a second
                page.get_by_test_id("run").last.screenshot(path=str(DOCS / "chat-tool-progress.png"))
            expect(card).to_have_attribute("data-status", "succeeded", timeout=T)
            expect(bar).to_be_hidden()
            expect(page.get_by_test_id("assistant-reply").last).to_have_text("All steps done.", timeout=T)
