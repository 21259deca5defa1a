"""Slash commands in the chat app (issue 37), in Debian's Chromium, against the real ASGI app, a
real Celery worker (the MCP prompts are asked for there) and the scripted fake model: `/` opens
the list of the agent's commands (a tenant command and an MCP server's prompts), typing filters
it, Enter picks one; its form offers the server's completions; Insert puts the filled-in text
into the message box; `/name text` + Enter fills the free text and asks for the rest; Enter then
sends it. axe checks the open list."""

from __future__ import annotations

import pytest

from agents.models import CapabilityBinding, CapabilityKind
from agents.tests.factories import agent_with_route
from capabilities.commands.models import Command
from capabilities.models import McpServer
from capabilities.tests.prompts_test_server import serve_prompts
from frontend.tests.axe import assert_no_serious_axe_violations
from frontend.tests.test_chat_flows import T, _needs_chromium, log_in, open_page, shot, start_chat  # noqa: F401
from llm.testing import Reply

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.browser,
    pytest.mark.usefixtures("all_tenants_scope"),
]


def test_slash_commands_from_the_composer(world, fake_llm, celery_worker, live_server_url):
    from playwright.sync_api import expect

    agent = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], name="Writer")
    command = Command.all_tenants.create(
        tenant=world.tenant, name="translate", description="Translate a text.",
        template="Translate into $language:\n\n$ARGUMENTS",
        arguments=[{"name": "language", "description": "Into which language.", "required": True}])
    CapabilityBinding.all_tenants.create(tenant=world.tenant, agent=agent, kind="command", config={"command": command.pk})
    fake_llm.script(Reply("Guten Morgen."))
    with serve_prompts() as prompts:
        server = McpServer.all_tenants.create(tenant=world.tenant, name="Docs", alias="docs",
                                              transport="streamable_http", url=prompts.url, connect_timeout_seconds=10)
        CapabilityBinding.all_tenants.create(tenant=world.tenant, agent=agent, kind=CapabilityKind.MCP_SERVER,
                                             mcp_server=server)
        with open_page() as page:
            log_in(page, live_server_url, world.member.username)
            start_chat(page, "Writer")
            box = page.get_by_test_id("composer-input")
            box.fill("/")
            options = page.get_by_test_id("command-option")
            expect(options.first).to_have_attribute("data-name", "translate", timeout=T)
            expect(page.locator('[data-testid="command-option"][data-name="docs:review"]')).to_contain_text("Code review")
            assert box.get_attribute("aria-activedescendant") == options.first.get_attribute("id")
            page.mouse.move(5, 5)  # no hover in the screenshot
            shot(page, "chat-commands.png")
            assert_no_serious_axe_violations(page, label="the chat with the command list open")

            box.fill("/rev")  # filtered: the prompt's own name matches
            expect(options).to_have_count(1)
            box.press("Enter")
            form = page.get_by_test_id("command-form")
            code = page.get_by_test_id("command-arg-code")
            expect(code).to_be_focused()
            code.fill("print(1)")
            language = page.get_by_test_id("command-arg-language")
            language.fill("r")  # completion/complete on the server
            expect(page.get_by_test_id("command-arg-language-options").locator("option")).to_have_count(2, timeout=T)
            language.fill("rust")
            shot(page, "chat-command-form.png")
            page.get_by_test_id("command-insert").click()
            expect(box).to_have_value("Review this rust code:\n\nprint(1)", timeout=T)
            expect(form).to_have_count(0)

            box.fill("/translate Good morning")  # the free text; the required language is asked for
            box.press("Enter")
            expect(page.get_by_test_id("command-arg-ARGUMENTS")).to_have_value("Good morning", timeout=T)
            page.get_by_test_id("command-arg-language").fill("German")
            page.get_by_test_id("command-arg-language").press("Enter")
            expect(box).to_have_value("Translate into German:\n\nGood morning", timeout=T)
            expect(box).to_be_focused()
            box.press("Enter")
            expect(page.get_by_test_id("assistant-reply").last).to_have_text("Guten Morgen.", timeout=T)
    assert any("Translate into German:\\n\\nGood morning" in str(r["messages"]) for r in fake_llm.requests)
    assert ("language", "r", {"code": "print(1)"}) in prompts.state.completions
