"""The chat SPA in Debian's Chromium (Playwright), against the real ASGI app, a real Celery
worker and the FakeLLMServer behind the agent's route."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest

from agents.tests.factories import agent_with_route, bind_builtin
from llm.testing import Reply, ToolCalls

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.browser,
    pytest.mark.usefixtures("all_tenants_scope"),
]

CHROMIUM = os.environ.get("CHROMIUM_PATH", "/usr/lib/chromium/chromium")
ARTIFACTS = Path(__file__).resolve().parents[2] / "var" / "test-artifacts"
LAUNCH_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
    "--disable-sync", "--no-first-run", "--disable-quic",
]


@contextlib.contextmanager
def open_page():
    """A Chromium page. Start it after the test's database work: Playwright's sync API runs
    an event loop in this thread, and Django refuses ORM calls while one runs."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=LAUNCH_ARGS)
        try:
            yield browser.new_page(viewport={"width": 1280, "height": 800})
        finally:
            browser.close()


def log_in_and_ask(page, live_server_url, *, username, agent, question):
    """Log in as ``username``, start a chat with ``agent`` and send ``question``."""
    page.goto(live_server_url + "/")
    page.get_by_test_id("login-username").fill(username)
    page.get_by_test_id("login-password").fill("pw-user-123")
    page.get_by_test_id("login-submit").click()
    page.get_by_test_id("new-chat").click()  # the New chat dialog: a searchable agent picker
    page.locator(f'[data-testid="agent-option"][data-agent-name="{agent}"]').click()
    page.get_by_test_id("composer-input").fill(question)
    page.get_by_test_id("composer-send").click()


@pytest.fixture(autouse=True)
def _needs_chromium():
    if not Path(CHROMIUM).exists():
        pytest.skip("Debian's chromium is not installed (scripts/ensure_chromium.sh installs it)")


def test_log_in_chat_and_see_streamed_answer_and_tool_card(world, fake_llm, celery_worker, live_server_url):
    import sessions.tests.tools_for_tests  # noqa: F401  (test_echo)

    agent = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], name="Helper")
    bind_builtin(agent, "test_echo")
    fake_llm.script(
        ToolCalls([("test_echo", {"text": "hello browser"})]),
        Reply("The echo tool answered: hello browser. Anything else?", chunk_size=4),
    )
    from playwright.sync_api import expect

    with open_page() as page:
        _chat_flow(page, expect, live_server_url, world.member.username)


def _chat_flow(page, expect, live_server_url, username):
    page.goto(live_server_url + "/")
    page.get_by_test_id("login-username").fill(username)
    page.get_by_test_id("login-password").fill("wrong password")
    page.get_by_test_id("login-submit").click()
    expect(page.get_by_test_id("login-error")).to_contain_text("Wrong username or password")

    page.get_by_test_id("login-password").fill("pw-user-123")
    page.get_by_test_id("login-submit").click()
    page.get_by_test_id("new-chat").click()
    page.locator('[data-testid="agent-option"][data-agent-name="Helper"]').click()
    page.get_by_test_id("composer-input").fill("Please echo hello browser")
    page.get_by_test_id("composer-send").click()

    card = page.get_by_test_id("tool-call-card")
    expect(card).to_have_attribute("data-tool-name", "test_echo", timeout=20_000)
    expect(card).to_have_attribute("data-status", "succeeded", timeout=20_000)
    expect(card).to_contain_text("hello browser")
    reply = page.get_by_test_id("assistant-reply").last
    expect(reply).to_have_text("The echo tool answered: hello browser. Anything else?", timeout=20_000)
    expect(page.get_by_test_id("run").last).to_have_attribute("data-run-status", "completed", timeout=20_000)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "spa-chat.png"))

    # The session is listed, and reloading shows the same transcript from the API.
    page.reload()
    expect(page.get_by_test_id("session-item")).to_have_count(1)
    expect(page.get_by_test_id("assistant-reply").last).to_have_text(
        "The echo tool answered: hello browser. Anything else?", timeout=10_000
    )


def test_a_failed_run_shows_its_error(world, fake_llm, celery_worker, live_server_url):
    from playwright.sync_api import expect

    from llm.testing import Fail

    agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], name="Broken")
    fake_llm.script(Fail(500, body={"error": {"message": "boom"}}))
    with open_page() as page:
        log_in_and_ask(page, live_server_url, username=world.member.username, agent="Broken", question="hello?")
        expect(page.get_by_test_id("run-error")).to_contain_text("No model could answer", timeout=20_000)
        expect(page.get_by_test_id("run").last).to_have_attribute("data-run-status", "failed")


