"""A scripted model drives multi-step browser tasks through the real runner (Celery worker,
PostgreSQL, Redis, the ASGI app): once through the extension in headless Chromium, once through
the server-side Playwright backend.

The "model" is FakeLLMServer with a responder that reads the tool results it is sent (the
snapshot) and picks refs from them, as a real model would.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest

from agents.models import CapabilityBinding, CapabilityKind
from agents.tests.factories import agent_with_route
from browser.tests.conftest import extension_browser, off_thread, pair_device_sync, wait_until
from llm.testing import Reply, ToolCalls
from sessions.models import Run, ToolCall
from sessions.tests.conftest import post_message_sync

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.browser,
    pytest.mark.usefixtures("needs_chromium"),
    pytest.mark.usefixtures("all_tenants_scope"),
]


def _last_tool_text(body: dict[str, Any]) -> str:
    tools = [m for m in body["messages"] if m.get("role") == "tool"]
    return tools[-1]["content"] if tools else ""


def _ref(text: str, pattern: str) -> str:
    match = re.search(r"\[ref=(e\d+)\] " + pattern, text)
    assert match, f"{pattern!r} not in:\n{text}"
    return match.group(1)


class ScriptedBrowserModel:
    """Each step sees the request body (with the latest tool result) and returns the next move."""

    def __init__(self, site) -> None:
        self.site = site
        self.refs: dict[str, str] = {}
        self.seen: list[str] = []  # the tool result text the model read at each step
        self.steps: list[Callable[[str], Any]] = [
            lambda t: ToolCalls([("browser_navigate", {"url": site.url("/search")})]),
            lambda t: ToolCalls([("browser_snapshot", {})]),
            lambda t: (self.refs.update(box=_ref(t, r'searchbox "Search products"'), go=_ref(t, r'button "Search"'))
                       or ToolCalls([("browser_type", {"ref": self.refs["box"], "text": "kiwi"})])),
            lambda t: ToolCalls([("browser_click", {"ref": self.refs["go"]})]),
            lambda t: ToolCalls([("browser_wait_for", {"text": "results for kiwi"})]),
            lambda t: ToolCalls([("browser_get_text", {"ref": "page", "max_chars": 500})]),
            lambda t: ToolCalls([("browser_navigate", {"url": site.url("/list")})]),
            lambda t: ToolCalls([("browser_snapshot", {"max_tokens": 500})]),
            lambda t: (self.refs.update(done=_ref(t, r'button "Done: Buy milk"'), shuffle=_ref(t, r'button "Shuffle"'))
                       or ToolCalls([("browser_click", {"ref": self.refs["shuffle"]})])),
            lambda t: ToolCalls([("browser_click", {"ref": self.refs["done"]})]),  # stale after the re-render
            lambda t: ToolCalls([("browser_snapshot", {})]),
            lambda t: ToolCalls([("browser_click", {"ref": _ref(t, r'button "Done: Buy milk"')})]),
            lambda t: ToolCalls([("browser_get_text", {"ref": "page"})]),
            lambda t: Reply("Found 3 results for kiwi, and ticked off 'Buy milk'."),
        ]

    def __call__(self, body: dict[str, Any]) -> Any:
        step = sum(1 for m in body["messages"] if m.get("role") == "assistant")
        text = _last_tool_text(body)
        self.seen.append(text)
        return self.steps[step](text)


def _agent_with_browser(world, fake_llm, config):
    agent = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], name="Browsing agent",
                             max_loop_count=30, tool_timeout_seconds=40)
    CapabilityBinding.all_tenants.create(tenant=world.tenant, agent=agent, kind=CapabilityKind.BROWSER, config=config)
    return agent


def _finished_run(run_id: int, timeout_seconds: float = 120) -> Run:
    def done():
        run = off_thread(lambda: Run.all_tenants.get(pk=run_id))
        return run if run.status in ("completed", "failed", "cancelled") else None

    return wait_until(done, timeout_seconds=timeout_seconds, what=f"run {run_id} to finish")


def _calls(run_id: int) -> list[ToolCall]:
    return off_thread(lambda: list(ToolCall.all_tenants.filter(run_id=run_id).order_by("id")))


def _assert_task_outcome(run: Run, model: ScriptedBrowserModel) -> list[ToolCall]:
    assert run.status == "completed", run.error
    calls = _calls(run.pk)
    assert [c.name for c in calls] == [
        "browser_navigate", "browser_snapshot", "browser_type", "browser_click", "browser_wait_for",
        "browser_get_text", "browser_navigate", "browser_snapshot", "browser_click", "browser_click",
        "browser_snapshot", "browser_click", "browser_get_text",
    ]
    statuses = [c.status for c in calls]
    assert statuses[9] == "failed" and statuses.count("failed") == 1, statuses
    assert "stale" in calls[9].error and "browser_snapshot" in calls[9].error
    assert "3 results for kiwi" in calls[5].result and "Golden kiwi" in calls[5].result
    assert "Buy milk" not in calls[12].result and "Write tests" in calls[12].result
    # Page text reached the model framed as untrusted data.
    assert '<untrusted-data nonce="' in model.seen[2]
    # The stale-ref hint reached the model.
    assert "browser_snapshot" in model.seen[10]
    return calls


def _browser_operation_events(session_id: int) -> list[dict[str, Any]]:
    from sessions.events import events_since_sync

    return [f["data"] for f in off_thread(events_since_sync, session_id=session_id, after_seq=0)
            if f["type"] == "browser_operation"]


def test_a_scripted_model_browses_through_the_extension(world, fake_llm, celery_worker, live_server_url, site,
                                                        tmp_path):
    agent = _agent_with_browser(world, fake_llm, {"backend": "extension", "allowed_origins": [site.origin]})
    _, token = pair_device_sync(tenant=world.tenant, user=world.member)
    model = ScriptedBrowserModel(site)
    fake_llm.respond(model)
    with extension_browser(tmp_path) as browser:
        browser.configure(platform_url=live_server_url, token=token)
        browser.wait_connected()
        run = off_thread(post_message_sync, agent=agent, user=world.member, content="Search kiwi, then tick off milk.")
        run = _finished_run(run.pk)
        _assert_task_outcome(run, model)
        # The DOM changes, checked through Playwright in the user's browser.
        search = browser.page_with_url("/search") if any("/search" in p.url for p in browser.context.pages) else None
        lst = browser.page_with_url("/list")
        assert [t.strip() for t in lst.locator("#items li").all_inner_texts()] == [
            "Write tests Done: Write tests", "Walk dog Done: Walk dog"]
        assert search is None  # the agent navigated its one tab from /search to /list
        state = browser.state()
        assert state["log"][0]["op"] == "get_text" and state["status"] == "connected"
    events = _browser_operation_events(run.session_id)
    assert {"op": "navigate", "status": "succeeded", "backend": "extension"}.items() <= events[1].items()
    assert any(e["status"] == "failed" and e.get("error_code") == "stale_ref" for e in events)
    typed = next(e for e in events if e["op"] == "type")
    assert typed["params"] == {"ref": model.refs["box"], "submit": False, "text_chars": 4}  # never the text itself


def test_the_same_task_through_the_server_browser(world, fake_llm, celery_worker, live_server_url, site):
    agent = _agent_with_browser(world, fake_llm, {"backend": "server", "allowed_origins": [site.origin]})
    model = ScriptedBrowserModel(site)
    fake_llm.respond(model)
    try:
        run = off_thread(post_message_sync, agent=agent, user=world.member, content="Search kiwi, then tick off milk.")
        run = _finished_run(run.pk)
        _assert_task_outcome(run, model)
        events = _browser_operation_events(run.session_id)
        assert all(e.get("backend") == "server" for e in events if e["status"] == "succeeded")
    finally:
        _shutdown_server_browsers()


def test_fallback_to_the_server_browser_when_no_extension_is_connected(world, fake_llm, celery_worker, site):
    agent = _agent_with_browser(world, fake_llm, {"backend": "extension", "fallback_to_server": True})
    fake_llm.script(
        ToolCalls([("browser_navigate", {"url": site.url("/counter")})]),
        ToolCalls([("browser_screenshot", {})]),
        Reply("Done."),
    )
    try:
        run = _finished_run(off_thread(post_message_sync, agent=agent, user=world.member, content="Look.").pk)
        assert run.status == "completed", run.error
        calls = _calls(run.pk)
        assert [c.status for c in calls] == ["succeeded", "succeeded"]
        data = calls[1].result_data
        from sessions.models import Artifact

        artifact = off_thread(lambda: Artifact.all_tenants.get(pk=data["artifact_id"]))
        assert artifact.mime_type == "image/png" and bytes(artifact.content[:8]) == b"\x89PNG\r\n\x1a\n"
    finally:
        _shutdown_server_browsers()


def test_no_connected_extension_fails_the_call_at_once(world, fake_llm, celery_worker):
    agent = _agent_with_browser(world, fake_llm, {"backend": "extension"})
    fake_llm.script(ToolCalls([("browser_navigate", {"url": "http://127.0.0.1:9/"})]), Reply("No browser."))
    run = _finished_run(off_thread(post_message_sync, agent=agent, user=world.member, content="Go.").pk)
    call = _calls(run.pk)[0]
    assert call.status == "failed" and "No browser is connected" in call.error
    assert call.duration_ms < 2000


def _shutdown_server_browsers() -> None:
    from browser.server_backend import server_browser_pool
    from sessions.runner.host import run_host

    async def close():
        await server_browser_pool().shutdown()

    run_host().run(close())





def test_a_password_field_pauses_the_run_until_a_human_approves(world, fake_llm, no_enqueue, site):
    from sessions.models import Approval
    from sessions.runner.host import run_host
    from sessions.runner.loop import execute_run

    agent = _agent_with_browser(world, fake_llm, {"backend": "server"})

    def respond(body):
        step = sum(1 for m in body["messages"] if m.get("role") == "assistant")
        text = _last_tool_text(body)
        if step == 0:
            return ToolCalls([("browser_navigate", {"url": site.url("/login")})])
        if step == 1:
            return ToolCalls([("browser_snapshot", {})])
        if step == 2:
            return ToolCalls([("browser_type", {"ref": _ref(text, r'textbox "Password"'), "text": "hunter2"})])
        if step == 3:
            return ToolCalls([("browser_snapshot", {})])
        return Reply("Password typed.")

    fake_llm.respond(respond)
    try:
        run = off_thread(post_message_sync, agent=agent, user=world.member, content="Log in.")
        run_host().run(execute_run(run.pk))  # the worker's loop: the server browser lives on it
        run = off_thread(lambda: Run.all_tenants.get(pk=run.pk))
        assert run.status == "awaiting_approval"
        approval = off_thread(lambda: Approval.all_tenants.get(run_id=run.pk))
        assert approval.reason == f"Typing into a password field on {site.origin}"
        resp = off_thread(lambda: world.client().post(f"/api/v1/approvals/{approval.pk}/", {"decision": "approve"},
                                                      format="json"))
        assert resp.status_code == 200, resp.content
        run_host().run(execute_run(run.pk))
        run = off_thread(lambda: Run.all_tenants.get(pk=run.pk))
        assert run.status == "completed", run.error
        calls = _calls(run.pk)
        assert [c.status for c in calls] == ["succeeded"] * 4
        assert 'textbox "Password" type=password value=•••' in calls[3].result
        statuses = [(e["op"], e["status"]) for e in _browser_operation_events(run.session_id) if e["op"] == "type"]
        assert statuses == [("type", "started"), ("type", "awaiting_approval"), ("type", "started"), ("type", "succeeded")]
    finally:
        _shutdown_server_browsers()
