"""The chat app as people use it (issue 25), in Debian's Chromium: each test does what a person
does (clicks, types, presses Esc, drops and pastes files) against the real ASGI app, a real
Celery worker and the scripted fake model, and checks what they would see. axe-core runs on
the chat app's pages (login, chat list, a chat with Markdown + a tool card + an approval card,
settings, dark mode)."""

from __future__ import annotations

import contextlib
import os
import re
from datetime import timedelta
from pathlib import Path

import pytest

from agents.tests.factories import AgentFactory, agent_with_route, bind_builtin
from frontend.tests.axe import assert_no_serious_axe_violations
from frontend.tests.test_spa import CHROMIUM, LAUNCH_ARGS
from llm.testing import Fail, Reply, ToolCalls

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.browser,
    pytest.mark.usefixtures("all_tenants_scope"),
]

ARTIFACTS = Path(__file__).resolve().parents[2] / "var" / "test-artifacts"
T = 20_000  # ms: how long a person would wait for an answer here

MARKDOWN_REPLY = """## Trip plan

Here is **the plan** for *Kyoto*, with a [map](https://example.com/map) and `inline code`:

- Day 1: temples
- Day 2: markets

| Day | Place | Cost |
|-----|-------|-----:|
| 1 | Kinkaku-ji | ¥500 |
| 2 | Nishiki | ¥2,000 |

<img src="x" onerror="window.__pwned = 1"><script>window.__pwned = 2</script>

```python
def budget(days: int) -> int:
    return days * 12000  # yen
```
"""


@pytest.fixture(autouse=True)
def _needs_chromium():
    if not Path(CHROMIUM).exists():
        pytest.skip("Debian's chromium is not installed (scripts/ensure_chromium.sh installs it)")