def test_a_fallback_is_shown_to_the_user(world, fake_llm, second_fake_llm, celery_worker, live_server_url):
    from playwright.sync_api import expect

    from llm.testing import Fail

    agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url, second_fake_llm.base_url], name="Routed")
    fake_llm.script(Fail(500, body={"error": {"message": "down"}}))
    second_fake_llm.script(Reply("Answered by the fallback."))
    with open_page() as page:
        log_in_and_ask(page, live_server_url, username=world.member.username, agent="Routed", question="hello?")
        expect(page.get_by_test_id("assistant-reply").last).to_have_text("Answered by the fallback.", timeout=20_000)
        expect(page.get_by_test_id("model-notice")).to_have_text(
            "Switched from model-0 to model-1 after a server error."
        )


def test_approve_a_tool_call_and_answer_a_question_in_the_chat(world, fake_llm, celery_worker, live_server_url):
    from playwright.sync_api import expect

    import sessions.tests.tools_for_tests  # noqa: F401  (test_echo)

    agent = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], name="Careful")
    bind_builtin(agent, "test_echo", approval_policy=[{"pattern": "test_echo", "action": "ask"}])
    bind_builtin(agent, "ask_user")
    fake_llm.script(
        ToolCalls([("test_echo", {"text": "launch"})]),
        ToolCalls([("ask_user", {"question": "Which city should I use?"})]),
        Reply("Echoed launch, and the city is Tokyo."),
    )
    with open_page() as page:
        log_in_and_ask(page, live_server_url, username=world.member.username, agent="Careful", question="go")
        card = page.get_by_test_id("approval-card").first
        expect(card).to_contain_text("Allow test_echo?", timeout=20_000)
        expect(card).to_contain_text('"text": "launch"')
        expect(page.get_by_test_id("run").last).to_have_attribute("data-run-status", "awaiting_approval")
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "spa-approval.png"))
        card.get_by_test_id("approval-approve").click()
        expect(card.get_by_test_id("approval-outcome")).to_have_text("Approved")

        question = page.get_by_test_id("approval-card").nth(1)
        expect(question).to_contain_text("Which city should I use?", timeout=20_000)
        question.get_by_test_id("approval-answer-send").click()
        expect(question).to_contain_text("Type an answer first.")
        question.get_by_test_id("approval-answer-input").fill("Tokyo")
        question.get_by_test_id("approval-answer-send").click()
        expect(page.get_by_test_id("assistant-reply").last).to_have_text(
            "Echoed launch, and the city is Tokyo.", timeout=20_000
        )
        expect(page.get_by_test_id("run").last).to_have_attribute("data-run-status", "completed")
    assert fake_llm.requests[2]["messages"][-1]["content"] == "The user answered: Tokyo"


def test_approve_a_tool_call_asked_inside_a_skill(world, fake_llm, celery_worker, live_server_url):
    from playwright.sync_api import expect

    import sessions.tests.tools_for_tests  # noqa: F401  (test_echo)
    from sessions.tests.test_subruns import make_agent_sync

    make_agent_sync(world, fake_llm.base_url, name="Delegator",
                    builtins=[("test_echo", {"approval_policy": [{"pattern": "test_echo", "action": "ask"}]})],
                    skills=[("careful", ["test_echo"], {})])
    fake_llm.script(
        ToolCalls([("careful", {"task": "echo launch"})]),  # the user's run calls the skill
        ToolCalls([("test_echo", {"text": "launch"})]),  # the skill's sub-run asks for the echo
        Reply("echoed launch"),  # the sub-run, after the approval
        Reply("The skill echoed launch."),  # the user's run
    )
    with open_page() as page:
        log_in_and_ask(page, live_server_url, username=world.member.username, agent="Delegator", question="go")
        card = page.get_by_test_id("approval-card").first
        expect(card).to_contain_text("Allow test_echo (in the skill careful)?", timeout=20_000)
        expect(card).to_contain_text('"text": "launch"')
        expect(page.get_by_test_id("run").last).to_have_attribute("data-run-status", "awaiting_approval")
        skill_card = page.locator('[data-tool-name="careful"]')
        expect(skill_card).to_have_attribute("data-status", "awaiting_approval")
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "spa-approval-in-skill.png"))
        card.get_by_test_id("approval-approve").click()
        expect(card.get_by_test_id("approval-outcome")).to_have_text("Approved")
        expect(page.get_by_test_id("assistant-reply").last).to_have_text("The skill echoed launch.", timeout=20_000)
        expect(page.get_by_test_id("run").last).to_have_attribute("data-run-status", "completed")
        expect(page.get_by_test_id("run")).to_have_count(1)  # the sub-run is not a run of the conversation
        expect(skill_card).to_have_attribute("data-status", "succeeded")
    assert fake_llm.requests[2]["messages"][-1]["content"] == "echo: launch"
