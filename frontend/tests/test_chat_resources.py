"""MCP resources in the chat app (issue 37), in Debian's Chromium: typing "@" opens the picker
(a listbox the box controls, its active option named by aria-activedescendant), searching narrows it, the keyboard chooses, the resource shows
as a chip, a template's URI is filled in a small form (an unfilled one refused), and the sent message
carries them: the run reads them when it starts (the model's system
message holds its text) and the sent message shows it as a chip. A tool's result with embedded
resources shows its image and offers its PDF as a download. The picture of the open picker
is docs/chat-resources-picker.png, the answer's docs/chat-resources-answer.png (written with
``SCREENSHOTS=1``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agents.models import CapabilityBinding, CapabilityKind
from agents.tests.factories import agent_with_route
from capabilities.services import mcp_server_save
from capabilities.tests.mcp_test_server import README_TEXT, serve_mcp_http
from frontend.tests.axe import assert_no_serious_axe_violations
from frontend.tests.test_chat_flows import T, _needs_chromium, log_in, open_page, start_chat  # noqa: F401
from llm.testing import Reply, ToolCalls

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.browser,
    pytest.mark.usefixtures("all_tenants_scope"),
]

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_attach_a_resource_with_at(world, fake_llm, celery_worker, live_server_url):
    from playwright.sync_api import expect

    agent = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], name="Librarian")
    with serve_mcp_http() as mcp:
        server = mcp_server_save(tenant=world.tenant, env=None, name="docs", alias="docs",
                                 transport="streamable_http", url=mcp.url)
        CapabilityBinding.all_tenants.create(tenant=world.tenant, agent=agent, kind=CapabilityKind.MCP_SERVER,
                                             mcp_server=server)
        fake_llm.script(ToolCalls([("docs__resource_result", {})]), Reply("The launch is on Tuesday."))
        with open_page() as page:
            log_in(page, live_server_url, world.member.username)
            start_chat(page, "Librarian")
            box = page.get_by_test_id("composer-input")
            box.fill("When is the launch? @")
            box.press("End")
            box.type("proj")
            options = page.get_by_test_id("resource-option")
            expect(options).to_have_count(2, timeout=T)  # readme and logo: "project" in their titles
            expect(box).to_have_attribute("aria-activedescendant", options.first.get_attribute("id") or "")
            expect(options.first).to_have_attribute("aria-selected", "true")
            assert_no_serious_axe_violations(page, label="chat with the @ resource picker open")
            if os.environ.get("SCREENSHOTS"):
                page.screenshot(path=str(DOCS / "chat-resources-picker.png"))
            box.press("ArrowDown")
            expect(options.nth(1)).to_have_attribute("aria-selected", "true")
            box.press("ArrowUp")
            box.press("Enter")  # chooses; does not send
            chip = page.get_by_test_id("resource-chip")
            expect(chip).to_have_text("@Project readme×")
            expect(box).to_have_value("When is the launch? ")
            expect(page.get_by_test_id("resource-picker")).to_be_hidden()
            box.type("@any")  # the template "A note by name": its URI is filled in first
            expect(options).to_have_count(1, timeout=T)
            box.press("Enter")
            field = page.get_by_test_id("resource-template-input")
            expect(field).to_be_focused()
            expect(field).to_have_value("doc://notes/{name}")
            field.press("Enter")
            expect(page.get_by_test_id("resource-template-error")).to_contain_text("Replace every {…} part")
            field.fill("doc://notes/tuesday")
            field.press("Enter")
            expect(page.get_by_test_id("resource-chip")).to_have_count(2)
            expect(page.get_by_test_id("resource-chip").nth(1)).to_have_text("@doc://notes/tuesday×")
            expect(box).to_be_focused()
            expect(box).to_have_value("When is the launch? ")
            page.get_by_test_id("composer-send").click()
            expect(page.get_by_test_id("assistant-reply").last).to_have_text("The launch is on Tuesday.", timeout=T)
            expect(page.get_by_test_id("sent-resource-chip")).to_have_text(["@doc://notes/readme", "@doc://notes/tuesday"])
            expect(page.get_by_test_id("resource-chips").first).to_be_hidden()
            files = page.get_by_test_id("tool-files")
            expect(files.get_by_test_id("tool-image").locator("img")).to_have_attribute("alt", "chart.png (image/png)")
            expect(files.get_by_test_id("tool-download").locator("a")).to_have_text("Download report.pdf")
            expect(files.get_by_test_id("tool-resource-link")).to_contain_text("Project readme")
            if os.environ.get("SCREENSHOTS"):
                page.screenshot(path=str(DOCS / "chat-resources-answer.png"))
    assert mcp.state.reads == ["doc://notes/readme", "doc://notes/tuesday"]
    assert README_TEXT in fake_llm.requests[0]["messages"][0]["content"]