@contextlib.contextmanager
def open_page(*, color_scheme: str = "light", viewport=(1280, 800)):
    """A Chromium page whose origin may use the clipboard. Start it after the test's database
    work (Playwright's sync API runs an event loop in this thread)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=LAUNCH_ARGS)
        try:
            context = browser.new_context(viewport={"width": viewport[0], "height": viewport[1]},
                                          color_scheme=color_scheme)
            context.grant_permissions(["clipboard-read", "clipboard-write"])
            page = context.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            # A CSP report from the app's own code (an inline style or script) is a bug. Chromium
            # also reports "inline event handler" when DOMPurify parses a model's `onerror=` in
            # its inert document: blocked, never run (the Markdown test checks), so not counted.
            page.on("console", lambda msg: errors.append(msg.text) if (
                msg.type == "error" and "Content Security" in msg.text and "inline event handler" not in msg.text
            ) else None)
            page.js_errors = errors
            yield page
            assert not errors, f"errors in the page: {errors}"
        finally:
            browser.close()


def log_in(page, base_url, username, password="pw-user-123"):
    page.goto(base_url + "/")
    page.get_by_test_id("login-username").fill(username)
    page.get_by_test_id("login-password").fill(password)
    page.get_by_test_id("login-submit").click()
    from playwright.sync_api import expect

    expect(page.get_by_test_id("new-chat")).to_be_visible()


def start_chat(page, agent_name):
    page.get_by_test_id("new-chat").click()
    page.get_by_test_id("agent-search").fill(agent_name)
    page.locator(f'[data-testid="agent-option"][data-agent-name="{agent_name}"]').click()


def ask(page, text):
    page.get_by_test_id("composer-input").fill(text)
    page.get_by_test_id("composer-send").click()


def shot(page, name):
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / name))


# ----------------------------------------------------------------------------- markdown --


def test_markdown_reply_code_block_copy_and_axe_on_the_chat(world, fake_llm, celery_worker, live_server_url):
    from playwright.sync_api import expect

    import sessions.tests.tools_for_tests  # noqa: F401  (test_echo)

    agent = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], name="Planner")
    bind_builtin(agent, "test_echo", approval_policy=[{"pattern": "test_echo", "action": "ask"}])
    fake_llm.script(Reply(MARKDOWN_REPLY, chunk_size=40),
                    ToolCalls([("test_echo", {"text": "book the hotel"})]),
                    Reply("Booked."))
    with open_page() as page:
        log_in(page, live_server_url, world.member.username)
        start_chat(page, "Planner")
        ask(page, "Plan my trip")
        reply = page.get_by_test_id("assistant-reply").last
        expect(page.get_by_test_id("run").last).to_have_attribute("data-run-status", "completed", timeout=T)
        # What a person sees: a heading, bold text, a list, a table, a safe link, a highlighted code block.
        expect(reply.locator("h2")).to_have_text("Trip plan")
        expect(reply.locator("strong")).to_have_text("the plan")
        expect(reply.locator("em")).to_have_text("Kyoto")
        expect(reply.locator("ul > li")).to_have_count(2)
        expect(reply.locator("table tbody tr")).to_have_count(2)
        expect(reply.locator("table tbody tr").first.locator("td").nth(1)).to_have_text("Kinkaku-ji")
        link = reply.get_by_role("link", name="map")
        expect(link).to_have_attribute("target", "_blank")
        expect(link).to_have_attribute("rel", "noopener noreferrer")
        assert "**" not in reply.inner_text() and "|-----|" not in reply.inner_text()
        # Raw HTML from the model is sanitised: no script ran, no handler survived.
        assert page.evaluate("() => window.__pwned") is None
        assert reply.locator("script").count() == 0 and reply.locator("[onerror]").count() == 0
        block = reply.locator(".code-block")
        expect(block.locator(".code-lang")).to_have_text("python")
        expect(block.locator(".hljs-keyword").first).to_have_text("def")
        expect(block.locator("pre")).to_contain_text("return days * 12000  # yen")
        # Copy, by keyboard: the button is focusable.
        expect(block.get_by_role("button", name="Copy python code")).to_have_count(1)
        copy = block.locator(".code-copy")
        copy.focus()
        page.keyboard.press("Enter")
        expect(copy).to_have_text("Copied")
        assert page.evaluate("() => navigator.clipboard.readText()") == (
            "def budget(days: int) -> int:\n    return days * 12000  # yen\n")
        # The reply is announced once complete (live region), not token by token.
        expect(page.get_by_test_id("reply-announcer")).to_contain_text("Planner replied: ## Trip plan")
        shot(page, "chat-markdown.png")

        # A tool card and an approval card in the same chat, then axe on the whole chat page.
        ask(page, "Book the hotel")
        card = page.get_by_test_id("approval-card").last
        expect(card).to_contain_text("Allow test_echo?", timeout=T)
        assert_no_serious_axe_violations(page, label="chat with markdown and a pending approval card")
        card.get_by_test_id("approval-approve").click()
        expect(page.get_by_test_id("assistant-reply").last).to_have_text("Booked.", timeout=T)
        tool = page.get_by_test_id("tool-call-card").last
        expect(tool.locator(".tool-name")).to_have_text("Echoed “book the hotel”")
        expect(tool.locator(".tool-raw-name")).to_have_text("test_echo")
        # The raw JSON stays behind a fold.
        args = tool.locator("details").first
        expect(args.locator("pre")).to_be_hidden()
        args.locator("summary").click()
        expect(args.locator("pre")).to_contain_text('"text": "book the hotel"')
        assert_no_serious_axe_violations(page, label="chat with markdown, a tool card and an approval card")


def test_an_unclosed_fence_styles_only_its_own_block(world, live_server_url):
    """While a reply streams, an open ``` fence is a code block from there on; the text before
    it keeps its formatting (the renderer the chat uses, on the live page)."""
    with open_page() as page:
        log_in(page, live_server_url, world.member.username)
        result = page.evaluate("""async () => {
            const { renderRichText } = await import('/static/frontend/richtext.js');
            const box = document.createElement('div');
            box.append(renderRichText('Intro with **bold** and a list:\\n\\n- one\\n\\n```js\\nconst a = 1;\\nconst b'));
            return {
                strong: box.querySelector('strong')?.textContent,
                items: box.querySelectorAll('li').length,
                blocks: box.querySelectorAll('.code-block').length,
                lang: box.querySelector('.code-lang')?.textContent,
                code: box.querySelector('.code-block pre')?.textContent,
                outside: box.querySelector('.code-block')?.previousElementSibling?.tagName,
            };
        }""")
        assert result == {"strong": "bold", "items": 1, "blocks": 1, "lang": "js",
                          "code": "const a = 1;\nconst b\n", "outside": "UL"}


def test_tool_cards_read_as_plain_language(world, live_server_url):
    """The labels tool cards carry, from the tool name and its arguments (chat.js toolLabel)."""
    with open_page() as page:
        log_in(page, live_server_url, world.member.username)
        labels = page.evaluate("""async () => {
            const { toolLabel } = await import('/static/frontend/chat.js');
            return [
                toolLabel('get_current_time', { timezone: 'Asia/Tokyo' }),
                toolLabel('web_search', '{"query": "ramen near Kyoto station"}'),
                toolLabel('todo_write', { todos: [] }),
                toolLabel('doc_write', { op: 'patch', id: 3, title: 'Plan' }),
                toolLabel('update_record', { id: 'r1' }),
                toolLabel('frobnicate', {}),
            ];
        }""")
        assert labels == [
            "Looked up the time in Asia/Tokyo",
            "Searched for “ramen near Kyoto station”",
            "Updated the plan",
            "Edited a document “Plan”",
            "Used update record (r1)",
            "Used frobnicate",
        ]


# --------------------------------------------------------------------------------- stop --


def test_stop_with_esc_keeps_the_partial_answer_after_a_reload(world, fake_llm, celery_worker, live_server_url):
    from playwright.sync_api import expect

    agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], name="Talker", read_timeout_seconds=60)
    fake_llm.script(Reply("word " * 400, chunk_size=5, chunk_interval_seconds=0.05))
    with open_page() as page:
        log_in(page, live_server_url, world.member.username)
        start_chat(page, "Talker")
        ask(page, "Talk a lot")
        reply = page.get_by_test_id("assistant-reply").last
        expect(reply).to_contain_text("word word word", timeout=T)
        # While it works, Send has become Stop.
        expect(page.get_by_test_id("composer-stop")).to_be_visible()
        expect(page.get_by_test_id("composer-send")).to_be_hidden()
        shot(page, "chat-stop-button.png")
        page.keyboard.press("Escape")
        run = page.get_by_test_id("run").last
        expect(run).to_have_attribute("data-run-status", "cancelled", timeout=T)
        expect(page.get_by_test_id("stopped-chip")).to_be_visible()
        expect(page.get_by_test_id("run-stopped-text")).to_have_text("You stopped this answer.")
        expect(page.get_by_test_id("composer-stop")).to_be_hidden()
        expect(page.get_by_test_id("composer-send")).to_be_visible()
        stopped_text = reply.inner_text()
        assert stopped_text.startswith("word word") and len(stopped_text) < len("word " * 400)
        assert page.get_by_test_id("run-error").count() == 0  # stopping is not an error

        page.reload()
        reply = page.get_by_test_id("assistant-reply").last
        expect(reply).to_contain_text("word word word", timeout=T)
        expect(page.get_by_test_id("stopped-chip")).to_be_visible()
        assert len(reply.inner_text()) >= len(stopped_text) - 30  # what was on screen was kept


def test_the_stop_button_stops_a_run(world, fake_llm, celery_worker, live_server_url):
    from playwright.sync_api import expect

    agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], name="Slow", read_timeout_seconds=60)
    fake_llm.script(Reply("slowly " * 300, chunk_size=4, chunk_interval_seconds=0.05))
    with open_page() as page:
        log_in(page, live_server_url, world.member.username)
        start_chat(page, "Slow")
        ask(page, "go")
        expect(page.get_by_test_id("assistant-reply").last).to_contain_text("slowly", timeout=T)
        page.get_by_test_id("composer-stop").click()
        expect(page.get_by_test_id("run").last).to_have_attribute("data-run-status", "cancelled", timeout=T)
        expect(page.get_by_test_id("assistant-reply").last).to_contain_text("slowly")


def test_stop_before_any_text_then_ask_again(world, fake_llm, celery_worker, live_server_url):
    from playwright.sync_api import expect

    from llm.testing import Hang

    agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], name="Ponderer", read_timeout_seconds=60)
    fake_llm.script(Hang(30), Reply("Here now."))
    with open_page() as page:
        log_in(page, live_server_url, world.member.username)
        start_chat(page, "Ponderer")
        ask(page, "think hard")
        expect(page.get_by_test_id("composer-stop")).to_be_visible(timeout=T)
        page.get_by_test_id("composer-stop").click()
        expect(page.get_by_test_id("run")).to_have_attribute("data-run-status", "cancelled", timeout=T)
        expect(page.get_by_test_id("run-stopped-text")).to_have_text("You stopped this request before an answer.")
        expect(page.get_by_test_id("assistant-reply")).to_have_count(0)
        page.get_by_test_id("retry-stopped").click()
        expect(page.get_by_test_id("assistant-reply").last).to_have_text("Here now.", timeout=T)
        expect(page.get_by_test_id("run")).to_have_count(1)


# ---------------------------------------------------------------------- message actions --


def test_copy_regenerate_and_edit_messages(world, fake_llm, celery_worker, live_server_url):
    from playwright.sync_api import expect

    agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], name="Poet")
    fake_llm.script(Reply("First poem."), Reply("Second poem."), Reply("A haiku about rain."),
                    Reply("And the sea."))
    with open_page() as page:
        log_in(page, live_server_url, world.member.username)
        start_chat(page, "Poet")
        ask(page, "Write a poem")
        expect(page.get_by_test_id("assistant-reply").last).to_have_text("First poem.", timeout=T)
        ask(page, "Another one")
        expect(page.get_by_test_id("assistant-reply").last).to_have_text("Second poem.", timeout=T)

        # Copy a reply and a message of mine.
        page.get_by_test_id("copy-reply").first.click()
        expect(page.get_by_test_id("copy-reply").first).to_have_text("Copied")
        assert page.evaluate("() => navigator.clipboard.readText()") == "First poem."
        page.get_by_test_id("copy-user").last.click()
        assert page.evaluate("() => navigator.clipboard.readText()") == "Another one"

        # Regenerate is offered on the last answer only; it replaces that answer.
        expect(page.get_by_test_id("regenerate")).to_have_count(2)
        expect(page.get_by_test_id("regenerate").first).to_be_hidden()
        page.get_by_test_id("regenerate").last.click()
        expect(page.get_by_test_id("assistant-reply").last).to_have_text("A haiku about rain.", timeout=T)
        expect(page.get_by_test_id("run")).to_have_count(2)
        expect(page.get_by_test_id("run").last).to_have_attribute("data-run-status", "completed", timeout=T)

        # Edit the first message: it and everything after it is replaced (truncation).
        page.get_by_test_id("edit-message").first.click()
        page.get_by_test_id("edit-input").fill("Write a poem about the sea")
        page.get_by_test_id("edit-save").click()
        expect(page.get_by_test_id("assistant-reply").last).to_have_text("And the sea.", timeout=T)
        expect(page.get_by_test_id("run")).to_have_count(1)
        expect(page.get_by_test_id("user-message")).to_have_text("Write a poem about the sea")
        page.reload()
        expect(page.get_by_test_id("run")).to_have_count(1, timeout=T)
        expect(page.get_by_test_id("assistant-reply")).to_have_text("And the sea.")
    # The model saw the edited message alone, not the replaced exchange.
    last = fake_llm.requests[-1]["messages"]
    assert [m["content"] for m in last if m["role"] == "user"] == ["Write a poem about the sea"]


def test_a_failed_run_offers_retry_in_plain_words(world, fake_llm, celery_worker, live_server_url):
    from playwright.sync_api import expect

    agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], name="Flaky")
    fake_llm.script(Fail(500, body={"error": {"message": "boom"}}), Reply("Now it works."))
    with open_page() as page:
        log_in(page, live_server_url, world.member.username)
        start_chat(page, "Flaky")
        ask(page, "hello?")
        error = page.get_by_test_id("run-error")
        expect(error).to_contain_text("The AI model could not be reached.", timeout=T)
        expect(page.get_by_test_id("run-error-next")).to_have_text(
            "Try again in a minute. If it keeps failing, tell your workspace admin.")
        expect(page.get_by_test_id("continue-with-summary")).to_have_count(0)
        page.get_by_test_id("retry-run").click()
        expect(page.get_by_test_id("assistant-reply").last).to_have_text("Now it works.", timeout=T)
        expect(page.get_by_test_id("run-error")).to_have_count(0)


def test_a_chat_too_long_offers_a_new_chat_with_a_summary(world, fake_llm, celery_worker, live_server_url):
    from playwright.sync_api import expect

    from sessions.models import Message, Run
    from sessions.services import chat_session_create, message_post
    from tenants.scoping import tenant_scope

    agent = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], name="Historian")
    with tenant_scope(world.tenant.pk):
        session = chat_session_create(user=world.member, agent=agent)
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr("sessions.tasks.run_enqueue", lambda *a, **k: None)
            first = message_post(session=session, user=world.member, content="Tell me about the Meiji era")
            Run.objects.filter(pk=first.pk).update(status="completed", reply="It began in 1868.")
            Message.objects.create(tenant_id=session.tenant_id, session=session, run=first, role="assistant",
                                   content="It began in 1868.", position=99)
            second = message_post(session=session, user=world.member, content="And then?")
        Run.objects.filter(pk=second.pk).update(
            status="failed", reason="context_window",
            error="The conversation does not fit any model of the route: too long")
    fake_llm.script(Reply("Continuing from the summary."))
    with open_page() as page:
        log_in(page, live_server_url, world.member.username)
        page.get_by_test_id("session-item").first.click()
        expect(page.get_by_test_id("run-error")).to_contain_text("This chat has become too long for the model.",
                                                                 timeout=T)
        page.get_by_test_id("continue-with-summary").click()
        expect(page.get_by_test_id("session-item")).to_have_count(2)
        draft = page.get_by_test_id("composer-input")
        expect(draft).to_have_value(re.compile("User: Tell me about the Meiji era"), timeout=T)
        expect(draft).to_have_value(re.compile("Assistant: It began in 1868."))
        page.get_by_test_id("composer-send").click()
        expect(page.get_by_test_id("assistant-reply").last).to_have_text("Continuing from the summary.", timeout=T)
        assert page.url.rstrip("/").split("/")[-1] != str(session.pk)


# --------------------------------------------------------------------------------- chats --


def test_new_chat_picker_with_190_agents_search_and_pin(world, fake_llm, celery_worker, live_server_url):
    from playwright.sync_api import expect

    route_agent = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], name="Agent 000")
    for i in range(1, 190):
        AgentFactory(tenant=world.tenant, route=route_agent.route, name=f"Agent {i:03d}",
                     description=f"Helps with topic {i}")
    fake_llm.script(Reply("Hi from 137."))
    with open_page() as page:
        log_in(page, live_server_url, world.member.username)
        page.get_by_test_id("new-chat").click()
        picker = page.get_by_test_id("agent-picker")
        expect(picker).to_be_visible()
        expect(picker.get_by_test_id("agent-option")).to_have_count(190)
        expect(picker.locator(".agent-count")).to_have_text("190 agents")
        page.keyboard.type("topic 137")  # the search box has the focus
        expect(picker.get_by_test_id("agent-option")).to_have_count(1)
        expect(picker.locator(".agent-count")).to_have_text("1 of 190 agents match")
        picker.get_by_test_id("agent-pin").click()
        page.get_by_test_id("agent-search").fill("")
        expect(picker.locator(".agent-group").first.locator(".agent-group-title")).to_have_text("Pinned")
        expect(picker.locator(".agent-group").first.get_by_test_id("agent-option")).to_have_attribute(
            "data-agent-name", "Agent 137")
        assert_no_serious_axe_violations(page, label="the New chat dialog")
        page.keyboard.press("Escape")
        expect(picker).to_be_hidden()
        # Pinned survives a reload (localStorage); picking opens the chat.
        page.reload()
        page.get_by_test_id("new-chat").click()
        first = picker.locator(".agent-group").first
        expect(first.locator(".agent-group-title")).to_have_text("Pinned")
        page.get_by_test_id("agent-search").press("ArrowDown")
        page.keyboard.press("Enter")
        expect(page.get_by_test_id("composer-input")).to_be_visible()
        expect(page.locator(".chat-agent")).to_have_text("Agent 137")
        ask(page, "hello")
        expect(page.get_by_test_id("assistant-reply").last).to_have_text("Hi from 137.", timeout=T)
        page.get_by_test_id("new-chat").click()
        expect(picker.locator(".agent-group").nth(0).locator(".agent-group-title")).to_have_text("Pinned")


def test_chat_list_groups_search_rename_delete_undo_and_badges(world, fake_llm, live_server_url):
    from django.utils import timezone
    from playwright.sync_api import expect

    from sessions.models import Approval, ChatSession, Message, Run, ToolCall
    from sessions.services import chat_session_create, message_post
    from tenants.scoping import tenant_scope

    agent = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], name="Helper")
    now = timezone.now()
    with tenant_scope(world.tenant.pk), pytest.MonkeyPatch.context() as mp:
        mp.setattr("sessions.tasks.run_enqueue", lambda *a, **k: None)
        made = {}
        for title, age_days, text in (("Kyoto trip", 0, "hotels in Kyoto"), ("Tax return", 1, "my taxes"),
                                      ("Garden plan", 3, "tomatoes"), ("Old notes", 60, "notes")):
            s = chat_session_create(user=world.member, agent=agent)
            run = message_post(session=s, user=world.member, content=text)
            Run.objects.filter(pk=run.pk).update(status="completed", reply="ok")
            Message.objects.create(tenant_id=s.tenant_id, session=s, run=run, role="assistant",
                                   content="Bring an umbrella" if title == "Garden plan" else "ok", position=50)
            made[title] = (s, run)
            ChatSession.objects.filter(pk=s.pk).update(title=title, updated_at=now - timedelta(days=age_days))
        # "Tax return" waits for an approval: a badge, and a count in the tab title.
        s, run = made["Tax return"]
        Run.objects.filter(pk=run.pk).update(status="awaiting_approval")
        call = ToolCall.objects.create(tenant=world.tenant, run=run, turn=0, call_id="c1", name="file_taxes")
        Approval.objects.create(tenant=world.tenant, run=run, tool_call=call, tool_name="file_taxes",
                                expires_at=now + timedelta(hours=1))
    with open_page() as page:
        log_in(page, live_server_url, world.member.username)
        groups = page.get_by_test_id("session-group")
        expect(groups).to_have_count(4)
        assert [g.get_attribute("data-group") for g in groups.all()] == [
            "Today", "Yesterday", "Previous 7 days", "Older"]
        expect(page.get_by_test_id("session-item").first).to_contain_text("Kyoto trip")
        badge = page.get_by_test_id("session-badge")
        expect(badge).to_have_count(1)
        expect(badge).to_have_text("Needs you")
        expect(page).to_have_title("(1) Agent Platform")
        assert_no_serious_axe_violations(page, label="the chat list")

        # Search finds titles and message content (server-side).
        page.get_by_test_id("chat-search").fill("umbrella")
        expect(page.get_by_test_id("session-item")).to_have_count(1)
        expect(page.get_by_test_id("session-item")).to_contain_text("Garden plan")
        page.get_by_test_id("chat-search").fill("zzz-nothing")
        expect(page.locator(".session-list")).to_contain_text("No chats match “zzz-nothing”.")
        page.get_by_test_id("chat-search").fill("")
        expect(page.get_by_test_id("session-item")).to_have_count(4)
        # Keyboard: Ctrl+K focuses the search, Ctrl+Shift+O opens the New chat dialog.
        page.locator("#main").focus()
        page.keyboard.press("Control+k")
        expect(page.get_by_test_id("chat-search")).to_be_focused()
        page.keyboard.press("Control+Shift+O")
        expect(page.get_by_test_id("agent-picker")).to_be_visible()
        expect(page.get_by_test_id("agent-search")).to_be_focused()
        page.keyboard.press("Escape")
        expect(page.get_by_test_id("agent-picker")).to_be_hidden()

        # Rename inline.
        row = page.locator(".session-row", has_text="Garden plan")
        row.hover()
        row.get_by_test_id("session-rename").click()
        page.get_by_test_id("rename-input").fill("Vegetable garden")
        page.get_by_test_id("rename-input").press("Enter")
        expect(page.get_by_test_id("session-item").filter(has_text="Vegetable garden")).to_have_count(1)

        # Delete, then Undo from the toast.
        row = page.locator(".session-row", has_text="Old notes")
        row.hover()
        row.get_by_test_id("session-delete").click()
        expect(page.get_by_test_id("session-item")).to_have_count(3)
        expect(page.get_by_test_id("toast").last).to_contain_text("Deleted “Old notes”.")
        page.get_by_test_id("toast-action").click()
        expect(page.get_by_test_id("session-item")).to_have_count(4)
        # Delete for good this time: gone after a reload too.
        row = page.locator(".session-row", has_text="Kyoto trip")
        row.hover()
        row.get_by_test_id("session-delete").click()
        expect(page.get_by_test_id("session-item")).to_have_count(3)
        page.reload()
        expect(page.get_by_test_id("session-item")).to_have_count(3, timeout=T)
        expect(page.get_by_test_id("session-item").filter(has_text="Vegetable garden")).to_have_count(1)
        expect(page.get_by_test_id("session-item").filter(has_text="Kyoto trip")).to_have_count(0)
    assert ChatSession.all_tenants.get(pk=made["Kyoto trip"][0].pk).deleted_at is not None
    assert ChatSession.all_tenants.get(pk=made["Old notes"][0].pk).deleted_at is None


def test_a_title_is_made_from_the_first_message(world, fake_llm, celery_worker, live_server_url):
    from playwright.sync_api import expect

    agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], name="Helper")
    fake_llm.script(Reply("Sure."))
    with open_page() as page:
        log_in(page, live_server_url, world.member.username)
        start_chat(page, "Helper")
        ask(page, "**Please** compare the three largest cloud providers for a small team in Europe")
        expect(page.get_by_test_id("assistant-reply").last).to_have_text("Sure.", timeout=T)
        expect(page.locator("#chat-title")).to_have_text("Please compare the three largest cloud providers for a small…")
        expect(page.get_by_test_id("session-item").first).to_contain_text("Please compare the three largest")


# ------------------------------------------------------------ composer during a run --


def test_a_message_sent_during_a_run_is_queued(world, fake_llm, celery_worker, live_server_url):
    from playwright.sync_api import expect

    agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], name="Queuer", read_timeout_seconds=60)
    fake_llm.script(Reply("one " * 60, chunk_size=4, chunk_interval_seconds=0.05), Reply("Second answer."))
    with open_page() as page:
        log_in(page, live_server_url, world.member.username)
        start_chat(page, "Queuer")
        ask(page, "first")
        expect(page.get_by_test_id("assistant-reply").last).to_contain_text("one one", timeout=T)
        composer = page.get_by_test_id("composer-input")
        expect(composer).to_be_enabled()
        composer.fill("second, while you work")
        expect(page.get_by_test_id("composer-send")).to_have_text("Queue")
        page.get_by_test_id("composer-send").click()
        second = page.get_by_test_id("run").nth(1)
        expect(second.get_by_test_id("run-chip")).to_have_text("Queued")
        expect(page.get_by_test_id("run").first).to_have_attribute("data-run-status", "completed", timeout=T)
        expect(second.get_by_test_id("assistant-reply")).to_have_text("Second answer.", timeout=T)
        expect(second.get_by_test_id("run-chip")).to_be_hidden()


def test_a_message_sent_during_a_run_is_steered(world, fake_llm, celery_worker, live_server_url):
    from playwright.sync_api import expect

    import sessions.tests.tools_for_tests  # noqa: F401  (test_sleep)

    agent = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], name="Steerable",
                             message_mode="steer", read_timeout_seconds=60)
    bind_builtin(agent, "test_sleep")
    fake_llm.script(ToolCalls([("test_sleep", {"seconds": 3})]), Reply("Done, and I read your note."))
    with open_page() as page:
        log_in(page, live_server_url, world.member.username)
        start_chat(page, "Steerable")
        ask(page, "work for a bit")
        expect(page.get_by_test_id("tool-call-card")).to_have_attribute("data-status", "running", timeout=T)
        page.get_by_test_id("composer-input").fill("also mention the weather")
        expect(page.get_by_test_id("composer-send")).to_have_text("Steer")
        page.get_by_test_id("composer-send").click()
        second = page.get_by_test_id("run").nth(1)
        expect(second.get_by_test_id("run-chip")).to_have_text("Steered")
        expect(page.get_by_test_id("assistant-reply").first).to_have_text("Done, and I read your note.", timeout=T)
    # The model read the steered message in the same run.
    assert any(m.get("content") == "also mention the weather" for m in fake_llm.requests[-1]["messages"])


def test_deny_with_a_reason(world, fake_llm, celery_worker, live_server_url):
    from playwright.sync_api import expect

    import sessions.tests.tools_for_tests  # noqa: F401  (test_echo)

    agent = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], name="Asker")
    bind_builtin(agent, "test_echo", approval_policy=[{"pattern": "test_echo", "action": "ask"}])
    fake_llm.script(ToolCalls([("test_echo", {"text": "delete everything"})]), Reply("Understood, I will not."))
    with open_page() as page:
        log_in(page, live_server_url, world.member.username)
        start_chat(page, "Asker")
        ask(page, "clean up")
        card = page.get_by_test_id("approval-card")
        expect(card).to_contain_text("Allow test_echo?", timeout=T)
        card.get_by_test_id("approval-deny-reason").fill("too risky on a Friday")
        card.get_by_test_id("approval-deny").click()
        expect(card.get_by_test_id("approval-outcome")).to_have_text("Denied — too risky on a Friday")
        expect(page.get_by_test_id("assistant-reply").last).to_have_text("Understood, I will not.", timeout=T)
    tool_message = [m for m in fake_llm.requests[-1]["messages"] if m["role"] == "tool"][-1]
    assert "too risky on a Friday" in tool_message["content"]


# ---------------------------------------------------------------------------- attachments --


def test_attach_drop_and_paste_files_then_see_them_in_the_files_panel(world, fake_llm, celery_worker,
                                                                      live_server_url, tmp_path):
    from playwright.sync_api import expect

    agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], name="Reader")
    fake_llm.script(Reply("I read your notes."), Reply("Nice picture."))
    notes = tmp_path / "notes.txt"
    notes.write_text("Buy milk\nCall Anna\n")
    with open_page() as page:
        log_in(page, live_server_url, world.member.username)
        start_chat(page, "Reader")
        # Attach with the button (a file chooser).
        with page.expect_file_chooser() as chooser:
            page.get_by_test_id("composer-attach").click()
        chooser.value.set_files(str(notes))
        expect(page.get_by_test_id("attachment-chip")).to_have_count(1)
        expect(page.get_by_test_id("attachment-chip")).to_contain_text("notes.txt")
        # Drop a second file onto the conversation.
        page.evaluate("""() => {
            const dt = new DataTransfer();
            dt.items.add(new File(['a,b\\n1,2\\n'], 'table.csv', { type: 'text/csv' }));
            const target = document.querySelector('.chat-main');
            for (const type of ['dragenter', 'dragover', 'drop']) {
                target.dispatchEvent(new DragEvent(type, { dataTransfer: dt, bubbles: true, cancelable: true }));
            }
        }""")
        expect(page.get_by_test_id("attachment-chip")).to_have_count(2)
        # Remove one again, by keyboard-reachable button.
        page.get_by_role("button", name="Remove table.csv").click()
        expect(page.get_by_test_id("attachment-chip")).to_have_count(1)
        ask(page, "What is on my list?")
        expect(page.get_by_test_id("assistant-reply").last).to_have_text("I read your notes.", timeout=T)
        expect(page.get_by_test_id("attachment-chip")).to_have_count(0)
        expect(page.get_by_test_id("user-message").last).to_contain_text('"notes.txt", text/plain, 19 B]')

        # Paste an image into the composer.
        page.get_by_test_id("composer-input").focus()
        page.evaluate("""() => {
            const png = Uint8Array.from(atob('iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=='), c => c.charCodeAt(0));
            const dt = new DataTransfer();
            dt.items.add(new File([png], 'pixel.png', { type: 'image/png' }));
            document.querySelector('#composer-input').dispatchEvent(
                new ClipboardEvent('paste', { clipboardData: dt, bubbles: true, cancelable: true }));
        }""")
        expect(page.get_by_test_id("attachment-chip")).to_contain_text("pixel.png")
        ask(page, "And this?")
        expect(page.get_by_test_id("assistant-reply").last).to_have_text("Nice picture.", timeout=T)

        page.get_by_test_id("files-toggle").click()
        panel = page.get_by_test_id("files-panel")
        expect(panel.get_by_test_id("file-artifact")).to_have_count(2)
        expect(panel).to_contain_text("notes.txt")
        expect(panel).to_contain_text("pixel.png")
        expect(panel.locator("img.file-thumb")).to_have_count(1)
    # The model was offered the text file's content, and the image as a reference.
    first_user = [m for m in fake_llm.requests[0]["messages"] if m["role"] == "user"][-1]["content"]
    assert '[attachment: artifact:' in first_user and "Buy milk\nCall Anna" in first_user
    second_user = [m for m in fake_llm.requests[1]["messages"] if m["role"] == "user"][-1]["content"]
    assert '[image: artifact:' in second_user and '"pixel.png", image/png' in second_user


def test_an_oversized_attachment_is_refused_clearly(world, fake_llm, live_server_url, settings):
    from playwright.sync_api import expect

    settings.ATTACHMENT_MAX_BYTES = 1000
    agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], name="Reader")
    with open_page() as page:
        log_in(page, live_server_url, world.member.username)
        start_chat(page, "Reader")
        page.get_by_test_id("composer-file").set_input_files(
            files=[{"name": "big.txt", "mimeType": "text/plain", "buffer": b"x" * 5000}])
        expect(page.get_by_test_id("attachment-chip")).to_have_count(1)
        ask(page, "read it")
        expect(page.get_by_test_id("toast").last).to_contain_text("“big.txt” is larger than 0 MB.")
        expect(page.get_by_test_id("run")).to_have_count(0)
        expect(page.get_by_test_id("composer-input")).to_have_value("read it")


def test_a_document_written_by_the_agent_opens_in_the_files_panel(world, fake_llm, celery_worker,
                                                                  live_server_url):
    from playwright.sync_api import expect

    agent = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], name="Writer")
    bind_builtin(agent, "doc_write")
    fake_llm.script(
        ToolCalls([("doc_write", {"op": "create", "title": "Packing list",
                                  "content": "# Packing\n\n- passport\n- **umbrella**\n"})]),
        Reply("I wrote your packing list."),
    )
    with open_page() as page:
        log_in(page, live_server_url, world.member.username)
        start_chat(page, "Writer")
        ask(page, "make me a packing list")
        expect(page.get_by_test_id("assistant-reply").last).to_have_text("I wrote your packing list.", timeout=T)
        card = page.get_by_test_id("tool-call-card")
        expect(card.locator(".tool-name")).to_have_text("Wrote a document “Packing list”")
        card.get_by_test_id("tool-doc-open").click()
        view = page.get_by_test_id("document-view")
        expect(view.locator("h3")).to_have_text("Packing list")
        expect(view.locator("h1")).to_have_text("Packing")
        expect(view.locator("strong")).to_have_text("umbrella")
        expect(page.get_by_test_id("file-document")).to_have_count(1)


# ------------------------------------------------------- plain language, usage, settings --


def test_retries_fold_into_one_quiet_line_members_switch_them_on(world, fake_llm, second_fake_llm, celery_worker,
                                                                  live_server_url):
    from playwright.sync_api import expect

    agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url, second_fake_llm.base_url], name="Routed")
    fake_llm.script(Fail(500), Fail(500))
    second_fake_llm.script(Reply("Answered by the fallback."), Reply("Again by the fallback."))
    with open_page() as page:
        log_in(page, live_server_url, world.member.username)
        start_chat(page, "Routed")
        ask(page, "hello?")
        expect(page.get_by_test_id("assistant-reply").last).to_have_text("Answered by the fallback.", timeout=T)
        notices = page.locator(".model-notices")
        expect(notices).to_be_hidden()  # members: hidden by default
        page.get_by_test_id("open-settings").click()
        page.get_by_test_id("show-model-notices").check()
        page.go_back()
        expect(notices).to_be_visible(timeout=T)
        expect(notices.locator("summary")).to_have_text("1 model switch")
        expect(page.get_by_test_id("model-notice")).to_be_hidden()  # folded
        notices.locator("summary").click()
        expect(page.get_by_test_id("model-notice")).to_have_text(
            "Switched from model-0 to model-1 after a server error.")


def test_usage_dark_mode_skip_link_and_axe_on_settings_and_login(world, fake_llm, celery_worker, live_server_url):
    from playwright.sync_api import expect

    from llm.metering import CallSite
    from llm.records import AttemptRecord
    from sessions.llm_calls import llm_calls_record
    from tenants.scoping import tenant_scope

    counter = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], name="Counter")
    fake_llm.script(Reply("Counted.", usage=(1200, 34)))
    # A chat title made by the model for this member earlier (a call outside a run's turns).
    # (Before the page opens: Playwright's loop in this thread refuses the ORM's calls.)
    with tenant_scope(world.tenant.pk):
        llm_calls_record(site=CallSite(tenant_id=world.tenant.pk, purpose="title", user_id=world.member.pk,
                                         agent_id=counter.pk),
                         attempts=[AttemptRecord(entry_index=0, attempt=1, provider_name="p", model="m",
                                                 status="succeeded", error_class=None, error="", latency_ms=5,
                                                 first_token_ms=None, prompt_tokens=40, completion_tokens=6,
                                                 usage_estimated=False, cost_usd_micros=0, retry_wait_ms=0)])
    with open_page(color_scheme="dark") as page:
        page.goto(live_server_url + "/")
        expect(page.get_by_test_id("login-username")).to_be_visible()
        # The system is dark: so is the app (no setting chosen yet).
        bg = page.evaluate("() => getComputedStyle(document.body).backgroundColor")
        assert bg == "rgb(20, 23, 28)", bg
        assert_no_serious_axe_violations(page, label="login (dark)")
        log_in(page, live_server_url, world.member.username)
        start_chat(page, "Counter")
        ask(page, "count")
        expect(page.get_by_test_id("assistant-reply").last).to_have_text("Counted.", timeout=T)
        expect(page.get_by_test_id("chat-usage")).to_have_text("1.2k tokens · $0.00", timeout=T)
        expect(page.get_by_test_id("usage-month")).to_contain_text("1,280 tokens", timeout=T)
        assert_no_serious_axe_violations(page, label="chat (dark)")
        shot(page, "chat-dark.png")

        # Skip link: it jumps to the composer of the open chat.
        skip = page.get_by_test_id("skip-link")
        skip.focus()
        expect(skip).to_be_visible()  # shown when focused
        page.keyboard.press("Enter")
        expect(page.get_by_test_id("composer-input")).to_be_focused()
        # On a fresh page it is the first Tab stop.
        page.goto(live_server_url + "/#/")
        page.reload()  # a fresh document: focus starts at its top
        expect(page.get_by_test_id("home-new-chat")).to_be_visible()
        page.keyboard.press("Tab")
        expect(skip).to_be_focused()
        page.keyboard.press("Enter")
        expect(page.locator("#main")).to_be_focused()

        page.get_by_test_id("open-settings").click()
        expect(page.get_by_test_id("usage-total")).to_contain_text("1,280 tokens (1,240 in, 40 out)")
        expect(page.get_by_test_id("usage-by-agent").locator("tbody tr")).to_have_text(
            [re.compile(r"^Counter1,280\$")])
        expect(page.get_by_test_id("usage-by-purpose").locator("tbody tr")).to_have_text(  # equal costs: by purpose
            [re.compile(r"^Chat titles46\$0\.0000$"), re.compile(r"^Answers in chats1,234\$0\.0000$")])
        assert_no_serious_axe_violations(page, label="settings (dark)")
        page.get_by_test_id("theme-light").check()
        expect(page.locator("html")).to_have_attribute("data-theme", "light")
        page.wait_for_timeout(500)  # colour transitions of buttons end
        assert page.evaluate("() => getComputedStyle(document.body).backgroundColor") == "rgb(246, 247, 249)"
        assert_no_serious_axe_violations(page, label="settings (light)")
        page.reload()
        expect(page.get_by_test_id("theme-light")).to_be_checked(timeout=T)
        page.get_by_test_id("theme-dark").check()
        expect(page.locator("html")).to_have_attribute("data-theme", "dark")
        page.get_by_test_id("logout").click()
        expect(page.get_by_test_id("login-username")).to_be_visible()
        assert_no_serious_axe_violations(page, label="login (dark setting)")


def test_axe_on_login_and_chat_list_light(world, live_server_url):
    from playwright.sync_api import expect

    with open_page() as page:
        page.goto(live_server_url + "/")
        expect(page.get_by_test_id("login-username")).to_be_visible()
        assert_no_serious_axe_violations(page, label="login")
        log_in(page, live_server_url, world.member.username)
        assert_no_serious_axe_violations(page, label="home / empty chat list")


# --------------------------------------------------------------------- README screenshots --

screenshots = pytest.mark.skipif(not os.environ.get("SCREENSHOTS"), reason="set SCREENSHOTS=1 to write docs/*.png")
DOCS = Path(__file__).resolve().parents[2] / "docs"


@screenshots
def test_readme_screenshots(world, fake_llm, celery_worker, live_server_url):
    """docs/chat-markdown.png (Markdown + a code block) and docs/chat-tool-stop.png (a tool card
    and the Stop button during a run), from the running app."""
    from playwright.sync_api import expect

    import sessions.tests.tools_for_tests  # noqa: F401

    agent = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], name="Trip planner",
                             description="Plans trips", read_timeout_seconds=60)
    bind_builtin(agent, "test_sleep")
    fake_llm.script(
        Reply(MARKDOWN_REPLY.replace('<img src="x" onerror="window.__pwned = 1"><script>window.__pwned = 2</script>\n', ""),
              chunk_size=40),
        ToolCalls([("test_sleep", {"seconds": 30})]),
    )
    DOCS.mkdir(exist_ok=True)
    with open_page(viewport=(1280, 860)) as page:
        log_in(page, live_server_url, world.member.username)
        start_chat(page, "Trip planner")
        ask(page, "Plan two days in Kyoto with a budget function")
        expect(page.get_by_test_id("run").last).to_have_attribute("data-run-status", "completed", timeout=T)
        expect(page.locator("#chat-title")).to_have_text("Plan two days in Kyoto with a budget function", timeout=T)
        expect(page.get_by_test_id("usage-month")).not_to_contain_text("0 tokens", timeout=T)
        page.get_by_test_id("composer-input").click()
        page.screenshot(path=str(DOCS / "chat-markdown.png"))
        ask(page, "Wait for the hotel to confirm")
        expect(page.get_by_test_id("tool-call-card")).to_have_attribute("data-status", "running", timeout=T)
        page.get_by_test_id("tool-call-card").locator("details").first.evaluate("d => d.open = true")
        expect(page.get_by_test_id("composer-stop")).to_be_visible()
        page.locator(".chat-scroll").evaluate("el => { el.scrollTop = el.scrollHeight; }")
        page.wait_for_timeout(300)
        page.screenshot(path=str(DOCS / "chat-tool-stop.png"))
        page.get_by_test_id("composer-stop").click()
        expect(page.get_by_test_id("run").last).to_have_attribute("data-run-status", "cancelled", timeout=T)
